package router

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
)

func TestFilters(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		up := newUpstream(t, nil)
		p := httpPolicy(
			policy.HTTPRule{
				Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/headers"}}},
				Filters: []policy.Filter{
					{RequestHeaders: &policy.HeaderModifier{
						Add:    []policy.Header{{Name: "X-Add", Value: "a"}, {Name: "X-Set", Value: "added"}},
						Set:    []policy.Header{{Name: "X-Set", Value: "set"}, {Name: "X-Gone", Value: "x"}},
						Remove: []string{"X-Gone", "X-Drop"}}},
					{ResponseHeaders: &policy.HeaderModifier{Set: []policy.Header{{Name: "X-Resp", Value: "r"}}}},
				},
				Backends: to(up.backend("web")),
			},
			policy.HTTPRule{
				Matches:  []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/redirect"}}},
				Filters:  []policy.Filter{{Redirect: &policy.Redirect{Scheme: "https", Host: "other.test", Port: 8443, Path: &policy.PathModifier{Full: "/moved"}}}},
				Backends: to(up.backend("web")),
			},
			policy.HTTPRule{
				Matches:  []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/fail"}}},
				Filters:  []policy.Filter{{FailureInjector: &policy.FailureInjector{Status: 503, Message: "injected"}}},
				Backends: to(up.backend("web")),
			},
			policy.HTTPRule{
				Matches:  []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/old"}}},
				Filters:  []policy.Filter{{Redirect: &policy.Redirect{Status: 302, Path: &policy.PathModifier{Full: "/new", Prefix: true}}}},
				Backends: to(up.backend("web")),
			},
			policy.HTTPRule{
				Matches:  []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/never"}}},
				Filters:  []policy.Filter{{FailureInjector: &policy.FailureInjector{Status: 503, Message: "never", Ratio: policy.Ratio{Numerator: 0, Denominator: 1}}}},
				Backends: to(up.backend("web")),
			},
		)
		f := newFixture(t, mode, p)

		resp, body := f.do(t, "GET", "http://svc.test/headers", "", http.Header{"X-Drop": {"d"}, "X-Set": {"orig"}})
		require.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, "ok", body)
		h := up.header()
		assert.Equal(t, []string{"a"}, h["X-Add"], "add")
		assert.Equal(t, []string{"set"}, h["X-Set"], "set replaces the added and the original values")
		assert.Empty(t, h["X-Gone"], "remove comes after set")
		assert.Empty(t, h["X-Drop"], "remove")
		assert.Equal(t, "r", resp.Header.Get("X-Resp"), "response header modifier")

		resp, _ = f.do(t, "GET", "http://svc.test/redirect/x?q=1", "", nil)
		assert.Equal(t, http.StatusMovedPermanently, resp.StatusCode, "redirect status defaults to 301")
		assert.Equal(t, "https://other.test:8443/moved", resp.Header.Get("Location"), "a full path replaces the query too")

		resp, _ = f.do(t, "GET", "http://svc.test/old/a/b", "", nil)
		assert.Equal(t, http.StatusFound, resp.StatusCode)
		assert.Equal(t, "http://svc.test/new/a/b", resp.Header.Get("Location"), "a prefix rewrite keeps the rest of the path")

		n := up.n.Load()
		resp, _ = f.do(t, "GET", "http://svc.test/fail", "", nil)
		assert.Equal(t, 503, resp.StatusCode)
		assert.Equal(t, "injected", resp.Header.Get("L5d-Proxy-Error"))
		resp, _ = f.do(t, "GET", "http://svc.test/never", "", nil)
		assert.Equal(t, 200, resp.StatusCode, "ratio 0/1 never fires")
		assert.Equal(t, n+1, up.n.Load(), "only the ratio-0 request reached the upstream")
		assert.Equal(t, "1", f.m.Value(t, "outbound_http_route_request_statuses_total", `http_status="503"`))
		assert.Empty(t, f.m.Lines(t, "outbound_http_route_backend_response_statuses_total", `http_status="503"`),
			"a rule's injected failure reaches no backend")
	})
}

