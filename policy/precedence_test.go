package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpstreamMatchPrecedence follows the Gateway API's HTTPRoute
// precedence (the HTTPRouteRule documentation of the Gateway API spec):
// the path (longer first, and an exact path above a prefix of the same
// length), then the method, then the number of header matches, then the
// number of query parameter matches. The cases are those written for that
// order on a linkerd2-proxy branch (linkerd/http/route/src/http/match/
// tests.rs, gateway_api_precedence and
// gateway_api_precedence_ties_are_equal, branch
// anthoturc/httproute-precedence). linkerd2-proxy's main line
// (linkerd/http/route/src/http/match.rs, the Ord of MatchSummary) still
// ranks the header count, then the query parameters, above the method; a
// route set that relies on the method outranking headers is decided as
// the Gateway API says here, which is a deliberate difference. Each case
// puts the higher match second, so that a tie (which goes to the earlier
// rule) fails it.
func TestUpstreamMatchPrecedence(t *testing.T) {
	hdr := func(kv ...string) []HeaderMatch {
		var out []HeaderMatch
		for i := 0; i < len(kv); i += 2 {
			out = append(out, HeaderMatch{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	qp := func(kv ...string) []QueryParamMatch {
		var out []QueryParamMatch
		for i := 0; i < len(kv); i += 2 {
			out = append(out, QueryParamMatch{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	tests := []struct {
		name          string
		higher, lower HTTPRouteMatch
		req           []string // method, target, then header pairs
	}{
		{"exact_beats_prefix_by_length",
			HTTPRouteMatch{Path: exact("/foo/bar")}, HTTPRouteMatch{Path: prefix("/foo")},
			[]string{"GET", "/foo/bar"}},
		{"path_precedence_overrides_lower_precedence_fields",
			HTTPRouteMatch{Path: exact("/foo")},
			HTTPRouteMatch{Path: prefix("/"), Method: "GET", Headers: hdr("x-a", "1", "x-b", "2"), QueryParams: qp("a", "1", "b", "2")},
			[]string{"GET", "/foo?a=1&b=2", "x-a", "1", "x-b", "2"}},
		{"longer_prefix_outranks_shorter_prefix",
			HTTPRouteMatch{Path: prefix("/foo/bar")}, HTTPRouteMatch{Path: prefix("/foo")},
			[]string{"GET", "/foo/bar/baz"}},
		{"method_match_outranks_no_method",
			HTTPRouteMatch{Path: exact("/foo"), Method: "GET"}, HTTPRouteMatch{Path: exact("/foo")},
			[]string{"GET", "/foo"}},
		{"method_precedence_overrides_headers_and_query_params",
			HTTPRouteMatch{Path: exact("/foo"), Method: "GET"},
			HTTPRouteMatch{Path: exact("/foo"), Headers: hdr("x-a", "1", "x-b", "2"), QueryParams: qp("a", "1", "b", "2")},
			[]string{"GET", "/foo?a=1&b=2", "x-a", "1", "x-b", "2"}},
		{"more_header_matches_outranks_fewer",
			HTTPRouteMatch{Path: exact("/foo"), Headers: hdr("x-foo", "bar", "x-baz", "qux")},
			HTTPRouteMatch{Path: exact("/foo"), Headers: hdr("x-foo", "bar")},
			[]string{"GET", "/foo", "x-foo", "bar", "x-baz", "qux"}},
		{"header_precedence_overrides_query_params",
			HTTPRouteMatch{Path: exact("/foo"), Headers: hdr("x-foo", "bar")},
			HTTPRouteMatch{Path: exact("/foo"), QueryParams: qp("a", "1", "b", "2")},
			[]string{"GET", "/foo?a=1&b=2", "x-foo", "bar"}},
		{"more_query_param_matches_outranks_fewer",
			HTTPRouteMatch{Path: exact("/foo"), QueryParams: qp("a", "1", "b", "2")},
			HTTPRouteMatch{Path: exact("/foo"), QueryParams: qp("a", "1")},
			[]string{"GET", "/foo?a=1&b=2"}},
		{"exact_beats_prefix_of_equal_length",
			HTTPRouteMatch{Path: exact("/foo")}, HTTPRouteMatch{Path: prefix("/foo")},
			[]string{"GET", "/foo"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, order := range []struct {
				name      string
				routes    []HTTPRoute
				wantRoute int
			}{
				{"higher later", []HTTPRoute{route(tt.lower), route(tt.higher)}, 1},
				{"higher earlier", []HTTPRoute{route(tt.higher), route(tt.lower)}, 0},
			} {
				rt := compileHTTP(t, order.routes...)
				req := newReq(tt.req[0], tt.req[1], tt.req[2:]...)
				ex := rt.Explain(req)
				require.NotNil(t, ex.Route, "%s: nothing matched", order.name)
				assert.Equal(t, order.wantRoute, ex.Winner.Route, "%s: winner %v", order.name, ex.Winner)
				require.NotNil(t, ex.RunnerUp, "%s: the lower match must match too", order.name)
				assert.Equal(t, 1, ex.Winner.Compare(*ex.RunnerUp), "%s: %v must outrank %v", order.name, ex.Winner, *ex.RunnerUp)
			}
		})
	}

	// gateway_api_precedence_ties_are_equal: the same path and as many
	// header matches are equal, whichever headers they name.
	rt := compileHTTP(t,
		route(HTTPRouteMatch{Path: exact("/foo"), Headers: hdr("x-a", "1")}),
		route(HTTPRouteMatch{Path: exact("/foo"), Headers: hdr("x-b", "2")}))
	ex := rt.Explain(newReq("GET", "/foo", "x-a", "1", "x-b", "2"))
	require.NotNil(t, ex.RunnerUp)
	assert.Equal(t, 0, ex.Winner.Compare(*ex.RunnerUp))
	assert.Equal(t, 0, ex.Winner.Route, "a tie goes to the earlier route")
}

// TestUpstreamRoutePrecedence holds the route-level cases of
// linkerd2-proxy's linkerd/http/route/src/http/tests.rs: the route that
// should win is always the later one, except where the earlier must win a
// tie.
func TestUpstreamRoutePrecedence(t *testing.T) {
	tests := []struct {
		name      string
		routes    []HTTPRoute
		req       []string
		wantRoute int
		wantRule  int
	}{
		{"hostname_precedence", []HTTPRoute{
			withHosts(route(HTTPRouteMatch{Path: exact("/foo")}), "*.example.com"),
			withHosts(route(HTTPRouteMatch{Path: exact("/foo")}), "foo.example.com"),
		}, []string{"GET", "http://foo.example.com/foo"}, 1, 0},
		{"path_length_precedence", []HTTPRoute{
			route(HTTPRouteMatch{Path: prefix("/foo")}),
			route(HTTPRouteMatch{Path: exact("/foo/bar")}),
		}, []string{"GET", "http://foo.example.com/foo/bar"}, 1, 0},
		{"header_count_precedence", []HTTPRoute{
			route(HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-foo", Value: "bar"}, {Name: "x-baz", Value: "qux"}}}),
			route(HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-foo", Value: "bar"}, {Name: "x-baz", Value: "qux"}, {Name: "x-biz", Value: "qyx"}}}),
		}, []string{"GET", "http://www.example.com", "x-foo", "bar", "x-baz", "qux", "x-biz", "qyx"}, 1, 0},
		{"first_identical_wins", []HTTPRoute{
			{Rules: []HTTPRule{{}, {}}},
			{Rules: []HTTPRule{{}}},
		}, []string{"GET", "/"}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := compileHTTP(t, tt.routes...)
			_, m := rt.Select(newReq(tt.req[0], tt.req[1], tt.req[2:]...))
			assert.Equal(t, tt.wantRoute, m.Route, "match %v", m)
			assert.Equal(t, tt.wantRule, m.Rule, "match %v", m)
		})
	}
}
