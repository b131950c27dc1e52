package authz_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
)

var (
	srvMeta   = authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-http"}
	routeMeta = authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPRoute", Name: "books-api"}
	adminMeta = authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPRoute", Name: "books-admin"}
	apMeta    = authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "web-ap"}
	adminAP   = authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "admin-ap"}
)

func prefix(p string) []policy.HTTPRouteMatch {
	return []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: p}}}
}

// booksServer: /api admitted to web's identity by the Server's
// authorization; /admin admitted to admin's identity by its route's
// authorization, in addition to the Server's; every other path has no route.
func booksServer() *authz.Server {
	everywhere := []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}, {Net: netip.MustParsePrefix("::/0")}}
	return &authz.Server{
		Meta: srvMeta,
		Authorizations: []authz.Authz{{Meta: apMeta, Networks: everywhere,
			Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{webID}}}}},
		Routes: []authz.Route{
			{Meta: routeMeta, Rules: []authz.Rule{
				{Matches: prefix("/api"), Filters: []policy.Filter{{RequestHeaders: &policy.HeaderModifier{Set: []policy.Header{{Name: "X-Added", Value: "yes"}}}}}},
				{Matches: prefix("/old"), Filters: []policy.Filter{{Redirect: &policy.Redirect{Path: &policy.PathModifier{Full: "/api"}, Status: 302}}}},
				{Matches: prefix("/broken"), Filters: []policy.Filter{{FailureInjector: &policy.FailureInjector{Status: 503, Message: "injected"}}}},
			}},
			{Meta: adminMeta, Rules: []authz.Rule{{Matches: prefix("/admin")}},
				Authorizations: []authz.Authz{{Meta: adminAP, Networks: everywhere,
					Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Suffixes: [][]string{{"ops", "serviceaccount", "identity", "linkerd", "cluster", "local"}}}}}}},
		},
	}
}

// Route authorizations are OR-ed with the Server's and localhost's, per
// request on one connection; a request no route matches is 404; filters
// run on authorized requests (linkerd2-proxy linkerd/app/inbound/src/
// policy/http/tests.rs; policy.rs is_authorized).
func TestRoutesAndAuthorizations(t *testing.T) {
	e := newEnv(t, authz.WithSource(authz.StaticSource{}), authz.WithDefault(booksServer()))
	web, base := e.client(t, testutil.H1, remoteIP, webID)
	admin, _ := e.client(t, testutil.H1, remoteIP, adminID)
	plain, pbase := e.client(t, testutil.H1, remoteIP, "")
	lo, lbase := e.client(t, testutil.H1, netip.MustParseAddr("127.0.0.1"), "")

	r := do(t, web, "GET", base+"/api/books")
	assert.Equal(t, 200, r.status)
	assert.Equal(t, "yes", r.hdr.Get("X-Seen-Header"), "the header modifier applies before the application")
	assert.Equal(t, 200, do(t, web, "GET", base+"/admin").status, "the Server's authorizations cover every route")
	assert.Equal(t, 200, do(t, admin, "GET", base+"/admin").status, "the route's authorization by suffix")
	assert.Equal(t, 403, do(t, admin, "GET", base+"/api").status, "a route's authorization admits to its route only")
	assert.Equal(t, 403, do(t, plain, "GET", pbase+"/admin").status)
	assert.Equal(t, 200, do(t, lo, "GET", lbase+"/admin").status, "the pod's own loopback is always admitted")

	r = do(t, web, "GET", base+"/nothing")
	assert.Equal(t, 404, r.status)
	assert.Empty(t, r.hdr.Get("X-App"))
	r = do(t, web, "GET", base+"/old/x?q=1")
	assert.Equal(t, 302, r.status)
	assert.Equal(t, "http://"+strings.TrimPrefix(base, "https://")+"/api", r.hdr.Get("Location"))
	r = do(t, web, "GET", base+"/broken")
	assert.Equal(t, 503, r.status)
	assert.Contains(t, r.hdr.Get("L5d-Proxy-Error"), ": injected")
	assert.Equal(t, 403, do(t, plain, "GET", pbase+"/broken").status, "filters run only for authorized requests")
}

