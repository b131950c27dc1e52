package router

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/mirror"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mirrorOf returns a mirror of share n/d (0/0: every request) to up.
func mirrorOf(up *upstream, name string, n, d uint32) policy.Mirror {
	ap := netip.MustParseAddrPort(up.srv.Listener.Addr().String())
	return policy.Mirror{Meta: policy.Metadata{Kind: "Service", Namespace: "ns", Name: name, Port: ap.Port()},
		Forward: &endpoint.Endpoint{Addr: ap}, Ratio: policy.Ratio{Numerator: n, Denominator: d}}
}

func prefix(p string) []policy.HTTPRouteMatch {
	return []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: p}}}
}

// mirrorCount is the value of outbound_http_route_mirror_requests_total
// for one mirror backend and result, 0 when the series is absent.
func (f *fixture) mirrorCount(t *testing.T, backend, result string) int {
	t.Helper()
	v := f.m.Value(t, "outbound_http_route_mirror_requests_total", `backend_name="`+backend+`"`, `result="`+result+`"`)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err)
	return n
}

// waitCount waits until up has served n requests.
func waitCount(t *testing.T, up *upstream, n int64, what string) {
	t.Helper()
	require.Eventually(t, func() bool { return up.n.Load() >= n }, testutil.Timeout, 2*time.Millisecond, what)
}

// TestRequestMirrorConformance runs the cases of the Gateway API
// conformance tests httproute-request-mirror.go,
// httproute-request-multiple-mirrors.go and
// httproute-request-percentage-mirror.go (with their manifests, in
// kubernetes-sigs/gateway-api conformance/tests/) through the router to
// real upstreams: the primary backend answers with the request as its
// filters left it, every mirror backend gets a copy of the same path, and
// a percent or fraction mirrors that share of the requests. Upstream
// samples at random and accepts 3 standard deviations; here the router's
// random source is a fixed sequence, so the share is exact.
func TestRequestMirrorConformance(t *testing.T) {
	modify := policy.Filter{RequestHeaders: &policy.HeaderModifier{
		Set:    []policy.Header{{Name: "X-Header-Set", Value: "set-overwrites-values"}},
		Add:    []policy.Header{{Name: "X-Header-Add", Value: "header-val-1"}, {Name: "X-Header-Add-Append", Value: "header-val-2"}},
		Remove: []string{"X-Header-Remove"},
	}}
	sent := http.Header{"X-Header-Remove": {"remove-val"}, "X-Header-Add-Append": {"append-val-1"}}
	wantHeaders := map[string]string{"X-Header-Add": "header-val-1", "X-Header-Add-Append": "append-val-1,header-val-2", "X-Header-Set": "set-overwrites-values"}
	type mirrorWant struct {
		name    string
		percent int // of 100 requests
	}
	tests := []struct {
		source  string
		path    string
		filters bool // the rule modifies headers before its mirrors
		mirrors []mirrorWant
		ratio   [2]uint32
	}{
		{"httproute-request-mirror", "/mirror", false, []mirrorWant{{"infra-backend-v2", 100}}, [2]uint32{}},
		{"httproute-request-mirror", "/mirror-and-modify-headers", true, []mirrorWant{{"infra-backend-v2", 100}}, [2]uint32{}},
		{"httproute-request-multiple-mirrors", "/multi-mirror", false, []mirrorWant{{"infra-backend-v2", 100}, {"infra-backend-v3", 100}}, [2]uint32{}},
		{"httproute-request-multiple-mirrors", "/multi-mirror-and-modify-request-headers", true, []mirrorWant{{"infra-backend-v2", 100}, {"infra-backend-v3", 100}}, [2]uint32{}},
		{"httproute-request-percentage-mirror", "/percent-mirror", false, []mirrorWant{{"infra-backend-v2", 20}}, [2]uint32{20, 100}},
		{"httproute-request-percentage-mirror", "/percent-mirror-fraction", false, []mirrorWant{{"infra-backend-v2", 50}}, [2]uint32{25, 50}},
		{"httproute-request-percentage-mirror", "/percent-mirror-and-modify-headers", true, []mirrorWant{{"infra-backend-v2", 35}}, [2]uint32{35, 100}},
	}
	for _, tt := range tests {
		t.Run(tt.source+tt.path, func(t *testing.T) {
			testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
				primary := newUpstream(t, nil)
				rule := policy.HTTPRule{Matches: prefix(tt.path), Backends: to(primary.backend("infra-backend-v1"))}
				if tt.filters {
					rule.Filters = []policy.Filter{modify}
				}
				ups := map[string]*upstream{}
				for _, m := range tt.mirrors {
					up := newUpstream(t, nil)
					ups[m.name] = up
					rule.Mirrors = append(rule.Mirrors, mirrorOf(up, m.name, tt.ratio[0], tt.ratio[1]))
				}
				// The cases are about which requests are mirrored: an
				// in-flight limit no run can reach (100 requests, two
				// mirrors at most), so that copies lagging on a busy
				// machine are never dropped. The limit has a test of
				// its own (TestMirrorNeverHoldsPrimary).
				f := newFixture(t, mode, httpPolicy(rule), WithMirrorLimits(MirrorLimits{InFlight: 1000}))
				// 100 draws spread evenly over [0, 1): a share of p
				// mirrors exactly 100p of them.
				var draw atomic.Int64
				f.r.cfg.rand = func() float64 { return float64((draw.Add(1)*37)%100) / 100 }
				for i := range 100 {
					h := http.Header{}
					if tt.filters {
						h = sent.Clone()
					}
					resp, _ := f.do(t, "GET", fmt.Sprintf("http://svc.test%s?i=%d", tt.path, i), "", h)
					require.Equal(t, 200, resp.StatusCode)
					if i == 0 && tt.filters {
						got := primary.header()
						for k, v := range wantHeaders {
							assert.Equal(t, v, strings.Join(got.Values(k), ","), "primary %s", k)
						}
						assert.Empty(t, got.Values("X-Header-Remove"))
					}
				}
				assert.EqualValues(t, 100, primary.n.Load(), "the primary gets every request")
				for _, m := range tt.mirrors {
					up := ups[m.name]
					waitCount(t, up, int64(m.percent), m.name)
					require.Eventually(t, func() bool { return f.mirrorCount(t, m.name, "success") == m.percent },
						testutil.Timeout, 5*time.Millisecond, "%s: mirrored requests counted", m.name)
					assert.EqualValues(t, m.percent, up.n.Load(), "%s gets its share", m.name)
					if tt.filters {
						got := up.header()
						for k, v := range wantHeaders {
							assert.Equal(t, v, strings.Join(got.Values(k), ","), "mirror %s: %s", m.name, k)
						}
						assert.Empty(t, got.Values("X-Header-Remove"))
					}
				}
			})
		})
	}
}