// testWeights checks over real connections that a random-available
// distribution honours weights within 5% over 10,000 requests, and gives a
// weight-0 backend none.
func testWeights(t *testing.T, weights []uint32) {
	var ups []*upstream
	var bs []policy.RouteBackend
	for i, w := range weights {
		u := newUpstream(t, nil)
		b := u.backend(string(rune('a' + i)))
		b.Weight = w
		ups, bs = append(ups, u), append(bs, b)
	}
	f := newFixture(t, testutil.H2C, httpPolicy(policy.HTTPRule{
		Backends: policy.Distribution{Kind: policy.DistributionRandomAvailable, Backends: bs}}))
	const n, workers = 10000, 8
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n / workers {
				resp, err := f.client.Get("http://svc.test/")
				if !assert.NoError(t, err) {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	var counts []int64
	for _, u := range ups {
		counts = append(counts, u.n.Load())
	}
	for i, w := range weights {
		want := float64(w) / 100
		if w == 0 {
			assert.Zero(t, counts[i], "a weight-0 backend: %v", counts)
			continue
		}
		assert.InDelta(t, want, float64(counts[i])/n, 0.05*want+0.005, "backend %d: %v", i, counts)
	}
}

func TestDistributions(t *testing.T) {
	for name, weights := range map[string][]uint32{
		"weights": {70, 20, 10},
		// The Gateway API conformance test httproute-weight.go: 70, 30
		// and 0, the last getting nothing.
		"httproute-weight": {70, 30, 0},
	} {
		t.Run(name, func(t *testing.T) { testWeights(t, weights) })
	}
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		a := newUpstream(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "a") })
		b := newUpstream(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "b") })
		p := httpPolicy(
			policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/first"}}},
				Backends: to(a.backend("a"), b.backend("b"))},
			policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/random"}}},
				Backends: policy.Distribution{Kind: policy.DistributionRandomAvailable, Backends: []policy.RouteBackend{a.backend("a"), b.backend("b")}}},
			policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/empty"}}}},
			policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/zero"}}},
				Backends: policy.Distribution{Kind: policy.DistributionRandomAvailable, Backends: []policy.RouteBackend{weighted(a.backend("a"), 0), b.backend("b")}}},
			policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/lone-zero"}}},
				Backends: policy.Distribution{Kind: policy.DistributionRandomAvailable, Backends: []policy.RouteBackend{weighted(a.backend("a"), 0)}}},
			policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/all-zero"}}},
				Backends: policy.Distribution{Kind: policy.DistributionRandomAvailable, Backends: []policy.RouteBackend{weighted(a.backend("a"), 0), weighted(b.backend("b"), 0)}}},
		)
		f := newFixture(t, mode, p)
		for range 5 {
			_, body := f.do(t, "GET", "http://svc.test/first", "", nil)
			assert.Equal(t, "a", body, "first-available takes the first backend")
		}
		seen := map[string]bool{}
		for i := 0; i < 200 && len(seen) < 2; i++ {
			_, body := f.do(t, "GET", "http://svc.test/random", "", nil)
			seen[body] = true
		}
		assert.Len(t, seen, 2, "random-available reaches both backends")
		resp, _ := f.do(t, "GET", "http://svc.test/empty", "", nil)
		assert.Equal(t, 500, resp.StatusCode, "an empty distribution fails the request")
		assert.NotEmpty(t, resp.Header.Get("L5d-Proxy-Error"))

		// A backendRef of weight 0 takes no traffic (Gateway API
		// HTTPBackendRef.weight: "If weight is set to 0, no traffic should
		// be forwarded for this entry"), even alone or with every other
		// backend at 0.
		na := a.n.Load()
		for range 100 {
			_, body := f.do(t, "GET", "http://svc.test/zero", "", nil)
			require.Equal(t, "b", body, "the weight-0 backend took a request")
		}
		for _, path := range []string{"/lone-zero", "/all-zero"} {
			resp, _ := f.do(t, "GET", "http://svc.test"+path, "", nil)
			assert.Equal(t, 500, resp.StatusCode, path)
			assert.Equal(t, "every backend of this route has weight 0", resp.Header.Get("L5d-Proxy-Error"), path)
		}
		assert.Equal(t, na, a.n.Load(), "no request reached a weight-0 backend")
	})
}

func weighted(b policy.RouteBackend, w uint32) policy.RouteBackend {
	b.Weight = w
	return b
}

