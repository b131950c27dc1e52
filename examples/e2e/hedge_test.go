package e2e

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/mesh"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// The hedging scenario of the acceptance: three endpoints; 5% of requests
// (every 20th, marked by the test) stall 100 ms on the endpoint their first
// attempt reaches. The stall follows the request, not an endpoint, so
// that the balancer cannot route around it (PeakEWMA shuns an endpoint
// that stalled every request it got, which would hide the tail the hedge
// is for); a hedge reaches a second endpoint and is answered at once.
const (
	hedgeStall     = 100 * time.Millisecond
	hedgeEvery     = 20 // 5% of requests stall
	hedgeRequests  = 400
	hedgeShare     = 0.10
	hedgeDelay     = 10 * time.Millisecond // the hedged route's delay
	hedgePlainSvc  = "plain.default.svc.cluster.local:7002"
	hedgeHedgedSvc = "hedged.default.svc.cluster.local:7003"
)

// hedgeManifests are two Services over the same endpoints: plain, whose
// HTTPRoute does not hedge, and hedged, whose HTTPRoute hedges after 10ms
// with a share of 10% extra load.
const hedgeManifests = `apiVersion: v1
kind: Service
metadata: {name: plain, namespace: default}
spec:
  ports: [{name: http, port: 7002}]
---
apiVersion: v1
kind: Service
metadata: {name: hedged, namespace: default}
spec:
  ports: [{name: http, port: 7003}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: plain-route, namespace: default}
spec:
  parentRefs: [{group: core, kind: Service, name: plain, port: 7002}]
  rules:
  - backendRefs: [{name: plain, port: 7002}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: hedged-route
  namespace: default
  annotations:
    hedge.inmesh.io/delay: 10ms
    hedge.inmesh.io/max-extra-load: "10%"
spec:
  parentRefs: [{group: core, kind: Service, name: hedged, port: 7003}]
  rules:
  - backendRefs: [{name: hedged, port: 7003}]
`

// hedgeEndpoints are the three endpoint servers: they record which
// endpoints each request (X-Request-Id) reached and stall the first
// arrival of a request marked X-Stall.
type hedgeEndpoints struct {
	addrs []string
	mu    sync.Mutex
	seen  map[string][]int
	total int
	// sent is when the test sent each request (by X-Request-Id; the
	// endpoints run in the test's process, so the monotonic clock spans
	// both); arrivals are, for each stalled request, how long after it
	// was sent each of its attempts reached an endpoint.
	sent     map[string]time.Time
	arrivals map[string][]time.Duration
}

func hedgeStartEndpoints(t *testing.T) *hedgeEndpoints {
	h := &hedgeEndpoints{seen: make(map[string][]int), sent: make(map[string]time.Time), arrivals: make(map[string][]time.Duration)}
	for i := range 3 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id := r.Header.Get("X-Request-Id")
			h.mu.Lock()
			h.seen[id] = append(h.seen[id], i)
			h.total++
			first := len(h.seen[id]) == 1
			if sent, ok := h.sent[id]; ok && r.Header.Get("X-Stall") != "" {
				h.arrivals[id] = append(h.arrivals[id], time.Since(sent))
			}
			h.mu.Unlock()
			if first && r.Header.Get("X-Stall") != "" {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(hedgeStall):
				}
			}
			fmt.Fprintf(w, "endpoint %d", i)
		}))
		t.Cleanup(srv.Close)
		h.addrs = append(h.addrs, strings.TrimPrefix(srv.URL, "http://"))
	}
	return h
}

// stats returns the requests the endpoints served with the given id
// prefix, and the ids that reached one endpoint twice.
func (h *hedgeEndpoints) stats(prefix string) (served int, twice []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, eps := range h.seen {
		if !strings.HasPrefix(id, prefix) {
			continue
		}
		served += len(eps)
		s := slices.Clone(eps)
		slices.Sort(s)
		if len(slices.Compact(s)) != len(eps) {
			twice = append(twice, id)
		}
	}
	return served, twice
}

