package policy

import (
	"net/http"
	"testing"
)

// benchTable is a realistic table: a dozen routes with hosts, prefixes,
// exact paths, regexes, headers and query parameters.
func benchTable(tb testing.TB) *RouteTable {
	return compileHTTP(tb,
		withHosts(route(HTTPRouteMatch{Path: prefix("/")}), "*.cluster.local"),
		withHosts(route(HTTPRouteMatch{Path: prefix("/api")}, HTTPRouteMatch{Path: exact("/api/v1/books")}), "books.ns.svc.cluster.local"),
		withHosts(route(HTTPRouteMatch{Path: regex("/api/v[0-9]+/books/[0-9]+"), Method: "GET"}), "books.ns.svc.cluster.local"),
		withHosts(route(HTTPRouteMatch{Path: prefix("/api/v1"), Headers: []HeaderMatch{{Name: "x-canary", Value: "true"}}}), "books.ns.svc.cluster.local"),
		withHosts(route(HTTPRouteMatch{Path: prefix("/api/v1"), QueryParams: []QueryParamMatch{{Name: "debug", Value: "1"}}}), "books.ns.svc.cluster.local"),
		withHosts(route(HTTPRouteMatch{Headers: []HeaderMatch{{Name: "x-user", Value: "[a-z]+", Regex: true}}}), "books.ns.svc.cluster.local"),
		withHosts(route(HTTPRouteMatch{Path: prefix("/admin")}), "admin.ns.svc.cluster.local"),
		route(HTTPRouteMatch{Path: prefix("/healthz")}),
		route(HTTPRouteMatch{Path: exact("/")}),
		route(HTTPRouteMatch{Method: "POST", Path: prefix("/api/v1/books")}),
		route(),
	)
}

func benchRequest() *http.Request {
	r := newReq("GET", "http://books.ns.svc.cluster.local:8080/api/v1/books/42?debug=1&x=%41", "x-canary", "true", "x-user", "ada")
	return r
}

func BenchmarkSelect(b *testing.B) {
	t := benchTable(b)
	r := benchRequest()
	b.ReportAllocs()
	for b.Loop() {
		if rt, _ := t.Select(r); rt == nil {
			b.Fatal("no route")
		}
	}
}

func BenchmarkSelectGRPC(b *testing.B) {
	t, err := CompileGRPC(Metadata{}, GRPCProtocol{Routes: []GRPCRoute{
		grpcRoute(GRPCRouteMatch{Service: "pkg.Books"}),
		grpcRoute(GRPCRouteMatch{Service: "pkg.Books", Method: "Get", Headers: []HeaderMatch{{Name: "x-canary", Value: "true"}}}),
		{Rules: []GRPCRule{{}}},
	}}, Options{}, "grpc")
	if err != nil {
		b.Fatal(err)
	}
	r := newReq("POST", "http://books:8080/pkg.Books/Get", "x-canary", "true")
	b.ReportAllocs()
	for b.Loop() {
		if rt, _ := t.Select(r); rt == nil {
			b.Fatal("no route")
		}
	}
}

func TestSelectDoesNotAllocate(t *testing.T) {
	table := benchTable(t)
	reqs := []*http.Request{
		benchRequest(),
		newReq("GET", "http://books.ns.svc.cluster.local/api/v1/books/7"),
		newReq("POST", "http://other.example/api/v1/books/7?debug=%31+x"),
		newReq("GET", "http://admin.ns.svc.cluster.local/admin/x"),
		newReq("GET", "/nothing"),
	}
	for _, r := range reqs {
		r := r
		route, m := table.Select(r)
		if route == nil {
			t.Fatalf("%s: no route", r.URL)
		}
		if n := testing.AllocsPerRun(100, func() { table.Select(r) }); n != 0 {
			t.Errorf("Select(%s %s) allocates %v times per run (match %v)", r.Method, r.URL, n, m)
		}
	}
}
