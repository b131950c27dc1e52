package router

import (
	"net/http"
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
			t1, t2 := ps.target(h1, r1), ps.target(h2, r2)
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
	require.Len(t, ps.targets.all(), 1)
	for _, rt := range ps.targets.all() {
		assert.Nil(t, rt.trace.Load())
		tr := rt.traced()
		assert.Equal(t, meshtrace.RouteAttrs("HTTPRoute", "books"), tr.route)
		assert.Equal(t, [][]attribute.KeyValue{meshtrace.BackendAttrs("web"), meshtrace.BackendAttrs("web-canary")}, tr.backends)
		assert.Same(t, tr, rt.traced())
	}
}