// hedgesWanted is how many of the stalled requests with the given id
// prefix must have sent a hedge, and how many of those hedges must have
// won. The endpoints stall a request's first arrival, and the router
// hedges only a request whose first attempt has picked its endpoint by
// the hedge delay (10 ms). On a loaded machine:
//   - a first arrival a hedge delay or more after the request was sent
//     may be the hedge's (the first attempt reached its endpoint late,
//     and was answered at once), or its first attempt had not picked an
//     endpoint by the delay and it was not hedged. An earlier first
//     arrival is the first attempt's, picked before the delay: its hedge
//     must be sent.
//   - a hedge that reached its endpoint half the stall or more after
//     the request was sent (its dial, or the machine, was slow) may lose
//     to the stalled first attempt. An earlier one is answered at once,
//     half the stall before the first attempt: it must win.
//
// (Beside a second copy of the suite 19 of 20 hedges won with no request
// slower than 27 ms; in another run one stalled request took 118 ms.)
// Hedges of requests that were slow without a stall may be sent and win
// too, so these are floors.
func (h *hedgeEndpoints) hedgesWanted(t *testing.T, prefix string) (sent, won int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var stalls, lateFirst, lateHedge int
	for id, a := range h.arrivals {
		if !strings.HasPrefix(id, prefix) {
			continue
		}
		stalls++
		switch {
		case a[0] >= hedgeDelay:
			lateFirst++
		case len(a) < 2 || a[1] >= hedgeStall/2:
			lateHedge++
		}
	}
	t.Logf("%s: of %d stalled requests, %d first arrived %s or more after they were sent, %d had no hedge arrive within %s",
		prefix, stalls, lateFirst, hedgeDelay, lateHedge, hedgeStall/2)
	require.Positive(t, stalls)
	// A machine so slow that most stalls are excused measures nothing.
	assert.LessOrEqual(t, 2*(lateFirst+lateHedge), stalls, "at most half of the stalled requests excused")
	return stalls - lateFirst, stalls - lateFirst - lateHedge
}

func hedgeEndpointsFile(addrs []string) string {
	var b strings.Builder
	for _, auth := range []string{hedgePlainSvc, hedgeHedgedSvc} {
		fmt.Fprintf(&b, "- authority: %s\n  endpoints:\n", auth)
		for _, a := range addrs {
			fmt.Fprintf(&b, "  - addr: %s\n", a)
		}
	}
	return b.String()
}

// hedgeRun sends hedgeRequests requests one after the other to authority
// through rt and returns their latencies; every hedgeEvery-th stalls.
// Their ids are prefix-<i>.
func hedgeRun(t *testing.T, h *hedgeEndpoints, rt http.RoundTripper, url, authority, prefix string) []time.Duration {
	t.Helper()
	client := &http.Client{Transport: rt, Timeout: timeout}
	lat := make([]time.Duration, 0, hedgeRequests)
	for i := range hedgeRequests {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		require.NoError(t, err)
		req.Host = authority
		id := fmt.Sprintf("%s-%d", prefix, i)
		req.Header.Set("X-Request-Id", id)
		if i%hedgeEvery == hedgeEvery-1 {
			req.Header.Set("X-Stall", "1")
		}
		start := time.Now()
		h.mu.Lock()
		h.sent[id] = start
		h.mu.Unlock()
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lat = append(lat, time.Since(start))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	return lat
}

func slowest(lat []time.Duration, n int) []time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	slices.Reverse(s)
	return s[:min(n, len(s))]
}

func hedgeP99(lat []time.Duration) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[(len(s)*99+99)/100-1]
}