func TestTimeouts(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		up := newUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/slow-head":
				select {
				case <-release:
				case <-r.Context().Done():
				}
			case "/idle":
				w.WriteHeader(200)
				_, _ = io.WriteString(w, "first chunk")
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
				}
			case "/slow-body":
				w.WriteHeader(200)
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}
		})
		tryUp := newUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
			if n == 1 { // the first attempt hangs
				select {
				case <-release:
				case <-r.Context().Done():
				}
				return
			}
			_, _ = io.WriteString(w, "second")
		})
		rule := func(path string, tm policy.Timeouts, retry *policy.Retry) policy.HTTPRule {
			return policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: path}}},
				Backends: to(up.backend("web")), Timeouts: tm, Retry: retry}
		}
		p := httpPolicy(
			rule("/slow-head", policy.Timeouts{Request: 100 * time.Millisecond}, &policy.Retry{}),
			rule("/slow-body", policy.Timeouts{Request: 100 * time.Millisecond}, nil),
			rule("/idle", policy.Timeouts{Idle: 100 * time.Millisecond}, nil),
			rule("/slow-response", policy.Timeouts{Response: 100 * time.Millisecond}, nil),
			policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/try"}}},
				Backends: to(tryUp.backend("web")), Retry: &policy.Retry{Timeout: 100 * time.Millisecond, MaxRetries: 1}},
		)
		p.HTTP1.Routes[0].Rules[3].Matches[0].Path.Value = "/slow-head"
		p.HTTP1.Routes[0].Rules[3].Matches[0].Headers = []policy.HeaderMatch{{Name: "X-Response", Value: "1"}}
		f := newFixture(t, mode, p)

		resp, _ := f.do(t, "GET", "http://svc.test/slow-head", "", nil)
		assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
		assert.Contains(t, resp.Header.Get("L5d-Proxy-Error"), "request timed out")
		assert.Equal(t, int64(1), up.n.Load(), "a route timeout is not retried")

		req, _ := http.NewRequest("GET", "http://svc.test/slow-body", nil)
		resp, err := f.client.Do(req)
		require.NoError(t, err)
		assert.Equal(t, 200, resp.StatusCode)
		_, err = io.ReadAll(resp.Body)
		assert.Error(t, err, "the request timeout bounds the response stream")
		resp.Body.Close()

		req, _ = http.NewRequest("GET", "http://svc.test/idle", nil)
		resp, err = f.client.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		assert.Error(t, err, "the idle timeout ends a stalled stream")
		assert.Equal(t, "first chunk", string(b))
		resp.Body.Close()

		resp, _ = f.do(t, "GET", "http://svc.test/slow-head", "", http.Header{"X-Response": {"1"}})
		assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
		assert.Contains(t, resp.Header.Get("L5d-Proxy-Error"), "response timed out")

		resp, body := f.do(t, "GET", "http://svc.test/try", "", nil)
		assert.Equal(t, 200, resp.StatusCode, "a per-try timeout is retried")
		assert.Equal(t, "second", body)

		lbl := `route_name="web"`
		assert.Equal(t, "1", f.m.Value(t, "outbound_http_route_request_statuses_total", lbl, `error="REQUEST_TIMEOUT"`, `http_status=""`))
		assert.NotEmpty(t, f.m.Value(t, "outbound_http_route_backend_response_statuses_total", lbl, `error="RESPONSE_HEADERS_TIMEOUT"`))
		assert.Equal(t, "1", f.m.Value(t, "outbound_http_route_request_statuses_total", lbl, `error="RESPONSE_STREAM_TIMEOUT"`))
		assert.Equal(t, "1", f.m.Value(t, "outbound_http_route_request_statuses_total", lbl, `error="IDLE_TIMEOUT"`, `http_status="200"`))
	})
}

func TestCountedRetries(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		up := newUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/always503":
				w.WriteHeader(503)
			case "/429":
				w.WriteHeader(429)
			case "/500":
				w.WriteHeader(500)
			case "/flaky":
				if n%2 == 1 {
					w.WriteHeader(502)
					return
				}
				_, _ = io.WriteString(w, "fine")
			}
		})
		rule := func(path string, retry *policy.Retry) policy.HTTPRule {
			return policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: path}}},
				Backends: to(up.backend("web")), Retry: retry}
		}
		bo := backoff.Policy{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond, Jitter: 1}
		p := httpPolicy(
			rule("/always503", &policy.Retry{MaxRetries: 3, Backoff: &bo, StatusRanges: fiveXX}),
			rule("/429", &policy.Retry{StatusRanges: []policy.StatusRange{{Start: 429, End: 429}}}),
			rule("/500", &policy.Retry{StatusRanges: []policy.StatusRange{{Start: 429, End: 429}}}),
			rule("/flaky", &policy.Retry{MaxRequestBytes: 16, StatusRanges: fiveXX}),
		)
		f := newFixture(t, mode, p)

		count := func(path string, body string) int64 {
			before := up.n.Load()
			f.do(t, "POST", "http://svc.test"+path, body, nil)
			return up.n.Load() - before
		}
		assert.Equal(t, int64(4), count("/always503", ""), "max_retries 3: four attempts")
		for range 3 {
			d := <-f.waits
			assert.GreaterOrEqual(t, d, 25*time.Millisecond)
			assert.LessOrEqual(t, d, 250*time.Millisecond)
		}
		assert.Equal(t, int64(2), count("/429", ""), "a status in the ranges is retried once by default")
		assert.Equal(t, int64(1), count("/500", ""), "a status outside the ranges is not retried")

		up.n.Store(0)
		resp, body := f.do(t, "POST", "http://svc.test/flaky", "small body", nil)
		assert.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, "fine", body)
		bodies := up.bodies()
		assert.Equal(t, []string{"small body", "small body"}, bodies[len(bodies)-2:], "the body is replayed")
		up.n.Store(0)
		resp, _ = f.do(t, "POST", "http://svc.test/flaky", "a body longer than sixteen bytes", nil)
		assert.Equal(t, 502, resp.StatusCode, "a body past max_request_bytes is sent once")
		assert.Equal(t, int64(1), up.n.Load())

		lbl := `route_name="web"`
		assert.Equal(t, "5", f.m.Value(t, "outbound_http_route_retry_requests_total", lbl))
		assert.Equal(t, "2", f.m.Value(t, "outbound_http_route_retry_limit_exceeded_total", lbl))
		assert.Equal(t, "1", f.m.Value(t, "outbound_http_route_retry_successes_total", lbl))
	})
}

