package policy

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func prefix(p string) *PathMatch { return &PathMatch{Kind: PathPrefix, Value: p} }
func exact(p string) *PathMatch  { return &PathMatch{Kind: PathExact, Value: p} }
func regex(p string) *PathMatch  { return &PathMatch{Kind: PathRegex, Value: p} }

// route is a one-rule route with the given matches.
func route(matches ...HTTPRouteMatch) HTTPRoute {
	return HTTPRoute{Rules: []HTTPRule{{Matches: matches}}}
}

func withHosts(r HTTPRoute, hosts ...string) HTTPRoute {
	for _, h := range hosts {
		r.Hosts = append(r.Hosts, ParseHostMatch(h))
	}
	return r
}

// newReq builds a request for target (a URL); hdrs are name, value pairs.
func newReq(method, target string, hdrs ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(hdrs); i += 2 {
		if http.CanonicalHeaderKey(hdrs[i]) == "Host" {
			r.Host = hdrs[i+1]
			continue
		}
		r.Header.Add(hdrs[i], hdrs[i+1])
	}
	return r
}

func compileHTTP(t testing.TB, routes ...HTTPRoute) *RouteTable {
	t.Helper()
	rt, err := CompileHTTP(Metadata{}, HTTPProtocol{Routes: routes}, Options{}, "http1")
	require.NoError(t, err)
	return rt
}