// Denials are answered by the mesh: empty bodies; l5d-proxy-error only to
// meshed clients, worded as Linkerd's proxy words it; gRPC requests get a
// trailers-only gRPC status (linkerd2-proxy linkerd/app/core/src/errors/
// respond.rs; linkerd/app/inbound/src/http/tests.rs
// http1_bad_gateway_meshed_response_error_header and
// http1_bad_gateway_unmeshed_response).
func TestRefusals(t *testing.T) {
	e := newEnv(t, authz.WithDefault(booksServer()))
	web, base := e.client(t, testutil.H1, remoteIP, webID)
	notMeshed, _ := e.client(t, testutil.H1, remoteIP, "-")
	plain, pbase := e.client(t, testutil.H1, remoteIP, "")

	r := do(t, web, "GET", base+"/nothing")
	assert.Equal(t, 404, r.status)
	assert.Regexp(t, `^client 127\.0\.0\.2:\d+: server: 127\.0\.0\.1:\d+: no route found for request$`, r.hdr.Get("L5d-Proxy-Error"))
	assert.Equal(t, "0", r.hdr.Get("Content-Length"))

	r = do(t, notMeshed, "GET", base+"/api")
	assert.Equal(t, 403, r.status)
	assert.Empty(t, r.hdr.Get("L5d-Proxy-Error"), "TLS without an identity is not meshed")
	r = do(t, plain, "GET", pbase+"/api")
	assert.Equal(t, 403, r.status)
	assert.Empty(t, r.hdr.Get("L5d-Proxy-Error"))
	assert.Empty(t, r.body)

	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		c, base := e.client(t, mode, remoteIP, "")
		for path, code := range map[string]string{"/api": "7", "/nothing": "5"} {
			r := do(t, c, "POST", base+path, "Content-Type", "application/grpc")
			assert.Equal(t, 200, r.status, path)
			assert.Equal(t, code, r.hdr.Get("Grpc-Status"), path)
			assert.Equal(t, "application/grpc", r.hdr.Get("Content-Type"), path)
			assert.Empty(t, r.hdr.Get("Grpc-Message"), "%s: no reason to an unmeshed client", path)
		}
	})
}