func TestGRPCRetries(t *testing.T) {
	up := newUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		if n == 1 {
			w.Header().Set("Grpc-Status", "14")
		} else {
			w.Header().Set("Grpc-Status", "0")
		}
	})
	gmeta := policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Namespace: "ns", Name: "rpc"}
	p := &policy.Policy{Parent: parentMeta, Protocol: policy.ProtocolGRPC, GRPC: policy.GRPCProtocol{Routes: []policy.GRPCRoute{{
		Meta: gmeta,
		Rules: []policy.GRPCRule{{Backends: to(up.backend("web")),
			Retry: &policy.Retry{GRPCCodes: []codes.Code{codes.Unavailable}}},
			{Matches: []policy.GRPCRouteMatch{{Service: "pkg.Svc", Method: "Fail"}}, Backends: to(up.backend("web")),
				Filters: []policy.Filter{{GRPCFailureInjector: &policy.GRPCFailureInjector{Code: codes.PermissionDenied, Message: "grpc injected"}}}}},
	}}}}
	f := newFixture(t, testutil.H2C, p)
	resp, _ := f.do(t, "POST", "http://svc.test/pkg.Svc/Call", "", http.Header{"Content-Type": {"application/grpc"}})
	assert.Equal(t, "0", resp.Header.Get("Grpc-Status"), "UNAVAILABLE is retried")
	assert.Equal(t, int64(2), up.n.Load())
	assert.Equal(t, "1", f.m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="rpc"`, `grpc_status="OK"`))
	assert.Equal(t, "1", f.m.Value(t, "outbound_grpc_route_backend_response_statuses_total", `route_name="rpc"`, `grpc_status="UNAVAILABLE"`))
	assert.Equal(t, "1", f.m.Value(t, "outbound_grpc_route_retry_requests_total", `route_name="rpc"`))
	assert.Equal(t, "1", f.m.Value(t, "outbound_grpc_route_retry_successes_total", `route_name="rpc"`))

	// The gRPC failure injector answers with the code and message.
	resp, _ = f.do(t, "POST", "http://svc.test/pkg.Svc/Fail", "", http.Header{"Content-Type": {"application/grpc"}})
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "7", resp.Header.Get("Grpc-Status"))
	assert.Equal(t, "grpc injected", resp.Header.Get("Grpc-Message"))
	assert.Equal(t, int64(2), up.n.Load(), "the injected failure never reached the upstream")
	assert.Equal(t, "1", f.m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="rpc"`, `grpc_status="PERMISSION_DENIED"`))
}

// TestGRPCRetriesOnEitherRouteKind: a response is retried when its gRPC
// status is among the retry's codes or its HTTP status in the retry's
// ranges, whatever the route's kind, and l5d-retry-grpc and
// l5d-retry-http apply on routes of both kinds, as in linkerd2-proxy
// (linkerd/app/outbound/src/http/logical/policy/route/retry.rs
// is_retryable; route/extensions.rs configure_retry).
func TestGRPCRetriesOnEitherRouteKind(t *testing.T) {
	grpcUnavailable := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Grpc-Status", "14")
	}
	http503 := func(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) }
	for _, tc := range []struct {
		name      string
		grpcRoute bool
		retry     *policy.Retry
		header    http.Header
		first     func(w http.ResponseWriter)
		want      int64 // attempts
	}{
		{"HTTPRoute: l5d-retry-grpc", false, nil, http.Header{"L5d-Retry-Grpc": {"unavailable"}}, grpcUnavailable, 2},
		{"HTTPRoute: 5xx ranges retry a gRPC call answered 503", false, &policy.Retry{StatusRanges: fiveXX}, nil, http503, 2},
		{"HTTPRoute: 5xx ranges do not retry grpc-status UNAVAILABLE", false, &policy.Retry{StatusRanges: fiveXX}, nil, grpcUnavailable, 1},
		{"GRPCRoute: l5d-retry-http", true, nil, http.Header{"L5d-Retry-Http": {"5xx"}}, http503, 2},
		{"GRPCRoute: codes do not retry an HTTP 503", true, &policy.Retry{GRPCCodes: []codes.Code{codes.Internal}}, nil, http503, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					tc.first(w)
					return
				}
				w.Header().Set("Content-Type", "application/grpc")
				w.Header().Set("Grpc-Status", "0")
			})
			p := httpPolicy(policy.HTTPRule{Backends: to(up.backend("web")), Retry: tc.retry, AllowL5dRequestHeaders: true})
			if tc.grpcRoute {
				p = &policy.Policy{Parent: parentMeta, Protocol: policy.ProtocolGRPC, GRPC: policy.GRPCProtocol{Routes: []policy.GRPCRoute{{
					Meta:  policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Namespace: "ns", Name: "rpc"},
					Rules: []policy.GRPCRule{{Backends: to(up.backend("web")), Retry: tc.retry, AllowL5dRequestHeaders: true}},
				}}}}
			}
			f := newFixture(t, testutil.H2C, p)
			h := http.Header{"Content-Type": {"application/grpc"}}
			for k, v := range tc.header {
				h[k] = v
			}
			f.do(t, "POST", "http://svc.test/pkg.Svc/Call", "", h)
			assert.Equal(t, tc.want, up.n.Load(), "attempts")
		})
	}
}