func TestBestMatchHTTP(t *testing.T) {
	get := "GET"
	tests := []struct {
		name      string
		routes    []HTTPRoute
		req       *http.Request
		wantRoute int // -1: no route
		wantRule  int
		wantMatch int
	}{
		// Paths: compared by matched length; at equal length an exact path wins.
		{"exact longer than prefix wins", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/foo")}), route(HTTPRouteMatch{Path: exact("/foo/bar")})}, newReq(get, "/foo/bar"), 1, 0, 0},
		{"longer prefix wins over earlier shorter prefix", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/foo")}), route(HTTPRouteMatch{Path: prefix("/foo/bar")})}, newReq(get, "/foo/bar/baz"), 1, 0, 0},
		{"exact beats a prefix of equal length, later", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/foo/bar")}), route(HTTPRouteMatch{Path: exact("/foo/bar")})}, newReq(get, "/foo/bar"), 1, 0, 0},
		{"exact beats a prefix of equal length, earlier", []HTTPRoute{route(HTTPRouteMatch{Path: exact("/foo/bar")}), route(HTTPRouteMatch{Path: prefix("/foo/bar")})}, newReq(get, "/foo/bar"), 0, 0, 0},
		{"regex counts the whole path, beating a shorter prefix", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/foo/bar")}), route(HTTPRouteMatch{Path: regex("/foo/.*")})}, newReq(get, "/foo/bar/baz"), 1, 0, 0},
		{"exact beats a regex matching the same path", []HTTPRoute{route(HTTPRouteMatch{Path: regex("/foo/[a-z]+")}), route(HTTPRouteMatch{Path: exact("/foo/bar")})}, newReq(get, "/foo/bar"), 1, 0, 0},
		{"prefix equal to the whole path ties with a regex: earlier prefix", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/a/b")}), route(HTTPRouteMatch{Path: regex("/a/.*")})}, newReq(get, "/a/b"), 0, 0, 0},
		{"regex beats a prefix shorter than the path even when later", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/a")}), route(HTTPRouteMatch{Path: regex("/a/.*")})}, newReq(get, "/a/b"), 1, 0, 0},
		{"regex must match the whole path", []HTTPRoute{route(HTTPRouteMatch{Path: regex("/foo")})}, newReq(get, "/foo/bar"), -1, 0, 0},
		{"regex whole match is the preferred match, as Linkerd", []HTTPRoute{route(HTTPRouteMatch{Path: regex("/a|/ab")})}, newReq(get, "/ab"), -1, 0, 0},
		{"regex alternation in preferred order matches", []HTTPRoute{route(HTTPRouteMatch{Path: regex("/ab|/a")})}, newReq(get, "/ab"), 0, 0, 0},
		{"regex is not a prefix match", []HTTPRoute{route(HTTPRouteMatch{Path: regex("/[a-z]+")})}, newReq(get, "/x/abc"), -1, 0, 0},

		// Segment-aware prefixes.
		{"prefix does not match a longer segment", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/foo")})}, newReq(get, "/foobar"), -1, 0, 0},
		{"prefix matches itself", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/foo")})}, newReq(get, "/foo"), 0, 0, 0},
		{"prefix matches itself with a trailing slash", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/foo")})}, newReq(get, "/foo/"), 0, 0, 0},
		{"prefix matches a sub-path", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/foo")})}, newReq(get, "/foo/x/y"), 0, 0, 0},
		{"trailing slash of a prefix is ignored", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/foo/")})}, newReq(get, "/foo"), 0, 0, 0},
		{"prefix with and without trailing slash tie", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/foo/")}), route(HTTPRouteMatch{Path: prefix("/foo")})}, newReq(get, "/foo/x"), 0, 0, 0},
		{"prefix / matches everything", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/")})}, newReq(get, "/anything?x=1"), 0, 0, 0},
		{"exact path is not segment-aware", []HTTPRoute{route(HTTPRouteMatch{Path: exact("/foo")})}, newReq(get, "/foo/"), -1, 0, 0},

		// Paths are matched as a net/http handler reads them: decoded, so
		// that a percent-encoded letter or sub-delimiter selects the route
		// of the path the application serves for it.
		{"an encoded letter matches the decoded prefix", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/")}), route(HTTPRouteMatch{Path: prefix("/admin")})}, newReq(get, "/%61dmin/secret"), 1, 0, 0},
		{"every letter encoded, lower and upper case hex", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/")}), route(HTTPRouteMatch{Path: prefix("/admin")})}, newReq(get, "/%61%64%6D%69%6e/secret"), 1, 0, 0},
		{"an encoded letter matches the decoded exact path", []HTTPRoute{route(HTTPRouteMatch{Path: exact("/admin")})}, newReq(get, "/adm%69n"), 0, 0, 0},
		{"an encoded sub-delimiter matches the decoded path", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/")}), route(HTTPRouteMatch{Path: exact("/a+b")})}, newReq(get, "/a%2Bb"), 1, 0, 0},
		{"a regex sees the decoded path", []HTTPRoute{route(HTTPRouteMatch{Path: regex("/admin/[a-z]+")})}, newReq(get, "/%61dmin/secret"), 0, 0, 0},
		{"a value written encoded matches the decoded request", []HTTPRoute{route(HTTPRouteMatch{Path: exact("/a%20b")})}, newReq(get, "/a%20b"), 0, 0, 0},
		{"an encoded space in a prefix value", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/my%20files")})}, newReq(get, "/my%20files/x"), 0, 0, 0},

		// The empty match.
		{"a rule with no matches matches everything", []HTTPRoute{{Rules: []HTTPRule{{}}}}, newReq("DELETE", "/x/y"), 0, 0, -1},
		{"no matches ties with prefix /: earlier rule", []HTTPRoute{{Rules: []HTTPRule{{}, {Matches: []HTTPRouteMatch{{Path: prefix("/")}}}}}}, newReq(get, "/x"), 0, 0, -1},
		{"a match without a path counts as prefix /", []HTTPRoute{{Rules: []HTTPRule{{Matches: []HTTPRouteMatch{{}}}, {}}}}, newReq(get, "/x"), 0, 0, 0},
		{"any longer path beats no matches", []HTTPRoute{{Rules: []HTTPRule{{}, {Matches: []HTTPRouteMatch{{Path: prefix("/x")}}}}}}, newReq(get, "/x"), 0, 1, 0},
		{"a route with no rules matches nothing", []HTTPRoute{{}}, newReq(get, "/"), -1, 0, 0},
		{"no routes", nil, newReq(get, "/"), -1, 0, 0},

		// Method, headers, query parameters, in that order after the path.
		{"more header matches win", []HTTPRoute{
			route(HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-a", Value: "1"}}}),
			route(HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-a", Value: "1"}, {Name: "x-b", Value: "2"}}}),
		}, newReq(get, "/", "x-a", "1", "x-b", "2"), 1, 0, 0},
		{"path beats header count", []HTTPRoute{
			route(HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-a", Value: "1"}, {Name: "x-b", Value: "2"}}}),
			route(HTTPRouteMatch{Path: prefix("/a")}),
		}, newReq(get, "/a", "x-a", "1", "x-b", "2"), 1, 0, 0},
		{"headers beat query params", []HTTPRoute{
			route(HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "q", Value: "1"}, {Name: "r", Value: "2"}}}),
			route(HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-a", Value: "1"}}}),
		}, newReq(get, "/?q=1&r=2", "x-a", "1"), 1, 0, 0},
		{"method beats query params", []HTTPRoute{
			route(HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "q", Value: "1"}}}),
			route(HTTPRouteMatch{Method: get}),
		}, newReq(get, "/?q=1"), 1, 0, 0},
		{"method beats headers", []HTTPRoute{
			route(HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-a", Value: "1"}, {Name: "x-b", Value: "2"}}}),
			route(HTTPRouteMatch{Method: get}),
		}, newReq(get, "/", "x-a", "1", "x-b", "2"), 1, 0, 0},
		{"method breaks a tie", []HTTPRoute{
			route(HTTPRouteMatch{Path: prefix("/")}),
			route(HTTPRouteMatch{Path: prefix("/"), Method: get}),
		}, newReq(get, "/"), 1, 0, 0},
		{"a failing condition drops the match", []HTTPRoute{
			route(HTTPRouteMatch{Path: prefix("/"), Method: "POST"}),
			route(HTTPRouteMatch{Path: prefix("/"), Headers: []HeaderMatch{{Name: "x-a", Value: "2"}}}),
			route(HTTPRouteMatch{Path: prefix("/")}),
		}, newReq(get, "/", "x-a", "1"), 2, 0, 0},
		{"the best match of a rule counts", []HTTPRoute{
			route(HTTPRouteMatch{Path: prefix("/x")}),
			route(HTTPRouteMatch{Path: prefix("/")}, HTTPRouteMatch{Path: exact("/x/y")}),
		}, newReq(get, "/x/y"), 1, 0, 1},
		{"identical routes tie: earlier", []HTTPRoute{route(HTTPRouteMatch{Path: prefix("/a")}), route(HTTPRouteMatch{Path: prefix("/a")})}, newReq(get, "/a"), 0, 0, 0},

		// Hosts.
		{"a route with hosts beats one without, whatever the path", []HTTPRoute{
			route(HTTPRouteMatch{Path: exact("/foo/bar")}),
			withHosts(route(HTTPRouteMatch{Path: prefix("/")}), "*.com"),
		}, newReq(get, "http://a.example.com/foo/bar"), 1, 0, 0},
		{"exact host beats suffix", []HTTPRoute{
			withHosts(route(HTTPRouteMatch{Path: exact("/foo/bar")}), "*.example.com"),
			withHosts(route(), "foo.example.com"),
		}, newReq(get, "http://foo.example.com/foo/bar"), 1, 0, -1},
		{"longer suffix beats shorter", []HTTPRoute{
			withHosts(route(), "*.example.com"),
			withHosts(route(), "*.foo.example.com"),
		}, newReq(get, "http://a.foo.example.com/"), 1, 0, -1},
		{"longer exact host beats shorter exact host", []HTTPRoute{
			withHosts(route(), "a.b", "x.example.com"),
			withHosts(route(), "xy.example.com", "zz"),
		}, newReq(get, "http://xy.example.com/"), 1, 0, -1},
		{"suffix needs a label in front", []HTTPRoute{withHosts(route(), "*.example.com")}, newReq(get, "http://example.com/"), -1, 0, 0},
		{"suffix does not match inside a label", []HTTPRoute{withHosts(route(), "*.example.com")}, newReq(get, "http://aexample.com/"), -1, 0, 0},
		{"host match ignores port, case and a trailing dot", []HTTPRoute{withHosts(route(), "foo.example.com")}, newReq(get, "/", "Host", "FOO.Example.com.:8080"), 0, 0, -1},
		{"exact host with a trailing dot needs it", []HTTPRoute{withHosts(route(), "foo.example.com.")}, newReq(get, "/", "Host", "foo.example.com"), -1, 0, 0},
		{"suffix host ignores case and port", []HTTPRoute{withHosts(route(), "*.example.com")}, newReq(get, "/", "Host", "A.EXAMPLE.COM:80"), 0, 0, -1},
		{"routes for other hosts are skipped", []HTTPRoute{
			withHosts(route(HTTPRouteMatch{Path: exact("/a")}), "other.example.com"),
			route(HTTPRouteMatch{Path: prefix("/")}),
		}, newReq(get, "http://foo.example.com/a"), 1, 0, 0},
		{"a request without a host skips routes with hosts", []HTTPRoute{withHosts(route(), "*.com"), route(HTTPRouteMatch{Path: prefix("/")})}, &http.Request{Method: get, URL: mustURL("/x")}, 1, 0, 0},
		{"IPv6 literal host", []HTTPRoute{withHosts(route(), "[::1]")}, newReq(get, "/", "Host", "[::1]:80"), 0, 0, -1},

		// The request as sent, as Linkerd matches it (linkerd2-proxy
		// linkerd/http/route/src/http/match.rs: req.method(), the path of
		// the request's URI): net/http sends an empty Method as GET and
		// an empty path as "/".
		{"an empty method is sent as GET", []HTTPRoute{route(HTTPRouteMatch{Method: get})}, &http.Request{URL: mustURL("/x")}, 0, 0, 0},
		{"an empty method is not POST", []HTTPRoute{route(HTTPRouteMatch{Method: "POST"})}, &http.Request{URL: mustURL("/x")}, -1, 0, 0},
		{"an empty method breaks a tie as GET", []HTTPRoute{
			route(HTTPRouteMatch{Path: prefix("/")}),
			route(HTTPRouteMatch{Path: prefix("/"), Method: get}),
		}, &http.Request{URL: mustURL("/")}, 1, 0, 0},
		{"an empty path is sent as /", []HTTPRoute{route(HTTPRouteMatch{Path: exact("/")})}, &http.Request{Method: get, URL: mustURL("http://books.default.svc.cluster.local:7000")}, 0, 0, 0},
		{"an empty path and method", []HTTPRoute{route(HTTPRouteMatch{Path: exact("/"), Method: get})}, &http.Request{URL: mustURL("http://books.default.svc.cluster.local:7000")}, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := compileHTTP(t, tt.routes...)
			got, m := rt.Select(tt.req)
			if tt.wantRoute < 0 {
				assert.Nil(t, got, "match %v", m)
				assert.Equal(t, -1, m.Route)
				return
			}
			require.NotNil(t, got)
			assert.Equal(t, tt.wantRoute, m.Route, "route; match %v", m)
			assert.Equal(t, tt.wantRule, m.Rule, "rule; match %v", m)
			assert.Equal(t, tt.wantMatch, m.Match, "match index; match %v", m)
			assert.Equal(t, tt.wantRoute, got.RouteIndex)
			assert.Equal(t, tt.wantRule, got.RuleIndex)
		})
	}
}

func TestMatchSummaryValues(t *testing.T) {
	rt := compileHTTP(t,
		withHosts(route(HTTPRouteMatch{Path: prefix("/foo/"), Method: "GET", Headers: []HeaderMatch{{Name: "x", Value: "1"}}, QueryParams: []QueryParamMatch{{Name: "q", Value: "2"}}}), "*.example.com"),
	)
	_, m := rt.Select(newReq("GET", "http://a.example.com/foo/bar?q=2", "x", "1"))
	assert.Equal(t, Match{Route: 0, Rule: 0, Match: 0, Host: HostSuffix, HostLen: len(".example.com"), Path: PathPrefix, PathLen: 4, Headers: 1, QueryParams: 1, Method: true}, m)
	assert.Equal(t, "route 0 rule 0 match 0: host suffix(12) path prefix(4) method headers 1 query 1", m.String())

	rt = compileHTTP(t, route(HTTPRouteMatch{Path: regex("/foo/.*")}), route(HTTPRouteMatch{Path: exact("/foo/b")}))
	_, m = rt.Select(newReq("GET", "/foo/bar"))
	assert.Equal(t, PathRegex, m.Path)
	assert.Equal(t, len("/foo/bar"), m.PathLen)
	_, m = rt.Select(newReq("GET", "/foo/b"))
	assert.Equal(t, 1, m.Route, "regex and exact both 6 bytes: the exact path")
}

func TestHeaderAndQueryMatching(t *testing.T) {
	tests := []struct {
		name  string
		match HTTPRouteMatch
		req   *http.Request
		want  bool
	}{
		{"header name is case-insensitive", HTTPRouteMatch{Headers: []HeaderMatch{{Name: "X-Env", Value: "prod"}}}, newReq("GET", "/", "x-env", "prod"), true},
		{"header value is case-sensitive", HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-env", Value: "prod"}}}, newReq("GET", "/", "x-env", "PROD"), false},
		{"any value of a repeated header", HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-env", Value: "b"}}}, newReq("GET", "/", "x-env", "a", "x-env", "b"), true},
		{"header values are not split at commas", HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-env", Value: "b"}}}, newReq("GET", "/", "x-env", "a, b"), false},
		{"missing header", HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-env", Value: ""}}}, newReq("GET", "/"), false},
		{"empty header value", HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-env", Value: ""}}}, newReq("GET", "/", "x-env", ""), true},
		{"header regex matches whole value", HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-v", Value: "v[0-9]+", Regex: true}}}, newReq("GET", "/", "x-v", "v12"), true},
		{"header regex partial is no match", HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-v", Value: "v[0-9]", Regex: true}}}, newReq("GET", "/", "x-v", "v12"), false},
		{"header regex skips non-ASCII values", HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-v", Value: ".*", Regex: true}}}, newReq("GET", "/", "x-v", "caf\xc3\xa9"), false},
		{"Host header is the request host", HTTPRouteMatch{Headers: []HeaderMatch{{Name: "host", Value: "a.example:80"}}}, newReq("GET", "/", "Host", "a.example:80"), true},
		{"query exact", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a", Value: "1"}}}, newReq("GET", "/?b=2&a=1"), true},
		{"query value differs", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a", Value: "1"}}}, newReq("GET", "/?a=2"), false},
		{"query any of repeated params", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a", Value: "1"}}}, newReq("GET", "/?a=2&a=1"), true},
		{"query param without value is empty", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a", Value: ""}}}, newReq("GET", "/?a"), true},
		{"query form decoding: plus is space", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a b", Value: "c d"}}}, newReq("GET", "/?a+b=c%20d"), true},
		{"query form decoding: percent", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a", Value: "x/y"}}}, newReq("GET", "/?a=x%2Fy"), true},
		{"query bad percent stays", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a", Value: "%zz"}}}, newReq("GET", "/?a=%zz"), true},
		{"query invalid UTF-8 becomes U+FFFD", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a", Value: "x\uFFFDy"}}}, newReq("GET", "/?a=x%E2%82y"), true},
		{"query regex whole decoded value", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a", Value: "bar/.+", Regex: true}}}, newReq("GET", "/?a=bar%2Fhi"), true},
		{"query regex partial is no match", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a", Value: "bar", Regex: true}}}, newReq("GET", "/?a=barro"), false},
		{"no query", HTTPRouteMatch{QueryParams: []QueryParamMatch{{Name: "a", Value: ".*", Regex: true}}}, newReq("GET", "/"), false},
		{"all conditions must hold", HTTPRouteMatch{Method: "GET", Path: prefix("/a"), QueryParams: []QueryParamMatch{{Name: "q", Value: "1"}}}, newReq("GET", "/a?q=2"), false},
		{"method is case-sensitive", HTTPRouteMatch{Method: "GET"}, newReq("get", "/"), false},
		{"unregistered method", HTTPRouteMatch{Method: "PURGE"}, newReq("PURGE", "/"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := compileHTTP(t, route(tt.match))
			got, _ := rt.Select(tt.req)
			assert.Equal(t, tt.want, got != nil)
		})
	}
}

func grpcRoute(matches ...GRPCRouteMatch) GRPCRoute {
	return GRPCRoute{Rules: []GRPCRule{{Matches: matches}}}
}

func TestBestMatchGRPC(t *testing.T) {
	post := func(path string, hdrs ...string) *http.Request { return newReq("POST", path, hdrs...) }
	tests := []struct {
		name      string
		routes    []GRPCRoute
		req       *http.Request
		wantRoute int
		wantMatch int
	}{
		{"service and method beat service only", []GRPCRoute{grpcRoute(GRPCRouteMatch{Service: "pkg.S"}), grpcRoute(GRPCRouteMatch{Service: "pkg.S", Method: "M"})}, post("/pkg.S/M"), 1, 0},
		{"service only beats method only", []GRPCRoute{grpcRoute(GRPCRouteMatch{Method: "Method"}), grpcRoute(GRPCRouteMatch{Service: "pkg.S"})}, post("/pkg.S/Method"), 1, 0},
		{"longer service wins", []GRPCRoute{grpcRoute(GRPCRouteMatch{}), grpcRoute(GRPCRouteMatch{Service: "pkg.S"})}, post("/pkg.S/M"), 1, 0},
		{"empty rpc matches any call", []GRPCRoute{grpcRoute(GRPCRouteMatch{})}, post("/a.B/C"), 0, 0},
		{"service mismatch", []GRPCRoute{grpcRoute(GRPCRouteMatch{Service: "pkg.S"})}, post("/pkg.T/M"), -1, 0},
		{"method mismatch", []GRPCRoute{grpcRoute(GRPCRouteMatch{Service: "pkg.S", Method: "M"})}, post("/pkg.S/N"), -1, 0},
		{"names are case-sensitive", []GRPCRoute{grpcRoute(GRPCRouteMatch{Service: "pkg.S"})}, post("/pkg.s/M"), -1, 0},
		{"a path without a method matches no rpc", []GRPCRoute{grpcRoute(GRPCRouteMatch{Service: "pkg.S"})}, post("/pkg.S"), -1, 0},
		{"extra path segments are ignored", []GRPCRoute{grpcRoute(GRPCRouteMatch{Service: "pkg.S", Method: "M"})}, post("/pkg.S/M/x"), 0, 0},
		{"only POST is a call", []GRPCRoute{grpcRoute(GRPCRouteMatch{})}, newReq("GET", "/pkg.S/M"), -1, 0},
		{"a rule with no matches matches any request", []GRPCRoute{{Rules: []GRPCRule{{}}}}, newReq("GET", "/x"), 0, -1},
		{"rpc before headers", []GRPCRoute{
			grpcRoute(GRPCRouteMatch{Headers: []HeaderMatch{{Name: "x-a", Value: "1"}, {Name: "x-b", Value: "2"}}}),
			grpcRoute(GRPCRouteMatch{Method: "M"}),
		}, post("/pkg.S/M", "x-a", "1", "x-b", "2"), 1, 0},
		{"more headers break an rpc tie", []GRPCRoute{
			grpcRoute(GRPCRouteMatch{Service: "pkg.S"}),
			grpcRoute(GRPCRouteMatch{Service: "pkg.S", Headers: []HeaderMatch{{Name: "x-a", Value: "1"}}}),
		}, post("/pkg.S/M", "x-a", "1"), 1, 0},
		{"ties go to the earlier route", []GRPCRoute{grpcRoute(GRPCRouteMatch{Service: "pkg.S"}), grpcRoute(GRPCRouteMatch{Service: "pkg.S"})}, post("/pkg.S/M"), 0, 0},
		{"host before rpc", []GRPCRoute{
			grpcRoute(GRPCRouteMatch{Service: "pkg.S", Method: "M"}),
			{Hosts: []HostMatch{ParseHostMatch("svc.ns")}, Rules: []GRPCRule{{}}},
		}, post("http://svc.ns:8080/pkg.S/M"), 1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt, err := CompileGRPC(Metadata{}, GRPCProtocol{Routes: tt.routes}, Options{}, "grpc")
			require.NoError(t, err)
			got, m := rt.Select(tt.req)
			if tt.wantRoute < 0 {
				assert.Nil(t, got, "%v", m)
				return
			}
			require.NotNil(t, got, "%v", m)
			assert.True(t, got.GRPC)
			assert.Equal(t, tt.wantRoute, m.Route, "%v", m)
			assert.Equal(t, tt.wantMatch, m.Match, "%v", m)
		})
	}
}

func TestExplainRunnerUp(t *testing.T) {
	rt := compileHTTP(t,
		HTTPRoute{Meta: Metadata{Name: "a"}, Rules: []HTTPRule{{Matches: []HTTPRouteMatch{{Path: prefix("/")}}}}},
		HTTPRoute{Meta: Metadata{Name: "b"}, Rules: []HTTPRule{{Matches: []HTTPRouteMatch{{Path: prefix("/api")}}}, {Matches: []HTTPRouteMatch{{Path: exact("/api/v1")}}}}},
		HTTPRoute{Meta: Metadata{Name: "c"}, Rules: []HTTPRule{{Matches: []HTTPRouteMatch{{Path: prefix("/api"), Method: "GET"}}}}},
	)
	e := rt.Explain(newReq("GET", "/api/v1"))
	require.NotNil(t, e.Route)
	assert.Equal(t, "b", e.Route.Meta.Name)
	assert.Equal(t, 1, e.Winner.Rule)
	assert.Equal(t, PathExact, e.Winner.Path)
	require.NotNil(t, e.RunnerUp)
	assert.Equal(t, 2, e.RunnerUp.Route, "prefix /api with a method beats prefix /api alone")
	assert.Equal(t, 1, e.Winner.Compare(*e.RunnerUp))
	route, m := rt.Select(newReq("GET", "/api/v1"))
	assert.Same(t, e.Route, route)
	assert.Equal(t, e.Winner, m)

	// A tie: the runner-up is the later of the two equal matches.
	e = rt.Explain(newReq("POST", "/api/x"))
	assert.Equal(t, 1, e.Winner.Route)
	assert.Equal(t, 0, e.Winner.Rule)
	require.NotNil(t, e.RunnerUp)
	assert.Equal(t, 0, e.RunnerUp.Route)

	e = rt.Explain(newReq("GET", "/other"))
	assert.Equal(t, 0, e.Winner.Route)
	assert.Nil(t, e.RunnerUp)

	e = compileHTTP(t).Explain(newReq("GET", "/"))
	assert.Nil(t, e.Route)
	assert.Equal(t, "no match", e.Winner.String())
}

func TestTableForProtocol(t *testing.T) {
	named := func(n string) HTTPProtocol {
		return HTTPProtocol{Routes: []HTTPRoute{{Meta: Metadata{Name: n}, Rules: []HTTPRule{{}}}}}
	}
	h2 := newReq("GET", "/")
	h2.ProtoMajor = 2
	tests := []struct {
		name   string
		p      *Policy
		h1, h2 string // route names; "" none
	}{
		{"detect picks by version", &Policy{Protocol: ProtocolDetect, HTTP1: named("one"), HTTP2: named("two")}, "one", "two"},
		{"http1 only", &Policy{Protocol: ProtocolHTTP1, HTTP1: named("one"), HTTP2: named("two")}, "one", "one"},
		{"http2 only", &Policy{Protocol: ProtocolHTTP2, HTTP1: named("one"), HTTP2: named("two")}, "two", "two"},
		{"grpc", &Policy{Protocol: ProtocolGRPC, GRPC: GRPCProtocol{Routes: []GRPCRoute{{Meta: Metadata{Name: "g"}, Rules: []GRPCRule{{}}}}}}, "g", "g"},
		{"opaque has no routes", &Policy{Protocol: ProtocolOpaque, HTTP1: named("one")}, "", ""},
		{"nil policy", nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab, err := Compile(tt.p, Options{})
			require.NoError(t, err)
			for _, c := range []struct {
				r    *http.Request
				want string
			}{{newReq("GET", "/"), tt.h1}, {h2, tt.h2}} {
				r, _ := tab.Select(c.r)
				if c.want == "" {
					assert.Nil(t, r)
					continue
				}
				require.NotNil(t, r)
				assert.Equal(t, c.want, r.Meta.Name)
			}
		})
	}
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

func TestParseHostMatch(t *testing.T) {
	assert.Equal(t, HostMatch{Suffix: true, ReverseLabels: []string{"com", "example"}}, ParseHostMatch("*.example.com"))
	assert.Equal(t, HostMatch{Suffix: true, ReverseLabels: []string{"", "com", "example"}}, ParseHostMatch("*.example.com."))
	assert.Equal(t, HostMatch{Exact: "example.com"}, ParseHostMatch("example.com"))
	assert.True(t, strings.HasPrefix(HostExact.String(), "exact"))
}

func TestMatchStringGRPC(t *testing.T) {
	rt, err := CompileGRPC(Metadata{}, GRPCProtocol{Routes: []GRPCRoute{grpcRoute(GRPCRouteMatch{Service: "pkg.S", Method: "Get"})}}, Options{}, "grpc")
	require.NoError(t, err)
	_, m := rt.Select(newReq("POST", "/pkg.S/Get"))
	assert.Equal(t, "route 0 rule 0 match 0: host any rpc service(5) method(3) headers 0", m.String())
}