// Linkerd's metric families, series by series, with Linkerd's label values
// (linkerd2-proxy linkerd/app/inbound/src/metrics/authz.rs; inbound.md 4).
func TestMetrics(t *testing.T) {
	m := testutil.NewMetrics(t)
	now := time.Unix(1000, 0)
	srv := booksServer()
	srv.RateLimit = &authz.RateLimit{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPLocalRateLimitPolicy", Name: "books-rl"}, Total: 2}
	e := newEnv(t, authz.WithDefault(srv), authz.WithMeterProvider(m.Provider), authz.WithClock(func() time.Time { return now }))
	web, base := e.client(t, testutil.H1, remoteIP, webID)
	plain, pbase := e.client(t, testutil.H1, remoteIP, "")
	assert.Equal(t, 200, do(t, web, "GET", base+"/api").status)
	assert.Equal(t, 200, do(t, web, "GET", base+"/api").status)
	r := do(t, web, "GET", base+"/api")
	assert.Equal(t, 429, r.status)
	assert.Contains(t, r.hdr.Get("L5d-Proxy-Error"), ": total rate limit exceeded: 2rps")
	assert.Equal(t, 403, do(t, plain, "GET", pbase+"/api").status)
	assert.Equal(t, 404, do(t, plain, "GET", pbase+"/none").status)

	tlsPort := base[strings.LastIndexByte(base, ':')+1:]
	plainPort := pbase[strings.LastIndexByte(pbase, ':')+1:]
	target := func(port string) string {
		return `target_addr="127.0.0.1:` + port + `",target_ip="127.0.0.1",target_port="` + port + `"`
	}
	srvL := func(port string) string {
		return `srv_group="policy.linkerd.io",srv_kind="server",srv_name="books-http",srv_port="` + port + `"`
	}
	meshedTLS := `,tls="true"`
	want := []string{
		`inbound_http_authz_allow_total{authz_group="policy.linkerd.io",authz_kind="authorizationpolicy",authz_name="web-ap",client_id="` + webID + `",route_group="policy.linkerd.io",route_kind="HTTPRoute",route_name="books-api",` + srvL(tlsPort) + `,` + target(tlsPort) + meshedTLS + `} 3`,
		`inbound_http_authz_deny_total{no_tls_reason="loopback",route_group="policy.linkerd.io",route_kind="HTTPRoute",route_name="books-api",` + srvL(plainPort) + `,` + target(plainPort) + `,tls="no_identity"} 1`,
		`inbound_http_route_not_found_total{no_tls_reason="loopback",` + srvL(plainPort) + `,` + target(plainPort) + `,tls="no_identity"} 1`,
		`inbound_http_local_ratelimit_total{client_id="` + webID + `",ratelimit_group="policy.linkerd.io",ratelimit_kind="HTTPLocalRateLimitPolicy",ratelimit_name="books-rl",ratelimit_scope="total",` + srvL(tlsPort) + `,` + target(tlsPort) + meshedTLS + `} 1`,
	}
	scraped := m.Scrape(t)
	for _, w := range want {
		assert.Contains(t, scraped, w+"\n")
	}
	for _, fam := range []string{"inbound_http_authz_allow_total", "inbound_http_authz_deny_total", "inbound_http_route_not_found_total", "inbound_http_local_ratelimit_total"} {
		assert.Len(t, m.Lines(t, fam), 1, fam)
	}
}

// Rate limits in the handler, with the clock in the test's hands: the
// identity limit per client, a shared bucket for clients without an
// identity, scope identity for both per-identity and override refusals,
// and full buckets again a second later.
func TestRateLimitHandler(t *testing.T) {
	m := testutil.NewMetrics(t)
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	srv := mustDefault(t, authz.AllUnauthenticated, authz.DefaultOptions{})
	srv.RateLimit = &authz.RateLimit{Identity: 1, Overrides: []authz.Override{{RPS: 2, Identities: []string{adminID}}}}
	e := newEnv(t, authz.WithDefault(srv), authz.WithMeterProvider(m.Provider), authz.WithClock(clock))
	web, base := e.client(t, testutil.H1, remoteIP, webID)
	admin, _ := e.client(t, testutil.H1, remoteIP, adminID)
	plain, pbase := e.client(t, testutil.H1, remoteIP, "")
	anon, _ := e.client(t, testutil.H1, remoteIP, "-")

	assert.Equal(t, 200, do(t, web, "GET", base+"/").status)
	r := do(t, web, "GET", base+"/")
	assert.Equal(t, 429, r.status)
	assert.Contains(t, r.hdr.Get("L5d-Proxy-Error"), ": per-identity rate limit exceeded: 1rps")
	assert.Equal(t, 200, do(t, admin, "GET", base+"/").status)
	assert.Equal(t, 200, do(t, admin, "GET", base+"/").status, "the override replaces the identity limit")
	r = do(t, admin, "GET", base+"/")
	assert.Equal(t, 429, r.status)
	assert.Contains(t, r.hdr.Get("L5d-Proxy-Error"), ": override rate limit exceeded: 2rps")
	assert.Equal(t, 200, do(t, plain, "GET", pbase+"/").status)
	assert.Equal(t, 429, do(t, anon, "GET", base+"/").status, "clients without an identity share one bucket")

	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	assert.Equal(t, 200, do(t, web, "GET", base+"/").status)
	assert.Equal(t, "1", m.Value(t, "inbound_http_local_ratelimit_total", `client_id="`+adminID+`"`, `ratelimit_scope="identity"`),
		"an override's refusal reports scope identity")
	assert.Equal(t, "1", m.Value(t, "inbound_http_local_ratelimit_total", `client_id=""`, `ratelimit_scope="identity"`, `tls="true"`))
	assert.Equal(t, "1", m.Value(t, "inbound_http_local_ratelimit_total", `client_id="`+webID+`"`, `ratelimit_scope="identity"`))
	for _, l := range m.Lines(t, "inbound_http_local_ratelimit_total") {
		assert.NotContains(t, l, "ratelimit_name", "a limit without metadata prints no ratelimit_* names")
	}
}

// The Server's in-flight limit answers 503 at once past it, and the slot
// frees when the request ends.
func TestConcurrencyLimit(t *testing.T) {
	m := testutil.NewMetrics(t)
	srv := mustDefault(t, authz.AllUnauthenticated, authz.DefaultOptions{})
	srv.MaxConcurrentRequests = 1
	e := newEnv(t, authz.WithDefault(srv), authz.WithMeterProvider(m.Provider))
	e.reached, e.release = make(chan struct{}), make(chan struct{})
	c, base := e.client(t, testutil.H2C, remoteIP, "")
	done := make(chan result)
	go func() { done <- do(t, c, "GET", base+"/block") }()
	<-e.reached
	assert.Equal(t, 503, do(t, c, "GET", base+"/other").status)
	close(e.release)
	assert.Equal(t, 200, (<-done).status)
	assert.Equal(t, 200, do(t, c, "GET", base+"/other").status)
	assert.Equal(t, "1", m.Value(t, "inbound_http_concurrency_limit_total", `srv_name="all-unauthenticated"`))
}

// chanSource delivers the Servers a test sends.
type chanSource struct {
	mu     sync.Mutex
	update map[uint16]func(*authz.Server)
}

func (s *chanSource) Watch(port uint16, update func(*authz.Server)) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.update == nil {
		s.update = map[uint16]func(*authz.Server){}
	}
	s.update[port] = update
	return func() {}
}