func TestL5dHeaders(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		up := newUpstream(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })
		rule := func(path string, allow bool) policy.HTTPRule {
			return policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: path}}},
				Backends: to(up.backend("web")), AllowL5dRequestHeaders: allow}
		}
		f := newFixture(t, mode, httpPolicy(rule("/allowed", true), rule("/denied", false)))
		h := http.Header{"L5d-Retry-Limit": {"2"}, "L5d-Retry-Http": {"5xx"}, "L5d-Timeout": {"5s"}, "L5d-Response-Timeout": {"5s"},
			"L5d-Retry-Timeout": {"5s"}, "L5d-Request-Timeout": {"5s"}, "L5d-Retry-Grpc": {"unavailable"}}

		f.do(t, "GET", "http://svc.test/allowed", "", h)
		assert.Equal(t, int64(3), up.n.Load(), "l5d-retry-limit 2 honoured")
		for k := range h {
			assert.Empty(t, up.header()[k], "%s is not forwarded", k)
		}
		up.n.Store(0)
		f.do(t, "GET", "http://svc.test/denied", "", h)
		assert.Equal(t, int64(1), up.n.Load(), "ignored without allow_l5d_request_headers")
		for k := range h {
			assert.Empty(t, up.header()[k], "%s is not forwarded", k)
		}
	})
}

func TestPrecedence(t *testing.T) {
	up := newUpstream(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "policy") })
	pol := httpPolicy(policy.HTTPRule{Backends: to(up.backend("web"))})
	prof := profiles.NewStaticSource(nil)
	f := newFixture(t, testutil.H1, pol, WithProfiles(prof))
	_, body := f.do(t, "GET", "http://svc.test/x", "", nil)
	assert.Equal(t, "policy", body, "without a profile the policy routes")

	// A profile without routes or overrides does not take precedence.
	prof.Set(authority, &profiles.Profile{})
	f.waitModel(t, "http://svc.test/x", ModelPolicy)

	// A profile with routes wins; its route sends the request on to the
	// request's own (IP-literal) host through the profile router.
	sp := &profiles.Profile{Routes: []profiles.Route{{
		Condition: profiles.PathRegex("/.*"), Labels: map[string]string{"route": "sp"}, Timeout: time.Second}}}
	prof.Set(authority, sp)
	f.waitModel(t, "http://svc.test/x", ModelProfile)
	e := f.r.Explain(httptest.NewRequest("GET", "http://svc.test/x", nil))
	assert.Equal(t, "sp", e.Route)

	// A profile whose every route is left out (a pathRegex that does not
	// compile) does not take precedence: linkerd2-proxy's
	// Profile::has_routes_or_targets counts the routes it converted.
	prof.Set(authority, &profiles.Profile{Routes: []profiles.Route{{
		Condition: profiles.PathRegex("/x("), Labels: map[string]string{"route": "typo"}}}})
	f.waitModel(t, "http://svc.test/x", ModelPolicy)
	_, body = f.do(t, "GET", "http://svc.test/x", "", nil)
	assert.Equal(t, "policy", body)
	prof.Set(authority, sp)
	f.waitModel(t, "http://svc.test/x", ModelProfile)

	// Removing the profile's routes gives the policy back.
	prof.Set(authority, nil)
	f.waitModel(t, "http://svc.test/x", ModelPolicy)
	_, body = f.do(t, "GET", "http://svc.test/x", "", nil)
	assert.Equal(t, "policy", body)
}

func TestProfileRoutesWin(t *testing.T) {
	// Over a real connection: the profile's route (and its route_*
	// metrics) serve a request whose authority has both.
	up := newUpstream(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "direct") })
	host := up.srv.Listener.Addr().String()
	other := newUpstream(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "policy") })
	pol := policy.NewStaticSource(map[string]*policy.Policy{host: httpPolicy(policy.HTTPRule{Backends: to(other.backend("other"))})})
	prof := profiles.NewStaticSource(map[string]*profiles.Profile{host: {Routes: []profiles.Route{{
		Condition: profiles.PathRegex("/.*"), Labels: map[string]string{"route": "sp"}}}}})
	m := testutil.NewMetrics(t)
	r := New(WithPolicies(pol), WithProfiles(prof), WithMeterProvider(m.Provider))
	t.Cleanup(r.Close)
	req := httptest.NewRequest("GET", "http://"+host+"/x", nil)
	require.Eventually(t, func() bool { return r.Explain(req).Model == ModelProfile }, testutil.Timeout, 5*time.Millisecond)
	client := &http.Client{Transport: r.Transport(testutil.NewTransport(t, testutil.H1))}
	resp, err := client.Get("http://" + host + "/x")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "direct", string(b))
	assert.Equal(t, "1", m.Value(t, "route_response_total", `rt_route="sp"`))
	assert.Empty(t, m.Lines(t, "outbound_http_route_request_statuses_total"))
}

