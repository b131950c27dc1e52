package router

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// healthFixture is a router over a static policy and a real balancer over
// static endpoints on loopback.
type healthFixture struct {
	r      *Router
	bal    *balancer.Balancer
	client *http.Client
	m      *testutil.Metrics
}

func newHealthFixture(t *testing.T, p *policy.Policy, eps map[string][]endpoint.Endpoint) *healthFixture {
	t.Helper()
	src, err := balancer.NewStaticSource(eps)
	require.NoError(t, err)
	f := &healthFixture{m: testutil.NewMetrics(t)}
	f.bal = balancer.New(src)
	t.Cleanup(f.bal.Close)
	pol := policy.NewStaticSource(map[string]*policy.Policy{authority: p})
	f.r = New(WithPolicies(pol), WithMeterProvider(f.m.Provider), WithBalancer(f.bal))
	t.Cleanup(f.r.Close)
	f.r.cfg.wait = func(ctx context.Context, _ time.Duration) bool { return ctx.Err() == nil }
	f.client = &http.Client{Transport: f.r.Transport(f.bal.Transport(testutil.NewTransport(t, testutil.H1)))}
	req, _ := http.NewRequest("GET", "http://svc.test/", nil)
	require.Eventually(t, func() bool { return f.r.Explain(req).Model == ModelPolicy }, testutil.Timeout, 5*time.Millisecond)
	return f
}

func (f *healthFixture) get(t *testing.T) (*http.Response, string) {
	t.Helper()
	resp, err := f.client.Get("http://svc.test/")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// endpoint is a loopback server counting its requests, answering status
// with its name.
func countingEndpoint(t *testing.T, name string, status *atomic.Int64, n *atomic.Int64) endpoint.Endpoint {
	srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n.Add(1)
		w.WriteHeader(int(status.Load()))
		_, _ = io.WriteString(w, name)
	}))
	return endpoint.Endpoint{Addr: netip.MustParseAddrPort(srv.Listener.Addr().String()), Weight: endpoint.DefaultWeight}
}

func balancerBackend(name, auth string) policy.RouteBackend {
	return policy.RouteBackend{Backend: policy.Backend{
		Meta:     policy.Metadata{Kind: "Service", Namespace: "ns", Name: name, Port: 80},
		Balancer: &policy.Balancer{Authority: auth},
	}, Weight: 1}
}

func consecutive(max uint32, penalty time.Duration) *policy.FailureAccrual {
	return &policy.FailureAccrual{Consecutive: &policy.ConsecutiveFailures{MaxFailures: max,
		Backoff: backoff.Policy{Min: penalty, Max: penalty}}}
}

// The failure accrual of the OutboundPolicy reaches the balancer of its
// backend: of three endpoints, the one failing every request trips after
// its consecutive failures and gets no more requests.
func TestPolicyFailureAccrual(t *testing.T) {
	var ok, bad atomic.Int64
	ok.Store(200)
	bad.Store(500)
	var nGood, nBad atomic.Int64
	eps := []endpoint.Endpoint{countingEndpoint(t, "a", &ok, &nGood), countingEndpoint(t, "b", &ok, &nGood), countingEndpoint(t, "bad", &bad, &nBad)}
	p := httpPolicy(policy.HTTPRule{Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable,
		Backends: []policy.RouteBackend{balancerBackend("web", "web.ns.svc.cluster.local:80")}}})
	p.HTTP1.FailureAccrual = consecutive(3, time.Hour)
	f := newHealthFixture(t, p, map[string][]endpoint.Endpoint{"web.ns.svc.cluster.local:80": eps})

	for nBad.Load() < 3 {
		f.get(t)
	}
	before := nBad.Load()
	const n = 600
	for range n {
		resp, _ := f.get(t)
		assert.Equal(t, 200, resp.StatusCode)
	}
	assert.Equal(t, before, nBad.Load(), "the tripped endpoint got requests")
	assert.Equal(t, int64(3), before)
}