func (s *chanSource) send(t *testing.T, port uint16, srv *authz.Server) {
	s.mu.Lock()
	u := s.update[port]
	s.mu.Unlock()
	require.NotNil(t, u)
	u(srv)
}

// The default applies until the first Server arrives (never a wait); each
// update applies to the next request on the same connection; a Server
// that does not compile is logged and refuses every request (the invalid
// Server) until a valid one comes.
func TestPolicyUpdates(t *testing.T) {
	src := &chanSource{}
	var logs bytes.Buffer
	e := newEnv(t, authz.WithSource(src), authz.WithDefault(mustDefault(t, authz.Deny, authz.DefaultOptions{})),
		authz.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	c, base := e.client(t, testutil.H1, remoteIP, "")
	assert.Equal(t, 403, do(t, c, "GET", base+"/").status)
	port := uint16(mustPort(t, base))
	src.send(t, port, mustDefault(t, authz.AllUnauthenticated, authz.DefaultOptions{}))
	assert.Equal(t, 200, do(t, c, "GET", base+"/").status)
	// A Server that does not compile closes the port, as Linkerd's proxy's
	// invalid policy does, until a valid one comes.
	src.send(t, port, &authz.Server{Authorizations: []authz.Authz{{}}})
	assert.Equal(t, 403, do(t, c, "GET", base+"/").status, "the invalid Server")
	assert.Contains(t, logs.String(), "authorizations[0].networks: at least one network is required")
	assert.Same(t, authz.InvalidServer(), e.h.Policy(port).Server())
	src.send(t, port, mustDefault(t, authz.AllUnauthenticated, authz.DefaultOptions{}))
	assert.Equal(t, 200, do(t, c, "GET", base+"/").status)
}

func mustPort(t *testing.T, base string) int {
	ap, err := netip.ParseAddrPort(base[strings.Index(base, "//")+2:])
	require.NoError(t, err)
	return int(ap.Port())
}

// Audit admits every request and logs it (linkerd2#8821): the authz is
// Default("audit"); the log is rate-limited.
func TestAudit(t *testing.T) {
	var logs bytes.Buffer
	e := newEnv(t, authz.WithDefault(mustDefault(t, authz.Audit, authz.DefaultOptions{})),
		authz.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	c, base := e.client(t, testutil.H1, remoteIP, "")
	for range 3 {
		assert.Equal(t, 200, do(t, c, "GET", base+"/").status)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "Request allowed"), logs.String())
	assert.Contains(t, logs.String(), "authz=audit")
}

// Allowing costs no allocation (with metrics recorded through the SDK).
func TestAllowAllocs(t *testing.T) {
	m := testutil.NewMetrics(t)
	srv := booksServer()
	srv.RateLimit = &authz.RateLimit{Total: 1 << 30, Identity: 1 << 30}
	srv.MaxConcurrentRequests = 10
	h, err := authz.New(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		authz.WithDefault(srv), authz.WithMeterProvider(m.Provider), authz.WithLogger(quiet))
	require.NoError(t, err)
	defer h.Close()
	req := allowedRequest(t)
	w := &nopWriter{h: http.Header{}}
	h.ServeHTTP(w, req)
	require.Equal(t, 0, w.code, "allowed")
	assert.Zero(t, testing.AllocsPerRun(100, func() { h.ServeHTTP(w, req) }))
}

type nopWriter struct {
	h    http.Header
	code int
}

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(c int)           { w.code = c }

// A path is authorized as the application reads it: dot-segments and
// encoded '/' or '.' are refused with 400, so that "/admin/../api" is not
// admitted by the admin route and then served as /api.
func TestAmbiguousPaths(t *testing.T) {
	e := newEnv(t, authz.WithDefault(booksServer()))
	admin, base := e.client(t, testutil.H1, remoteIP, adminID)
	require.Equal(t, 200, do(t, admin, "GET", base+"/admin/x").status)
	for _, p := range []string{"/admin/../api", "/admin/./x", "/admin/%2e%2e/api", "/admin%2Fx", "/admin/.."} {
		req, err := http.NewRequest("GET", base+"/", nil)
		require.NoError(t, err)
		req.URL.Opaque = p // sent as written
		resp, err := admin.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 400, resp.StatusCode, p)
		assert.Empty(t, resp.Header.Get("X-App"), p)
	}
	assert.Equal(t, 200, do(t, admin, "GET", base+"/admin/.hidden/x..y").status, "dots inside a segment are fine")
}