// TestMirrorCopiesRequest checks what a copy carries: the method, path
// and query, the headers, the body (with or without a declared length),
// and the Host the caller sent, not the mirror's authority, as a
// backend's request keeps it; and that a retried request is mirrored once.
func TestMirrorCopiesRequest(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		type seen struct{ method, uri, host, body, hdr string }
		got := make(chan seen, 10)
		mirror := newUpstream(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
			got <- seen{r.Method, r.RequestURI, r.Host, "", r.Header.Get("X-Trace")}
		})
		var fails atomic.Int64
		primary := newUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/retry" && fails.Add(1) == 1 {
				w.WriteHeader(503)
				return
			}
			_, _ = io.WriteString(w, "primary")
		})
		m := mirrorOf(mirror, "shadow", 0, 0)
		f := newFixture(t, mode, httpPolicy(policy.HTTPRule{Backends: to(primary.backend("web")), Mirrors: []policy.Mirror{m},
			Retry: &policy.Retry{MaxRetries: 2, StatusRanges: fiveXX}}))

		resp, body := f.do(t, "POST", "http://svc.test/orders?id=7", "order-7", http.Header{"X-Trace": {"t1"}})
		require.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, "primary", body, "the caller gets the primary's answer")
		s := <-got
		assert.Equal(t, seen{"POST", "/orders?id=7", "svc.test", "", "t1"}, s)
		waitCount(t, mirror, 1, "mirror")
		assert.Equal(t, []string{"order-7"}, mirror.bodies())

		// A body of unknown length (chunked) within the bound.
		req, err := http.NewRequest("PUT", "http://svc.test/stream", io.MultiReader(strings.NewReader("part1-"), strings.NewReader("part2")))
		require.NoError(t, err)
		resp, err = f.client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		<-got
		waitCount(t, mirror, 2, "mirror")
		assert.Equal(t, "part1-part2", mirror.bodies()[1])

		// Retried once (503, then 200): mirrored once.
		resp, _ = f.do(t, "POST", "http://svc.test/retry", "again", nil)
		require.Equal(t, 200, resp.StatusCode)
		<-got
		assert.EqualValues(t, 2, fails.Load(), "the primary was retried")
		select {
		case s := <-got:
			t.Fatalf("a retry was mirrored again: %+v", s)
		case <-time.After(testutil.ShortTimeout):
		}
		assert.Equal(t, "again", mirror.bodies()[2])
	})
}