// hedgeTries is how many times hedgeCompare measures the hedged route.
// Beside a second copy of the suite a burst of the machine's own load
// once put four unstalled requests of 400 over 90 ms (p99 94 ms against
// 110 ms unhedged) while every stalled request but one was hedged and
// answered within 30 ms. The bound compares the 4th-slowest request, so
// such a burst is all it takes; a run that misses is measured again. A
// router that does not hedge misses every try: its 20 stalled requests
// of 400 are its p99.
const hedgeTries = 3

// hedgeCompare measures the plain route (ids plain-<i>) and then the
// hedged one (ids hedged/<try>-<i>) through rt, and asserts the
// acceptance figures: the p99 of the hedged route at most a quarter of
// the plain one's (in one of hedgeTries tries), in every try the extra
// load within the share plus 1% and no request twice on one endpoint.
func hedgeCompare(t *testing.T, h *hedgeEndpoints, rt http.RoundTripper, plainURL, plainAuth, hedgedURL, hedgedAuth, prefix string) {
	t.Helper()
	plain := hedgeRun(t, h, rt, plainURL, plainAuth, prefix+"-plain")
	p99Plain := hedgeP99(plain)
	assert.GreaterOrEqual(t, p99Plain, hedgeStall, "the stalls make the plain route's p99")
	served, twice := h.stats(prefix + "-plain-")
	assert.Equal(t, hedgeRequests, served, "the plain route sends each request once")
	assert.Empty(t, twice)
	for try := 1; try <= hedgeTries; try++ {
		id := fmt.Sprintf("%s-hedged/%d", prefix, try)
		hedged := hedgeRun(t, h, rt, hedgedURL, hedgedAuth, id)
		p99Hedged := hedgeP99(hedged)
		t.Logf("try %d: p99 without hedging %v, with %v (ratio %.2f); slowest hedged: %v", try, p99Plain, p99Hedged,
			float64(p99Hedged)/float64(p99Plain), slowest(hedged, 6))
		served, twice := h.stats(id + "-")
		extra := float64(served-hedgeRequests) / hedgeRequests
		t.Logf("try %d: extra load %.2f%% (%d hedges)", try, 100*extra, served-hedgeRequests)
		assert.Greater(t, served, hedgeRequests, "stalled requests were hedged")
		assert.LessOrEqual(t, extra, hedgeShare+0.01, "extra load within the share plus 1%%")
		assert.Empty(t, twice, "no request sent twice to one endpoint")
		if 4*p99Hedged <= p99Plain {
			return
		}
	}
	assert.Fail(t, "hedging cuts the p99 to a quarter or less", "in none of %d tries", hedgeTries)
}