// A Server without routes has one match-all "default" route
// (linkerd2-proxy linkerd/proxy/server-policy/src/lib.rs mk_routes); an
// opaque Server has no HTTP routes at all: 404.
func TestServerWithoutRoutes(t *testing.T) {
	m := testutil.NewMetrics(t)
	src := &chanSource{}
	e := newEnv(t, authz.WithSource(src), authz.WithMeterProvider(m.Provider),
		authz.WithDefault(&authz.Server{Meta: srvMeta, Authorizations: []authz.Authz{{Meta: apMeta,
			Networks: []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}}}}}))
	c, base := e.client(t, testutil.H1, remoteIP, "")
	assert.Equal(t, 200, do(t, c, "GET", base+"/any/path").status)
	assert.Equal(t, "1", m.Value(t, "inbound_http_authz_allow_total", `route_kind="default"`, `route_name="default"`, `route_group=""`, `authz_name="web-ap"`))
	src.send(t, uint16(mustPort(t, base)), &authz.Server{Meta: srvMeta, Protocol: authz.ProtocolOpaque})
	assert.Equal(t, 404, do(t, c, "GET", base+"/any/path").status)
}

// Without the identity layer in front (no peer in the context) the tls
// label says "disabled"; a meshed client's client_id is its verified
// identity.
func TestTLSLabels(t *testing.T) {
	m := testutil.NewMetrics(t)
	h, err := authz.New(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		authz.WithMeterProvider(m.Provider), authz.WithLogger(quiet))
	require.NoError(t, err)
	defer h.Close()
	base := testutil.NewServer(t, h).URL
	c := &http.Client{Transport: testutil.NewTransport(t, testutil.H1)}
	resp, err := c.Get(base + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "1", m.Value(t, "inbound_http_authz_allow_total", `tls="disabled"`, `srv_kind="default"`,
		`srv_name="all-unauthenticated"`, `authz_name="all-unauthenticated"`, `route_name="default"`))
	assert.NotContains(t, m.Scrape(t), "client_id")
}