// A first-available distribution passes over a backend whose endpoints
// are all out of rotation: the request that trips it is retried to the
// next backend, and the ones after it go there at once. With a single
// backend, the request waits the backend's failfast timeout and gets the
// balancer's 504, labelled FAIL_FAST.
func TestFirstAvailableFallsThrough(t *testing.T) {
	var fail, ok atomic.Int64
	fail.Store(500)
	ok.Store(200)
	var nA, nB atomic.Int64
	eps := map[string][]endpoint.Endpoint{
		"a.ns.svc.cluster.local:80": {countingEndpoint(t, "a", &fail, &nA)},
		"b.ns.svc.cluster.local:80": {countingEndpoint(t, "b", &ok, &nB)},
	}
	a, b := balancerBackend("a", "a.ns.svc.cluster.local:80"), balancerBackend("b", "b.ns.svc.cluster.local:80")
	a.Backend.Queue = policy.Queue{Capacity: 10, FailFastTimeout: 100 * time.Millisecond}
	p := httpPolicy(
		policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/"}}},
			Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{a, b}},
			Retry:    &policy.Retry{MaxRetries: 1, StatusRanges: fiveXX}},
		policy.HTTPRule{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/only-a"}}},
			Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{a}}},
	)
	p.HTTP1.FailureAccrual = consecutive(1, time.Hour)
	f := newHealthFixture(t, p, eps)

	for range 20 {
		resp, body := f.get(t)
		assert.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, "b", body)
	}
	assert.Equal(t, int64(1), nA.Load(), "backend a after its endpoint tripped")
	assert.Equal(t, int64(20), nB.Load())

	// Explain shows why: backend a is not ready, its endpoint tripped.
	x := f.r.Explain(httptest.NewRequest("GET", "http://svc.test/", nil))
	require.NotNil(t, x.Backends)
	require.Len(t, x.Backends.Backends, 2)
	ea, eb := x.Backends.Backends[0], x.Backends.Backends[1]
	assert.Equal(t, "consecutive", ea.FailureAccrual)
	require.NotNil(t, ea.Ready)
	require.NotNil(t, eb.Ready)
	assert.False(t, *ea.Ready)
	assert.True(t, *eb.Ready)
	require.Len(t, ea.Endpoints, 1)
	assert.Equal(t, "tripped", ea.Endpoints[0].State)
	require.Len(t, eb.Endpoints, 1)
	assert.Equal(t, "ready", eb.Endpoints[0].State)

	resp, err := f.client.Get("http://svc.test/only-a")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 504, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("L5d-Proxy-Error"), "fail-fast")
	assert.Equal(t, int64(1), nA.Load())
	assert.Contains(t, f.m.Scrape(t), `error="FAIL_FAST"`)
}

// A backend's penalty_peak_ewma load reaches its balancer: an endpoint
// answering 429 with Retry-After is avoided while the other takes every
// request.
func TestPolicyLoadPenalty(t *testing.T) {
	var n429, nOK atomic.Int64
	srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n429.Add(1)
		w.Header().Set("Retry-After", "60")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	var ok atomic.Int64
	ok.Store(200)
	eps := []endpoint.Endpoint{
		{Addr: netip.MustParseAddrPort(srv.Listener.Addr().String()), Weight: endpoint.DefaultWeight},
		countingEndpoint(t, "ok", &ok, &nOK),
	}
	b := balancerBackend("web", "web.ns.svc.cluster.local:80")
	b.Backend.Balancer.Penalty = &policy.LoadPenalty{Penalty: 5 * time.Second, MaxRetryAfter: time.Minute}
	f := newHealthFixture(t, httpPolicy(policy.HTTPRule{Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable,
		Backends: []policy.RouteBackend{b}}}), map[string][]endpoint.Endpoint{"web.ns.svc.cluster.local:80": eps})
	for n429.Load() == 0 {
		f.get(t)
	}
	for range 100 {
		resp, _ := f.get(t)
		assert.Equal(t, 200, resp.StatusCode)
	}
	assert.Equal(t, int64(1), n429.Load(), "the endpoint that asked to be left alone")
}

// TestRandomAvailableFollowsAvailability holds the cases of
// linkerd2-proxy's linkerd/distribute/src/service.rs tests
// random_available_follows_weight and random_available_follows_availability:
// a random-available distribution picks by weight among the backends that
// may take a request, so a heavy backend whose endpoints are all out of
// rotation is passed over for a light one that is ready.
func TestRandomAvailableFollowsAvailability(t *testing.T) {
	var fail, ok atomic.Int64
	fail.Store(500)
	ok.Store(200)
	var nMulder, nScully, nSkinner atomic.Int64
	auth := func(n string) string { return n + ".ns.svc.cluster.local:80" }
	eps := map[string][]endpoint.Endpoint{
		auth("mulder"):  {countingEndpoint(t, "mulder", &ok, &nMulder)},
		auth("scully"):  {countingEndpoint(t, "scully", &fail, &nScully)},
		auth("skinner"): {countingEndpoint(t, "skinner", &ok, &nSkinner)},
	}
	mulder, scully, skinner := balancerBackend("mulder", auth("mulder")), balancerBackend("scully", auth("scully")), balancerBackend("skinner", auth("skinner"))
	mulder.Weight, scully.Weight, skinner.Weight = 1, 99998, 1
	p := httpPolicy(policy.HTTPRule{Backends: policy.Distribution{Kind: policy.DistributionRandomAvailable,
		Backends: []policy.RouteBackend{mulder, scully, skinner}}})
	p.HTTP1.FailureAccrual = consecutive(1, time.Hour)
	f := newHealthFixture(t, p, eps)

	// random_available_follows_weight: the heavy backend takes the
	// request while it is ready; its failure trips its only endpoint.
	resp, body := f.get(t)
	assert.Equal(t, 500, resp.StatusCode)
	assert.Equal(t, "scully", body)

	// random_available_follows_availability: with scully out of
	// rotation, mulder and skinner share every request by their weights.
	for range 100 {
		resp, body := f.get(t)
		assert.Equal(t, 200, resp.StatusCode)
		assert.Contains(t, []string{"mulder", "skinner"}, body)
	}
	assert.Equal(t, int64(1), nScully.Load(), "the backend out of rotation got requests")
	assert.Equal(t, int64(100), nMulder.Load()+nSkinner.Load())
	assert.Positive(t, nMulder.Load())
	assert.Positive(t, nSkinner.Load())
}