func TestMetricsLabels(t *testing.T) {
	up := newUpstream(t, nil)
	f := newFixture(t, testutil.H1, httpPolicy(policy.HTTPRule{Backends: to(up.backend("web-backend"))}))
	f.do(t, "GET", "http://svc.test/", "", nil)
	port := up.srv.Listener.Addr().String()
	port = port[strings.LastIndexByte(port, ':')+1:]
	parent := `parent_group="",parent_kind="Service",parent_name="svc",parent_namespace="ns",parent_port="80",parent_section_name=""`
	route := `route_group="gateway.networking.k8s.io",route_kind="HTTPRoute",route_name="web",route_namespace="ns"`
	backend := `backend_group="",backend_kind="Service",backend_name="web-backend",backend_namespace="ns",backend_port="` + port + `",backend_section_name=""`
	scrape := f.m.Scrape(t)
	for _, want := range []string{
		`outbound_http_route_request_statuses_total{error="",hostname="",http_status="200",` + parent + `,` + route + `} 1`,
		`outbound_http_route_request_duration_seconds_bucket{hostname="",` + parent + `,` + route + `,le="0.05"} 1`,
		`outbound_http_route_request_duration_seconds_bucket{hostname="",` + parent + `,` + route + `,le="10"} 1`,
		`outbound_http_route_backend_requests_total{` + backend + `,` + parent + `,` + route + `} 1`,
		`outbound_http_route_backend_response_statuses_total{` + backend + `,error="",http_status="200",` + parent + `,` + route + `} 1`,
		`outbound_http_route_backend_response_duration_seconds_bucket{` + backend + `,` + parent + `,` + route + `,le="0.025"} `,
		`outbound_http_route_backend_response_duration_seconds_bucket{` + backend + `,` + parent + `,` + route + `,le="0.25"} `,
	} {
		assert.Contains(t, scrape, want)
	}
}

func TestExplain(t *testing.T) {
	up := newUpstream(t, nil)
	p := httpPolicy(
		policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/api"}}},
			Backends: to(up.backend("api")), Timeouts: policy.Timeouts{Request: time.Second},
			Retry:   &policy.Retry{MaxRetries: 2},
			Filters: []policy.Filter{{RequestHeaders: &policy.HeaderModifier{Set: []policy.Header{{Name: "a", Value: "b"}}}}}},
		policy.HTTPRule{Backends: to(up.backend("rest"))},
	)
	prof := profiles.NewStaticSource(nil)
	budget := profiles.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, TTL: 10 * time.Second}
	f := newFixture(t, testutil.H1, p, WithProfiles(prof), WithRetryBudget(&budget))

	e := f.r.Explain(httptest.NewRequest("GET", "http://svc.test/api/v1", nil))
	assert.Equal(t, ModelPolicy, e.Model)
	assert.Equal(t, "web", e.Route)
	assert.Contains(t, e.Match, "path prefix(4)")
	assert.Contains(t, e.RunnerUp, "route 0 rule 1", "the catch-all rule is the runner-up")
	assert.Equal(t, []string{"request_header_modifier"}, e.Filters)
	require.NotNil(t, e.Backends)
	assert.Equal(t, "first_available", e.Backends.Distribution)
	assert.Equal(t, "api", e.Backends.Backends[0].Name)
	assert.Equal(t, "1s", e.Timeouts.Request)
	require.NotNil(t, e.Retry)
	assert.Equal(t, "counted", e.Retry.Kind)
	assert.Equal(t, 2, e.Retry.MaxRetries)
	assert.Empty(t, e.Retry.Statuses, "no status ranges: no response status is retried")
	require.NotNil(t, e.Budget, "the router's budget on top of the count")
	_, err := json.Marshal(e)
	require.NoError(t, err)

	profileBudget := profiles.DefaultRetryBudget()
	prof.Set(authority, &profiles.Profile{Routes: []profiles.Route{{Condition: profiles.Method("GET"), Labels: map[string]string{"route": "gets"}, Retryable: true}},
		RetryBudget: &profileBudget})
	f.waitModel(t, "http://svc.test/api", ModelProfile)
	e = f.r.Explain(httptest.NewRequest("GET", "http://svc.test/api", nil))
	assert.Equal(t, "gets", e.Route)
	require.NotNil(t, e.Index)
	assert.Equal(t, 0, *e.Index)
	require.NotNil(t, e.Retry)
	assert.Equal(t, "budget", e.Retry.Kind)
	require.NotNil(t, e.Budget)
	assert.InDelta(t, 0.2, e.Budget.RetryRatio, 1e-6)

	e = f.r.Explain(httptest.NewRequest("GET", "http://10.0.0.1:8080/", nil))
	assert.Equal(t, ModelDefault, e.Model)
	assert.Contains(t, e.Reason, "no outbound policy")
}