// TestMirrorBodyBound checks that a body larger than the bound reaches the
// primary whole and is not mirrored (counted body_too_large), whether its
// length is declared or not, and that a smaller one is.
func TestMirrorBodyBound(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		mirror := newUpstream(t, nil)
		primary := newUpstream(t, nil)
		f := newFixture(t, mode, httpPolicy(policy.HTTPRule{Backends: to(primary.backend("web")),
			Mirrors: []policy.Mirror{mirrorOf(mirror, "shadow", 0, 0)}}), WithMirrorLimits(MirrorLimits{BodyBytes: 16}))
		big := strings.Repeat("x", 17)
		resp, _ := f.do(t, "POST", "http://svc.test/declared", big, nil)
		require.Equal(t, 200, resp.StatusCode)
		req, err := http.NewRequest("POST", "http://svc.test/chunked", io.MultiReader(strings.NewReader(big[:10]), strings.NewReader(big[10:])))
		require.NoError(t, err)
		resp, err = f.client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, []string{big, big}, primary.bodies(), "the primary gets the whole body")
		require.Eventually(t, func() bool { return f.mirrorCount(t, "shadow", "body_too_large") == 2 },
			testutil.Timeout, 5*time.Millisecond)
		resp, _ = f.do(t, "POST", "http://svc.test/small", big[:16], nil)
		require.Equal(t, 200, resp.StatusCode)
		waitCount(t, mirror, 1, "a body within the bound is mirrored")
		assert.Equal(t, []string{big[:16]}, mirror.bodies())
	})
}

// TestMirrorNeverHoldsPrimary checks the acceptance of request mirroring
// with a mirror that stalls and one that is down: every primary request
// succeeds while the stalled mirror holds its copies (so no primary ever
// waited for one), the copies in flight stay within the bound and the rest
// are dropped and counted, and copies to the dead mirror are counted as
// failures.
func TestMirrorNeverHoldsPrimary(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		release := make(chan struct{})
		var stalled atomic.Int64
		slow := newUpstream(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
			stalled.Add(1)
			<-release
		})
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { close(release) }) })
		deadAddr := netip.MustParseAddrPort(testutil.FreeAddr(t))
		dead := policy.Mirror{Meta: policy.Metadata{Kind: "Service", Name: "dead"}, Forward: &endpoint.Endpoint{Addr: deadAddr}}
		primary := newUpstream(t, nil)
		const limit = 4
		f := newFixture(t, mode, httpPolicy(policy.HTTPRule{Backends: to(primary.backend("web")),
			Mirrors: []policy.Mirror{mirrorOf(slow, "slow", 0, 0), dead}}), WithMirrorLimits(MirrorLimits{InFlight: limit}))
		const n = 50
		for i := range n {
			resp, body := f.do(t, "GET", "http://svc.test/x", "", nil)
			require.Equal(t, 200, resp.StatusCode, "request %d", i)
			require.Equal(t, "ok", body)
		}
		// Every primary answered while the slow mirror held all it got.
		require.Eventually(t, func() bool { return stalled.Load() == limit }, testutil.Timeout, 2*time.Millisecond)
		require.Eventually(t, func() bool {
			return f.mirrorCount(t, "slow", "dropped")+f.mirrorCount(t, "dead", "dropped")+f.mirrorCount(t, "dead", "failure")+
				f.mirrorCount(t, "dead", "unavailable") == 2*n-limit
		}, testutil.Timeout, 5*time.Millisecond)
		assert.GreaterOrEqual(t, f.mirrorCount(t, "dead", "failure"), 1, "the dead mirror's copies fail")
		assert.Equal(t, limit, int(f.r.Explain(httptest.NewRequest("GET", "http://svc.test/x", nil)).Mirrors.InFlight))
		once.Do(func() { close(release) })
		require.Eventually(t, func() bool { return f.mirrorCount(t, "slow", "success") == limit }, testutil.Timeout, 5*time.Millisecond)
		e := f.r.Explain(httptest.NewRequest("GET", "http://svc.test/x", nil))
		require.NotNil(t, e.Mirrors)
		assert.Equal(t, MirrorsInfo{Mirrors: []MirrorInfo{
			{Name: "slow", Kind: "Service", Target: slow.srv.Listener.Addr().String(), Share: 1},
			{Name: "dead", Kind: "Service", Target: deadAddr.String(), Share: 1},
		}, MaxInFlight: limit, MaxBodyBytes: DefaultMirrorBodyBytes, Timeout: DefaultMirrorTimeout.String()}, *e.Mirrors)
	})
}

