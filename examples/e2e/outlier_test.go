package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/mesh"
	"github.com/inmesh/inmesh/router"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// The outlier-detection scenario of the acceptance: five endpoints, the
// first of which fails 30% of the requests it serves (those whose sequence
// number on that endpoint is 0, 1 or 2 mod 10: the share of the issue's
// "at random", without the chance). Two Services over the same endpoints:
// plain, with no outlier detection, and ejecting, whose annotations eject
// an endpoint failing more than 10% of its requests over 1 s intervals
// (at least 10 requests on each of the 5 endpoints), for 60 s (longer than
// the test), at most 20% of the endpoints (one) at once.
const (
	outlierInterval  = time.Second
	outlierRequests  = 1000 // counted after the first interval
	outlierPlainN    = 500
	outlierPlainSvc  = "plain.default.svc.cluster.local:7004"
	outlierEjectSvc  = "ejecting.default.svc.cluster.local:7005"
	outlierMaxEjects = 1 // 20% of 5
)

const outlierManifests = `apiVersion: v1
kind: Service
metadata: {name: plain, namespace: default}
spec:
  ports: [{name: http, port: 7004}]
---
apiVersion: v1
kind: Service
metadata:
  name: ejecting
  namespace: default
  annotations:
    outlier.inmesh.io/interval: 1s
    outlier.inmesh.io/base-ejection-time: 60s
    outlier.inmesh.io/max-ejection-percent: "20"
    outlier.inmesh.io/failure-percentage-ejection: "true"
    outlier.inmesh.io/failure-percentage-threshold: "10"
    outlier.inmesh.io/failure-percentage-enforcement-percentage: "100"
    outlier.inmesh.io/failure-percentage-minimum-hosts: "5"
    outlier.inmesh.io/failure-percentage-request-volume: "10"
spec:
  ports: [{name: http, port: 7005}]
`

// outlierSetup starts the five endpoints and the control plane (the
// destination program over the manifests and an endpoints file naming
// the five for both Services); it returns the control plane's address and
// the failing endpoint's address.
func outlierSetup(t *testing.T, bin string) (dstAddr, bad string) {
	var addrs []string
	for i := range 5 {
		var seq atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if i == 0 && (seq.Add(1)-1)%10 < 3 {
				http.Error(w, "failing", http.StatusInternalServerError)
				return
			}
			fmt.Fprintf(w, "endpoint %d", i)
		}))
		t.Cleanup(srv.Close)
		addrs = append(addrs, strings.TrimPrefix(srv.URL, "http://"))
	}
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(policies, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(policies, "outlier.yaml"), []byte(outlierManifests), 0o644))
	var b strings.Builder
	for _, auth := range []string{outlierPlainSvc, outlierEjectSvc} {
		fmt.Fprintf(&b, "- authority: %s\n  endpoints:\n", auth)
		for _, a := range addrs {
			fmt.Fprintf(&b, "  - addr: %s\n", a)
		}
	}
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte(b.String()), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0",
		"-endpoints", endpoints, "-policies", policies, "-interval", "100ms")
	return dst.waitLog(t, dstAddrRe), addrs[0]
}

