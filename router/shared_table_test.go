package router

import (
	"math"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
)

// A policy whose HTTP versions share one route table (destination decodes
// Linkerd's default policies so) still gives each version's requests a
// route target of their own: their own retry budget, as with a table each.
func TestSharedHTTPTableKeepsATargetPerVersion(t *testing.T) {
	routes := []policy.HTTPRoute{{Rules: []policy.HTTPRule{{}}}}
	for _, tc := range []struct {
		name   string
		p      *policy.Policy
		shared bool
	}{
		{"one table", &policy.Policy{HTTP1: policy.HTTPProtocol{Routes: routes}, HTTP2: policy.HTTPProtocol{Routes: routes}}, true},
		{"a table each", &policy.Policy{HTTP1: policy.HTTPProtocol{Routes: routes}, HTTP2: policy.HTTPProtocol{Routes: []policy.HTTPRoute{{Rules: []policy.HTTPRule{{}}}}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(WithRetryBudget(&profiles.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, TTL: 10 * time.Second}))
			defer r.Close()
			table, err := policy.Compile(tc.p, policy.Options{})
			require.NoError(t, err)
			require.Equal(t, tc.shared, table.SharesHTTPTables())
			ps := r.build(table)
			h1 := &http.Request{ProtoMajor: 1, Header: http.Header{}}
			h2 := &http.Request{ProtoMajor: 2, Header: http.Header{}}
			r1, _ := table.Select(h1)
			r2, _ := table.Select(h2)
			require.NotNil(t, r1)
			require.NotNil(t, r2)
			t1, t2 := ps.target(r, h1, r1), ps.target(r, h2, r2)
			require.NotNil(t, t1)
			require.NotNil(t, t2)
			assert.NotSame(t, t1, t2)
			require.NotNil(t, t1.budget)
			assert.NotSame(t, t1.budget, t2.budget)
			assert.Same(t, r1, t1.route)
			assert.Same(t, r2, t2.route)
		})
	}
}

// A policy route's span attributes are built on its first traced request,
// once.
func TestRouteTraceAttrsBuiltOnFirstUse(t *testing.T) {
	r := New()
	defer r.Close()
	backends := policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{
		{Backend: policy.Backend{Meta: policy.Metadata{Kind: "Service", Name: "web"}}},
		{Backend: policy.Backend{Meta: policy.Metadata{Kind: "Service", Name: "web-canary"}}}}}
	table, err := policy.Compile(&policy.Policy{Protocol: policy.ProtocolHTTP1, HTTP1: policy.HTTPProtocol{Routes: []policy.HTTPRoute{{
		Meta: policy.Metadata{Kind: "HTTPRoute", Name: "books"}, Rules: []policy.HTTPRule{{Backends: backends}}}}}}, policy.Options{})
	require.NoError(t, err)
	ps := r.build(table)
	req := &http.Request{ProtoMajor: 1, Header: http.Header{}}
	route, _ := table.Select(req)
	require.NotNil(t, route)
	rt := ps.target(r, req, route)
	require.NotNil(t, rt)
	assert.Nil(t, rt.trace.Load())
	tr := rt.traced()
	assert.Equal(t, meshtrace.RouteAttrs("HTTPRoute", "books"), tr.route)
	assert.Equal(t, [][]attribute.KeyValue{meshtrace.BackendAttrs("web"), meshtrace.BackendAttrs("web-canary")}, tr.backends)
	assert.Same(t, tr, rt.traced())
}

// A policy's state makes the target of a route (its budget, balancer
// configuration, hedging and mirrors) on the route's first request, once
// for each HTTP version: a table's routes for the version requests do not
// use, or for a name whose requests a profile routes, cost no target.
func TestRouteTargetMadeOnFirstRequest(t *testing.T) {
	r := New(WithRetryBudget(&profiles.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, TTL: 10 * time.Second}))
	defer r.Close()
	backend := policy.Backend{Meta: policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "web", Port: 80},
		Balancer: &policy.Balancer{Authority: "web.ns.svc.cluster.local:80"}, Queue: policy.Queue{Capacity: 100, FailFastTimeout: 3 * time.Second}}
	routes := policy.HTTPProtocol{Routes: []policy.HTTPRoute{policy.DefaultHTTPRoute(backend, nil, policy.Timeouts{})}}
	table, err := policy.Compile(&policy.Policy{HTTP1: routes, HTTP2: routes}, policy.Options{})
	require.NoError(t, err)
	ps := r.build(table)
	assert.Empty(t, ps.targets.all(), "no HTTP/1 target before a request")
	assert.Empty(t, ps.h2.all(), "no HTTP/2 target before a request")

	h1 := &http.Request{ProtoMajor: 1, Header: http.Header{}}
	route, _ := table.Select(h1)
	require.NotNil(t, route)
	rt := ps.target(r, h1, route)
	require.NotNil(t, rt)
	assert.Same(t, rt, ps.target(r, h1, route), "made once")
	assert.Equal(t, []*routeTarget{rt}, ps.targets.all())
	assert.Empty(t, ps.h2.all(), "HTTP/2 has none yet")
	require.Len(t, rt.balancing, 1)
	require.NotNil(t, rt.balancing[0])
	assert.Equal(t, 100, rt.balancing[0].QueueCapacity)
	assert.NotNil(t, rt.budget)
	assert.Nil(t, ps.target(r, h1, &policy.Route{}), "a route of another table has no target")
}

// TestPolicyStateBytes bounds what the state of a compiled default policy
// costs before its first request: a proxy holds one for each of the
// thousands of names it watches, and a profile with destination overrides
// routes their requests without it.
func TestPolicyStateBytes(t *testing.T) {
	r := New()
	defer r.Close()
	backend := policy.Backend{Meta: policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "web", Port: 80},
		Balancer: &policy.Balancer{Authority: "web.ns.svc.cluster.local:80"}, Queue: policy.Queue{Capacity: 100, FailFastTimeout: 3 * time.Second}}
	routes := policy.HTTPProtocol{Routes: []policy.HTTPRoute{policy.DefaultHTTPRoute(backend, nil, policy.Timeouts{})}}
	table, err := policy.Compile(&policy.Policy{HTTP1: routes, HTTP2: routes}, policy.Options{})
	require.NoError(t, err)
	// What the builds allocate, the least of a few tries: other
	// goroutines can only add to the count, and all but a few words of
	// it is the state kept.
	const n = 2000
	perState := math.Inf(1)
	for range 3 {
		states := make([]*policyState, n)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range states {
			states[i] = r.build(table)
		}
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(states)
		perState = min(perState, float64(after.TotalAlloc-before.TotalAlloc)/n)
	}
	t.Logf("%.0f bytes a state", perState)
	assert.LessOrEqual(t, perState, 300.0)
}
