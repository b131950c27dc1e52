package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// coldManifests are two pods on this machine, each with a Server that
// admits every network: fast-0's limited to 20 requests a second, slow-0's
// to 2 requests in flight.
func coldManifests(fastPort, slowPort uint16) string {
	doc := func(name string, port uint16, annotations, limit string) string {
		return fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: %[1]s-0, namespace: default, labels: {app: %[1]s}}
spec:
  containers: [{name: %[1]s, ports: [{name: http, containerPort: %[2]d}]}]
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: %[1]s-http, namespace: default, annotations: {%[3]s}}
spec:
  podSelector: {matchLabels: {app: %[1]s}}
  port: http
---
apiVersion: policy.linkerd.io/v1alpha1
kind: NetworkAuthentication
metadata: {name: %[1]s-callers, namespace: default}
spec:
  networks: [{cidr: 0.0.0.0/0}]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: %[1]s-callers, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: %[1]s-http}
  requiredAuthenticationRefs: [{group: policy.linkerd.io, kind: NetworkAuthentication, name: %[1]s-callers}]
%[4]s`, name, port, annotations, limit)
	}
	return doc("fast", fastPort, "", `---
apiVersion: policy.linkerd.io/v1alpha1
kind: HTTPLocalRateLimitPolicy
metadata: {name: fast, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: fast-http}
  total: {requestsPerSecond: 20}
`) + "---\n" + doc("slow", slowPort, `inmesh.io/max-concurrent-requests: "2"`, "")
}

// burst sends n requests at once to url and returns their statuses (0
// for a request that failed).
func burst(url string, n int) []int {
	tr := &http.Transport{MaxIdleConnsPerHost: n}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: timeout}
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Get(url)
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	return statuses
}

// TestInboundPolicyColdBurst: a burst at a proxy that has just started
// (-workload, the port's policy from the embedded control plane) is held
// to the Server's limits from its first request: of 100 requests at once
// against a Server limited to 20 a second, about 20 pass (not all 100, as
// under the default policy); of 8 slow requests at once against a limit
// of 2 in flight, 2 reach the application and 6 are refused 503.
func TestInboundPolicyColdBurst(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(policies, 0o755))
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer fast.Close()
	var reached atomic.Int32
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		<-release
		io.WriteString(w, "ok")
	}))
	defer slow.Close()
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	port := func(s *httptest.Server) uint16 { return netip.MustParseAddrPort(addr(s)).Port() }
	require.NoError(t, os.WriteFile(filepath.Join(policies, "pods.yaml"), []byte(coldManifests(port(fast), port(slow))), 0o644))
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0",
		"-endpoints", endpoints, "-policies", policies, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)

	// freshProxy starts a proxy in front of app and returns its inbound
	// address as soon as it listens.
	freshProxy := func(app *httptest.Server, workload string) string {
		p := start(t, filepath.Join(bin, "proxy"), []string{"INMESH_CONTROL_BACKOFF_DELAY=100ms"},
			"-destination", dstAddr, "-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-app", addr(app),
			"-metrics", "127.0.0.1:0", "-workload", workload, "-trust-localhost=false")
		return p.waitLog(t, listenRe("inbound"))
	}

	t.Run("rate limit", func(t *testing.T) {
		in := freshProxy(fast, "default:fast-0")
		count := map[int]int{}
		began := time.Now()
		for _, s := range burst("http://"+in+"/", 100) {
			count[s]++
		}
		took := time.Since(began)
		// The bucket holds 20 and refills 20 a second: no more than that
		// can pass while the burst lasts.
		most := 20 + int(20*took.Seconds()) + 1
		t.Logf("a burst of 100 at a fresh proxy, over %v: %v (at most %d may pass)", took.Round(time.Millisecond), count, most)
		assert.LessOrEqual(t, count[200], most, "about 20 pass the limit of 20 a second")
		assert.Positive(t, count[200], "the Server admits")
		assert.Equal(t, 100, count[200]+count[429], "the rest are rate-limited")
	})

	t.Run("in-flight limit", func(t *testing.T) {
		in := freshProxy(slow, "default:slow-0")
		tr := &http.Transport{MaxIdleConnsPerHost: 8}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr, Timeout: timeout}
		var refused, other atomic.Int32
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.Get("http://" + in + "/")
				if err != nil {
					other.Add(1)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 503 {
					refused.Add(1)
				}
			}()
		}
		// The refusals come at once; the admitted requests are held in
		// the app until every request is either refused or held.
		require.Eventually(t, func() bool { return reached.Load()+refused.Load()+other.Load() == 8 }, timeout, 10*time.Millisecond)
		t.Logf("8 slow requests at once at a fresh proxy: %d reached the app, %d refused", reached.Load(), refused.Load())
		assert.EqualValues(t, 2, reached.Load(), "only 2 in flight reach the app")
		assert.EqualValues(t, 6, refused.Load(), "past the limit of 2 in flight: 503")
		releaseOnce.Do(func() { close(release) })
		wg.Wait()
	})
}