func TestExplainHandler(t *testing.T) {
	up := newUpstream(t, nil)
	f := newFixture(t, testutil.H1, httpPolicy(policy.HTTPRule{Backends: to(up.backend("web"))}))
	srv := httptest.NewServer(f.r.ExplainHandler())
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/routes?authority=svc.test:80&method=POST&path=/a/b")
	require.NoError(t, err)
	var e Explanation
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	resp.Body.Close()
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Equal(t, ModelPolicy, e.Model)
	assert.Equal(t, "web", e.Route)
	for _, bad := range []string{"", "?authority=", "?authority=svc.test:80&path=relative", "?authority=svc.test:80&method=B%20AD"} {
		resp, err := http.Get(srv.URL + "/routes" + bad)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, bad)
	}
}

// failFastOnce fails the first request without sending it, as a
// balancer's fail-fast does.
type failFastOnce struct {
	base http.RoundTripper
	n    atomic.Int64
}

type failFastErr struct{}

func (failFastErr) Error() string  { return "no ready endpoint" }
func (failFastErr) FailFast() bool { return true }

type loadShedErr struct{}

func (loadShedErr) Error() string  { return "overloaded" }
func (loadShedErr) LoadShed() bool { return true }

func (f *failFastOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	switch f.n.Add(1) {
	case 1:
		closeReqBody(req)
		if req.URL.Path == "/shed" {
			return nil, loadShedErr{}
		}
		return nil, failFastErr{}
	}
	return f.base.RoundTrip(req)
}

func TestRetryErrors(t *testing.T) {
	up := newUpstream(t, nil)
	pol := policy.NewStaticSource(map[string]*policy.Policy{authority: httpPolicy(policy.HTTPRule{Backends: to(up.backend("web")), Retry: &policy.Retry{}})})
	m := testutil.NewMetrics(t)
	r := New(WithPolicies(pol), WithMeterProvider(m.Provider))
	t.Cleanup(r.Close)
	r.cfg.wait = func(ctx context.Context, _ time.Duration) bool { return true }
	req := httptest.NewRequest("GET", "http://svc.test/", nil)
	require.Eventually(t, func() bool { return r.Explain(req).Model == ModelPolicy }, testutil.Timeout, 5*time.Millisecond)

	ff := &failFastOnce{base: testutil.NewTransport(t, testutil.H1)}
	client := &http.Client{Transport: r.Transport(ff)}
	resp, err := client.Post("http://svc.test/", "text/plain", strings.NewReader("body"))
	require.NoError(t, err, "a fail-fast error is retried")
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "1", m.Value(t, "outbound_http_route_backend_response_statuses_total", `error="FAIL_FAST"`))

	ff.n.Store(0)
	_, err = client.Get("http://svc.test/shed")
	require.Error(t, err, "load shedding is never retried")
	assert.Equal(t, "1", m.Value(t, "outbound_http_route_request_statuses_total", `error="LOAD_SHED"`))
}

func TestStreamedBodyReplay(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		up := newUpstream(t, func(n int64, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				w.WriteHeader(503)
			}
		})
		f := newFixture(t, mode, httpPolicy(policy.HTTPRule{Backends: to(up.backend("web")), Retry: &policy.Retry{MaxRequestBytes: 8, StatusRanges: fiveXX}}))
		send := func(body string) int {
			// A body of unknown length that the caller cannot give again:
			// the copy kept while it streams is what a retry sends.
			req, err := http.NewRequest("POST", "http://svc.test/", io.NopCloser(strings.NewReader(body)))
			require.NoError(t, err)
			resp, err := f.client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			return resp.StatusCode
		}
		assert.Equal(t, 200, send("12345678"))
		assert.Equal(t, []string{"12345678", "12345678"}, up.bodies())
		up.n.Store(0)
		assert.Equal(t, 503, send("123456789"), "a body past max_request_bytes is not retried")
		assert.Len(t, up.bodies(), 3)
	})
}

func TestRetryBudgetOnTop(t *testing.T) {
	up := newUpstream(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })
	budget := profiles.RetryBudget{RetryRatio: 0, MinRetriesPerSecond: 1, TTL: 10 * time.Second}
	f := newFixture(t, testutil.H1, httpPolicy(policy.HTTPRule{Backends: to(up.backend("web")), Retry: &policy.Retry{MaxRetries: 100, StatusRanges: fiveXX}}),
		WithRetryBudget(&budget))
	f.do(t, "GET", "http://svc.test/", "", nil)
	n := up.n.Load()
	assert.Less(t, n, int64(101), "the budget stops retries before the count")
	assert.Equal(t, "1", f.m.Value(t, "outbound_http_route_retry_overflow_total", `route_name="web"`))
	assert.Equal(t, strconv.FormatInt(n-1, 10), f.m.Value(t, "outbound_http_route_retry_requests_total", `route_name="web"`))
}