// Acceptance (1) through examples/proxy: the control plane serves the
// hedge.inmesh.io annotations of an HTTPRoute, the proxy hedges its
// route, counts the hedges on outbound_http_route_hedge_* and /routes
// explains the hedging.
func TestHedgeThroughProxy(t *testing.T) {
	needCurl(t)
	bin := build(t)
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(policies, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(policies, "hedge.yaml"), []byte(hedgeManifests), 0o644))
	h := hedgeStartEndpoints(t)
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte(hedgeEndpointsFile(h.addrs)), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0",
		"-endpoints", endpoints, "-policies", policies, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)
	_, out, _, admin := startProxy(t, bin, dstAddr, h.addrs[0])

	// The route's policy arrives: /routes explains its hedging.
	require.Eventually(t, func() bool {
		status, _, body := curl(t, "http://"+admin+"/routes?authority="+hedgeHedgedSvc+"&method=GET&path=/")
		return status == 200 && strings.Contains(body, `"hedge"`)
	}, timeout, 50*time.Millisecond, "the hedged route's policy never arrived")
	require.Eventually(t, func() bool {
		status, _, body := curl(t, "http://"+admin+"/routes?authority="+hedgePlainSvc+"&method=GET&path=/")
		return status == 200 && strings.Contains(body, `"route": "plain-route"`)
	}, timeout, 50*time.Millisecond, "the plain route's policy never arrived")

	hedgeCompare(t, h, http.DefaultTransport, "http://"+out+"/", hedgePlainSvc, "http://"+out+"/", hedgeHedgedSvc, "proxy")

	// A hedge that lost is counted once its cancelled attempt has ended,
	// which may be after the request's answer.
	wantSent, wantWon := h.hedgesWanted(t, "proxy-hedged/")
	var text string
	var sent float64
	assert.Eventually(t, func() bool {
		text = scrape(t, admin)
		sent, _ = metric(text, "outbound_http_route_hedge_requests_total", `route_name="hedged-route"`)
		return sent >= float64(wantSent)
	}, timeout, 20*time.Millisecond, "every stalled request whose first attempt was at its endpoint by the delay was hedged")
	t.Logf("hedges sent %v, wanted at least %d", sent, wantSent)
	won, _ := metric(text, "outbound_http_route_hedge_wins_total", `route_name="hedged-route"`)
	assert.GreaterOrEqual(t, won, float64(wantWon), "and the hedge won")
	_, ok := metric(text, "outbound_http_route_hedge_requests_total", `route_name="plain-route"`)
	assert.False(t, ok, "the plain route sends no hedge")
	_, _, body := curl(t, "http://"+admin+"/routes?authority="+hedgeHedgedSvc+"&method=GET&path=/")
	assert.Contains(t, body, `"policy": "after 10ms, at most 10% extra load, idempotent methods"`)

	// The dashboard counts the same hedges on the route (its tap events
	// carry each request's hedges).
	var hedges uint64
	for _, r := range dashboardState(t, admin).Routes {
		if r.Direction == "outbound" && r.Route == "hedged-route" {
			hedges = r.Hedges
		}
	}
	assert.GreaterOrEqual(t, hedges, uint64(wantSent), "the dashboard's hedges of the route")
	assert.LessOrEqual(t, float64(hedges), sent, "no more hedges than the metric's")
}

// Acceptance (1) through mesh.NewClient over the same control plane.
func TestHedgeThroughMeshClient(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(policies, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(policies, "hedge.yaml"), []byte(hedgeManifests), 0o644))
	h := hedgeStartEndpoints(t)
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte(hedgeEndpointsFile(h.addrs)), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0",
		"-endpoints", endpoints, "-policies", policies, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)

	dc, err := destination.Dial(dstAddr, destination.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer dc.Close()
	client := mesh.NewClient(mesh.WithDestination(dc), mesh.WithMeterProvider(noop.NewMeterProvider()),
		mesh.WithLogger(slog.New(slog.DiscardHandler)), mesh.WithDiscoveryWait(timeout))
	defer client.Close()

	// The plain route runs first, as through the proxy: the hedged route's
	// first request still waits for its own route (a fresh authority), but
	// the connections to the endpoints are open, as they were for the
	// proxy's hedged run (a first run under -race once measured dials
	// among the hedged p99).
	hedgeCompare(t, h, client, "http://"+hedgePlainSvc+"/", hedgePlainSvc, "http://"+hedgeHedgedSvc+"/", hedgeHedgedSvc, "mesh")
	e := client.Router().Explain(httptest.NewRequest(http.MethodGet, "http://"+hedgeHedgedSvc+"/", nil))
	require.NotNil(t, e.Hedge)
	wantSent, wantWon := h.hedgesWanted(t, "mesh-hedged/")
	assert.Eventually(t, func() bool {
		return client.Router().Explain(httptest.NewRequest(http.MethodGet, "http://"+hedgeHedgedSvc+"/", nil)).Hedge.Sent >= uint64(wantSent)
	}, timeout, 20*time.Millisecond, "every stalled request whose first attempt was at its endpoint by the delay was hedged")
	e = client.Router().Explain(httptest.NewRequest(http.MethodGet, "http://"+hedgeHedgedSvc+"/", nil))
	assert.GreaterOrEqual(t, e.Hedge.Won, uint64(wantWon), "and the hedge won")
}