// outlierSend sends one GET to authority with hc and says whether it
// was answered 200.
func outlierSend(t *testing.T, hc *http.Client, url, authority string) bool {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Host = authority
	resp, err := hc.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// outlierEjected returns the ejected endpoints of the route's backend as
// explain shows them.
func outlierEjected(t *testing.T, e router.Explanation) []string {
	t.Helper()
	require.NotNil(t, e.Backends, "the route's backends")
	var ejected []string
	for _, b := range e.Backends.Backends {
		for _, ep := range b.Endpoints {
			if ep.State == "ejected" {
				ejected = append(ejected, ep.Addr)
			}
		}
	}
	return ejected
}

// outlierScenario is the acceptance (2) over send (one request
// to the authority, true when answered 200) and explain (the route of the
// authority as /routes explains it):
//
//   - plain: outlierPlainN requests, all counted; the success rate is
//     about 94% (asserted below 97%);
//   - ejecting: every request is sent and counted, except that those
//     started within the first detection interval (measured from the
//     answer to the first request, which starts the interval) are
//     reported apart; outlierRequests requests after it are counted with
//     no further warm-up and their success rate must be at least 99%.
//     Every 50 requests, the route's endpoints show at most the cap (one)
//     ejected, and the failing endpoint is the one ejected.
func outlierScenario(t *testing.T, send func(authority string) bool, explain func(authority string) router.Explanation, bad string) {
	ok := 0
	for range outlierPlainN {
		if send(outlierPlainSvc) {
			ok++
		}
	}
	plain := float64(ok) / outlierPlainN
	t.Logf("without ejection: %d of %d requests succeeded (%.2f%%)", ok, outlierPlainN, 100*plain)
	assert.Less(t, plain, 0.97, "without ejection the failing endpoint costs the route its failures")
	assert.Greater(t, plain, 0.90, "without ejection, about 94%")
	assert.Empty(t, outlierEjected(t, explain(outlierPlainSvc)), "no ejection without the annotations")

	firstOK := send(outlierEjectSvc)
	intervalEnd := time.Now().Add(outlierInterval)
	warm, warmOK := 1, 0
	if firstOK {
		warmOK++
	}
	counted, countedOK, sawEjected := 0, 0, false
	deadline := time.Now().Add(40 * time.Second)
	check := func() {
		ejected := outlierEjected(t, explain(outlierEjectSvc))
		require.LessOrEqual(t, len(ejected), outlierMaxEjects, "ejected at once: %v", ejected)
		if len(ejected) == 1 {
			sawEjected = true
			assert.Equal(t, bad, ejected[0], "the endpoint ejected")
		}
	}
	for i := 0; counted < outlierRequests; i++ {
		require.True(t, time.Now().Before(deadline), "%d requests counted in 40s", counted)
		began := time.Now()
		res := send(outlierEjectSvc)
		if began.Before(intervalEnd) {
			warm++
			if res {
				warmOK++
			}
		} else {
			counted++
			if res {
				countedOK++
			}
		}
		if i%50 == 49 {
			check()
		}
	}
	// An endpoint is judged only in an interval in which every endpoint
	// served the request volume. A serial caller's balancer starves an
	// endpoint whose latency peaked (a stall on a loaded machine) until
	// its estimate decays, in tens of seconds (10 s a factor of e), so
	// when the counted requests ended before the failing endpoint was
	// judged, requests go on, uncounted, until it is.
	deadline = time.Now().Add(2 * time.Minute)
	if !sawEjected {
		for _, b := range explain(outlierEjectSvc).Backends.Backends {
			for _, ep := range b.Endpoints {
				t.Logf("not judged yet after the counted requests: endpoint %s %s, load %v", ep.Addr, ep.State, time.Duration(ep.LoadSeconds*float64(time.Second)))
			}
		}
	}
	for extra := 0; !sawEjected; extra++ {
		require.True(t, time.Now().Before(deadline), "the failing endpoint was never ejected in 2 minutes")
		send(outlierEjectSvc)
		if extra%50 == 49 {
			check()
		}
	}
	rate := float64(countedOK) / float64(counted)
	t.Logf("with failure-percentage ejection: first interval (%s) %d of %d succeeded; after it, all %d counted: %d succeeded (%.2f%%)",
		outlierInterval, warmOK, warm, counted, countedOK, 100*rate)
	assert.GreaterOrEqual(t, rate, 0.99, "success rate after the first interval of detection")
	e := explain(outlierEjectSvc)
	require.Len(t, e.Backends.Backends, 1)
	assert.NotEmpty(t, e.Backends.Backends[0].OutlierDetection, "the route explains its outlier detection")
	t.Logf("outlier detection: %s", e.Backends.Backends[0].OutlierDetection)
}

// Acceptance (2) of the issue through examples/proxy: the control plane
// carries the Service's outlier.inmesh.io annotations to the proxy, whose
// balancer ejects the failing endpoint; /routes shows it ejected.
func TestOutlierEjectionThroughProxy(t *testing.T) {
	bin := build(t)
	dstAddr, bad := outlierSetup(t, bin)
	_, out, _, admin := startProxy(t, bin, dstAddr, bad)
	explain := func(authority string) router.Explanation {
		resp, err := http.Get("http://" + admin + "/routes?authority=" + authority + "&method=GET&path=/")
		require.NoError(t, err)
		defer resp.Body.Close()
		var e router.Explanation
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		return e
	}
	// The policies arrive: the ejecting route explains its detection.
	require.Eventually(t, func() bool {
		e := explain(outlierEjectSvc)
		return e.Backends != nil && len(e.Backends.Backends) == 1 && e.Backends.Backends[0].OutlierDetection != ""
	}, timeout, 50*time.Millisecond, "the ejecting Service's policy never arrived")
	require.Eventually(t, func() bool {
		e := explain(outlierPlainSvc)
		return e.Backends != nil && len(e.Backends.Backends) == 1
	}, timeout, 50*time.Millisecond, "the plain Service's policy never arrived")

	hc := &http.Client{Timeout: timeout}
	defer hc.CloseIdleConnections()
	outlierScenario(t, func(authority string) bool {
		return outlierSend(t, hc, "http://"+out+"/", authority)
	}, explain, bad)
}

// Acceptance (2) of the issue through mesh.NewClient over the same
// control plane; the endpoints come from Router().Explain, as /routes's.
func TestOutlierEjectionThroughMeshClient(t *testing.T) {
	bin := build(t)
	dstAddr, bad := outlierSetup(t, bin)
	dc, err := destination.Dial(dstAddr, destination.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer dc.Close()
	client := mesh.NewClient(mesh.WithDestination(dc), mesh.WithMeterProvider(noop.NewMeterProvider()),
		mesh.WithLogger(slog.New(slog.DiscardHandler)), mesh.WithDiscoveryWait(timeout))
	defer client.Close()
	explain := func(authority string) router.Explanation {
		return client.Router().Explain(httptest.NewRequest(http.MethodGet, "http://"+authority+"/", nil))
	}
	hc := &http.Client{Transport: client, Timeout: timeout}
	send := func(authority string) bool {
		return outlierSend(t, hc, "http://"+authority+"/", authority)
	}
	// The first request of each authority waits for its discovery; the
	// policy of the ejecting Service must be in force before the counted
	// requests, so the first interval starts on a request under it.
	require.Eventually(t, func() bool {
		e := explain(outlierEjectSvc)
		return e.Backends != nil && len(e.Backends.Backends) == 1 && e.Backends.Backends[0].OutlierDetection != ""
	}, timeout, 50*time.Millisecond, "the ejecting Service's policy never arrived")
	outlierScenario(t, send, explain, bad)
}