// TestTimeoutDuringBackoff: a request timeout that fires while a retry
// waits out its backoff answers 504 REQUEST_TIMEOUT, as Linkerd's proxy
// does, not the 5xx of the attempt that was to be retried.
func TestTimeoutDuringBackoff(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		up := newUpstream(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) })
		long := backoff.Policy{Min: time.Hour, Max: time.Hour}
		p := httpPolicy(policy.HTTPRule{Backends: to(up.backend("web")),
			Timeouts: policy.Timeouts{Request: 200 * time.Millisecond},
			Retry:    &policy.Retry{MaxRetries: 3, Backoff: &long, StatusRanges: fiveXX}})
		f := newFixture(t, mode, p)
		f.r.cfg.wait = sleep // a real backoff, which the timeout interrupts

		resp, _ := f.do(t, "GET", "http://svc.test/", "", nil)
		assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
		assert.Equal(t, "request timed out after 200ms", resp.Header.Get("L5d-Proxy-Error"))
		assert.Equal(t, int64(1), up.n.Load(), "no retry after the timeout")
		assert.Equal(t, "1", f.m.Value(t, "outbound_http_route_request_statuses_total", `error="REQUEST_TIMEOUT"`))
	})
}

// TestResponseTimeoutStartsAfterTheUpload: the response timeout runs from
// the end of the request body, as Linkerd's does, so an upload slower
// than the timeout is answered; a slow answer after the upload still
// times out.
func TestResponseTimeoutStartsAfterTheUpload(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		// The upstream has read the whole body when its handler runs.
		up := newUpstream(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow-answer" {
				select {
				case <-release:
				case <-r.Context().Done():
				}
				return
			}
			_, _ = io.WriteString(w, "uploaded")
		})
		const timeout = 500 * time.Millisecond
		p := httpPolicy(policy.HTTPRule{Backends: to(up.backend("web")), Timeouts: policy.Timeouts{Response: timeout}})
		f := newFixture(t, mode, p)

		upload := func(path string) *http.Response { return slowUpload(t, f, path, 2*timeout) }
		resp := upload("/echo")
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, 200, resp.StatusCode, "l5d-proxy-error %q", resp.Header.Get("L5d-Proxy-Error"))
		assert.Equal(t, "uploaded", string(b))
		bodies := up.bodies()
		assert.Equal(t, "first half, second half", bodies[len(bodies)-1])

		resp = upload("/slow-answer")
		assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
		assert.Equal(t, "response timed out after 500ms", resp.Header.Get("L5d-Proxy-Error"))
	})
}

// TestTryTimeoutStartsAfterTheUpload: the retry's per-attempt timeout
// (retry.linkerd.io/timeout) is Linkerd's response-headers timeout, which
// starts once the request body has been sent
// (linkerd2-proxy linkerd/http/stream-timeouts/src/lib.rs), so an upload
// slower than it is answered; an answer slow after the upload still times
// the attempt out, and the attempt is retried.
func TestTryTimeoutStartsAfterTheUpload(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		var slow atomic.Int64
		// The upstream has read the whole body when its handler runs.
		up := newUpstream(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow-answer" && slow.Add(1) == 1 {
				select {
				case <-release:
				case <-r.Context().Done():
				}
				return
			}
			_, _ = io.WriteString(w, "uploaded")
		})
		const timeout = 500 * time.Millisecond
		p := httpPolicy(policy.HTTPRule{Backends: to(up.backend("web")),
			Retry: &policy.Retry{Timeout: timeout, MaxRetries: 1}})
		f := newFixture(t, mode, p)

		upload := func(path string) (*http.Response, string) {
			resp := slowUpload(t, f, path, 2*timeout)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp, string(b)
		}
		resp, body := upload("/echo")
		assert.Equal(t, 200, resp.StatusCode, "l5d-proxy-error %q", resp.Header.Get("L5d-Proxy-Error"))
		assert.Equal(t, "uploaded", body)
		assert.Equal(t, int64(1), up.n.Load(), "the slow upload's attempt was not timed out")

		resp, body = upload("/slow-answer")
		assert.Equal(t, 200, resp.StatusCode, "l5d-proxy-error %q", resp.Header.Get("L5d-Proxy-Error"))
		assert.Equal(t, "uploaded", body)
		assert.Equal(t, int64(2), slow.Load(), "the attempt slow to answer timed out and was retried")
		bodies := up.bodies()
		assert.Equal(t, "first half, second half", bodies[len(bodies)-1], "the retry sent the whole body")
	})
}

// slowUpload posts to path through f a body whose second half comes gap
// after its first, as a slow client sends it; the response's body is
// closed when the test ends.
func slowUpload(t *testing.T, f *fixture, path string, gap time.Duration) *http.Response {
	t.Helper()
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, "first half, ")
		<-time.After(gap)
		_, _ = io.WriteString(pw, "second half")
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", "http://svc.test"+path, pr)
	resp, err := f.client.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}