// A gRPC Server's routes match rpcs by service and method; authorizations
// and gRPC failure injection apply per call, and a call no route matches
// is NOT_FOUND.
func TestGRPCRoutes(t *testing.T) {
	srv := &authz.Server{Meta: srvMeta, Protocol: authz.ProtocolGRPC, GRPCRoutes: []authz.GRPCRoute{{
		Meta: authz.Meta{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Name: "books-grpc"},
		Rules: []authz.GRPCRule{
			{Matches: []policy.GRPCRouteMatch{{Service: "books.Books", Method: "Get"}}},
			{Matches: []policy.GRPCRouteMatch{{Service: "books.Books", Method: "Fail"}},
				Filters: []policy.Filter{{GRPCFailureInjector: &policy.GRPCFailureInjector{Code: 14, Message: "injected"}}}},
		},
		Authorizations: []authz.Authz{{Meta: apMeta, Networks: []authz.Network{{Net: netip.PrefixFrom(remoteIP, 32)}}}},
	}}}
	e := newEnv(t, authz.WithDefault(srv))
	c, base := e.client(t, testutil.H2C, remoteIP, "")
	r := do(t, c, "POST", base+"/books.Books/Get", "Content-Type", "application/grpc")
	assert.Equal(t, "reached", r.hdr.Get("X-App"))
	r = do(t, c, "POST", base+"/books.Books/Fail", "Content-Type", "application/grpc")
	assert.Equal(t, "14", r.hdr.Get("Grpc-Status"))
	assert.Equal(t, "injected", r.hdr.Get("Grpc-Message"))
	r = do(t, c, "POST", base+"/books.Books/List", "Content-Type", "application/grpc")
	assert.Equal(t, "5", r.hdr.Get("Grpc-Status"))
	other, obase := e.client(t, testutil.H2C, netip.MustParseAddr("127.0.0.3"), "")
	r = do(t, other, "POST", obase+"/books.Books/Get", "Content-Type", "application/grpc")
	assert.Equal(t, "7", r.hdr.Get("Grpc-Status"))
	assert.Empty(t, r.hdr.Get("X-App"))

	_, err := authz.Compile(&authz.Server{Protocol: authz.ProtocolGRPC, Routes: authz.DefaultRoutes(nil, nil)})
	assert.ErrorContains(t, err, "routes: a grpc Server takes gRPC routes")
	_, err = authz.Compile(&authz.Server{GRPCRoutes: []authz.GRPCRoute{{}}})
	assert.ErrorContains(t, err, "grpcRoutes: only a grpc Server takes gRPC routes")
}

// A StaticSource's Server applies to its port from the first request;
// other ports keep the default.
func TestStaticSource(t *testing.T) {
	src := authz.StaticSource{}
	e := newEnv(t, authz.WithSource(src), authz.WithDefault(mustDefault(t, authz.Deny, authz.DefaultOptions{})))
	c, base := e.client(t, testutil.H1, remoteIP, "")
	src[uint16(mustPort(t, base))] = mustDefault(t, authz.AllUnauthenticated, authz.DefaultOptions{})
	assert.Equal(t, 200, do(t, c, "GET", base+"/").status)
	tc, tbase := e.client(t, testutil.H1, remoteIP, webID)
	assert.Equal(t, 403, do(t, tc, "GET", tbase+"/").status, "the TLS port keeps the default")
}