// TestMirrorTimeout checks that a copy whose mirror never answers ends at
// the mirror timeout, counted as a failure, freeing its place.
func TestMirrorTimeout(t *testing.T) {
	release := make(chan struct{})
	slow := newUpstream(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	primary := newUpstream(t, nil)
	f := newFixture(t, testutil.H1, httpPolicy(policy.HTTPRule{Backends: to(primary.backend("web")),
		Mirrors: []policy.Mirror{mirrorOf(slow, "slow", 0, 0)}}), WithMirrorLimits(MirrorLimits{InFlight: 1, Timeout: 50 * time.Millisecond}))
	resp, _ := f.do(t, "GET", "http://svc.test/x", "", nil)
	require.Equal(t, 200, resp.StatusCode)
	require.Eventually(t, func() bool { return f.mirrorCount(t, "slow", "failure") == 1 }, testutil.Timeout, 5*time.Millisecond)
	resp, _ = f.do(t, "GET", "http://svc.test/x", "", nil)
	require.Equal(t, 200, resp.StatusCode)
	waitCount(t, slow, 2, "the place of the timed-out copy is free again")
	assert.Zero(t, f.mirrorCount(t, "slow", "dropped"))
}

// A dead mirror (connections refused) is backed off: after its first
// failed copy, copies are not sent until the backoff ends, counted as
// unavailable, so that each primary request does not pay a refused dial;
// once the backoff ends a copy is tried again.
func TestMirrorDeadIsBackedOff(t *testing.T) {
	deadAddr := netip.MustParseAddrPort(testutil.FreeAddr(t))
	dead := policy.Mirror{Meta: policy.Metadata{Kind: "Service", Name: "dead"}, Forward: &endpoint.Endpoint{Addr: deadAddr}}
	primary := newUpstream(t, nil)
	f := newFixture(t, testutil.H1, httpPolicy(policy.HTTPRule{Backends: to(primary.backend("web")), Mirrors: []policy.Mirror{dead}}))
	resp, _ := f.do(t, "GET", "http://svc.test/x", "", nil)
	require.Equal(t, 200, resp.StatusCode)
	require.Eventually(t, func() bool { return f.mirrorCount(t, "dead", "failure") == 1 }, testutil.Timeout, 2*time.Millisecond)
	const n = 20
	sent := time.Now()
	for range n {
		resp, _ := f.do(t, "GET", "http://svc.test/x", "", nil)
		require.Equal(t, 200, resp.StatusCode)
	}
	if time.Since(sent) < mirror.BackoffMin {
		// All within the first backoff: none of them tried the dead mirror.
		assert.Equal(t, 1, f.mirrorCount(t, "dead", "failure"))
		assert.Equal(t, n, f.mirrorCount(t, "dead", "unavailable"))
	} else {
		assert.Less(t, f.mirrorCount(t, "dead", "failure"), n/2, "most copies backed off")
	}
	// After the backoff, a copy is tried again (and fails again).
	before := f.mirrorCount(t, "dead", "failure")
	require.Eventually(t, func() bool {
		resp, _ := f.do(t, "GET", "http://svc.test/x", "", nil)
		return resp.StatusCode == 200 && f.mirrorCount(t, "dead", "failure") > before
	}, testutil.Timeout, 20*time.Millisecond, "the mirror is tried again once its backoff ends")
}
