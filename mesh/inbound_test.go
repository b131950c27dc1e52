package mesh

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestInboundPolicy: a server with an inbound policy lets only the named
// client identity POST /orders, answers 404 for a path no route of its
// Server matches, 403 to another identity and to a plaintext client, and
// 429 past its rate limit, over real mTLS connections between peers (the
// clients dial from 127.0.0.2, so that the pod's own localhost
// authorization does not apply); refused requests never reach the app and
// are counted in Linkerd's families.
func TestInboundPolicy(t *testing.T) {
	p := newPKI(t)
	m := testutil.NewMetrics(t)
	var reached atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { reached.Add(1); io.WriteString(w, "ordered") })

	webOnly := authz.Authz{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "web-orders"},
		Networks:       []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}},
		Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{webID}}}}
	server := &authz.Server{
		Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-http"},
		Protocol: authz.ProtocolDetect,
		Routes: []authz.Route{{
			Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPRoute", Name: "orders"},
			Rules: []authz.Rule{{Matches: []policy.HTTPRouteMatch{{Method: "POST",
				Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/orders"}}}}},
			Authorizations: []authz.Authz{webOnly},
		}},
		RateLimit: &authz.RateLimit{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPLocalRateLimitPolicy", Name: "books"}, Total: 20},
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := uint16(netip.MustParseAddrPort(lis.Addr().String()).Port())
	srv := NewServer(app, WithIdentity(p.certify(t, booksID)), WithMeterProvider(m.Provider), WithLogger(quiet),
		WithInboundPolicy(authz.WithSource(authz.StaticSource{port: server})))
	defer srv.Close()
	hs := origproto.NewServer(srv)
	hs.ErrorLog = quietLog
	go hs.Serve(srv.Listener(lis))
	defer hs.Close()

	const books = "books.default.svc.cluster.local:7000"
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		books: {{Addr: netip.MustParseAddrPort(lis.Addr().String()), H2: true, Identity: booksID}},
	})
	require.NoError(t, err)
	from2 := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext
	client := func(opts ...ClientOption) *http.Client {
		c := NewClient(append([]ClientOption{WithEndpoints(eps), WithMeterProvider(m.Provider), WithLogger(quiet),
			WithDialContext(from2), WithBalancerOptions(balancer.WithFallback(false))}, opts...)...)
		t.Cleanup(c.Close)
		return &http.Client{Transport: c, Timeout: testutil.Timeout}
	}
	web, reviews, plain := client(WithIdentity(p.certify(t, webID))), client(WithIdentity(p.certify(t, reviewsID))), client()
	do := func(c *http.Client, method, path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), method, "http://"+books+path, nil)
		resp, err := c.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}

	assert.Equal(t, 200, do(web, "POST", "/orders").StatusCode, "the named identity")
	resp := do(reviews, "POST", "/orders")
	assert.Equal(t, 403, resp.StatusCode, "another identity")
	assert.Contains(t, resp.Header.Get("L5d-Proxy-Error"), "unauthorized request on route", "a meshed client is told why")
	assert.Equal(t, 403, do(plain, "POST", "/orders").StatusCode, "a plaintext client")
	assert.Equal(t, 404, do(web, "GET", "/orders").StatusCode, "no route for GET")
	assert.Equal(t, int32(1), reached.Load(), "refused requests never reach the app")

	// total: 20 requests a second, burst 20: of a burst of 100, about 20
	// pass (more only as tokens come back while the burst runs).
	passed, limited := 0, 0
	for range 100 {
		switch do(web, "POST", "/orders").StatusCode {
		case 200:
			passed++
		case 429:
			limited++
		}
	}
	assert.Equal(t, 100, passed+limited)
	assert.GreaterOrEqual(t, passed, 15)
	assert.LessOrEqual(t, passed, 40)

	srvLabels := []string{`srv_group="policy.linkerd.io"`, `srv_kind="server"`, `srv_name="books-http"`}
	assert.Equal(t, "1", m.Value(t, "inbound_http_authz_deny_total", append(srvLabels, `route_name="orders"`, `tls="true"`, `client_id="`+reviewsID+`"`)...))
	assert.Equal(t, "1", m.Value(t, "inbound_http_authz_deny_total", append(srvLabels, `tls="no_identity"`, `no_tls_reason="loopback"`)...),
		"a plaintext client of a meshed port, as Linkerd labels it")
	assert.Equal(t, "1", m.Value(t, "inbound_http_route_not_found_total", srvLabels...))
	assert.NotEmpty(t, m.Value(t, "inbound_http_local_ratelimit_total", append(srvLabels, `ratelimit_scope="total"`, `ratelimit_name="books"`)...))
	assert.NotEmpty(t, m.Value(t, "inbound_http_authz_allow_total", append(srvLabels, `authz_name="web-orders"`, `client_id="`+webID+`"`)...))

	// The inbound request and response metrics carry the target, srv_*,
	// route_*, authz_* and tls labels of the allowed requests (the labels
	// `linkerd viz stat-inbound` groups by); refused requests are not in
	// them, as in Linkerd's proxy.
	allowed := append(srvLabels, `direction="inbound"`, `target_port="`+strconv.Itoa(int(port))+`"`,
		`srv_port="`+strconv.Itoa(int(port))+`"`, `route_kind="HTTPRoute"`, `route_name="orders"`,
		`authz_kind="authorizationpolicy"`, `authz_name="web-orders"`, `tls="true"`, `client_id="`+webID+`"`)
	assert.Equal(t, strconv.Itoa(passed+1), m.Value(t, "request_total", allowed...))
	assert.Equal(t, strconv.Itoa(passed+1), m.Value(t, "response_total", append(allowed, `status_code="200"`, `classification="success"`)...))
	for _, code := range []string{"403", "404", "429"} {
		assert.Empty(t, m.Lines(t, "response_total", `direction="inbound"`, `status_code="`+code+`"`), "refused requests are not in response_total")
	}
}

// TestInboundPolicyFromTheControlPlane: the inbound policy of a pod's port
// comes from the embedded control plane's InboundServerPolicies API, built
// from the manifests Linkerd users write (Pod, Server,
// AuthorizationPolicy, MeshTLSAuthentication); an edit of them is enforced
// without a restart, and a bad manifest keeps the last good policy.
func TestInboundPolicyFromTheControlPlane(t *testing.T) {
	p := newPKI(t)
	cp := startControlPlane(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := netip.MustParseAddrPort(lis.Addr().String()).Port()
	manifests := func(allowed string) string {
		return fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: default, labels: {app: books}}
spec:
  containers: [{name: books, ports: [{name: http, containerPort: %d}]}]
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: books-http, namespace: default}
spec:
  podSelector: {matchLabels: {app: books}}
  port: http
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: callers, namespace: default}
spec:
  identities: [%q]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: books-callers, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books-http}
  requiredAuthenticationRefs: [{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: callers}]
`, port, allowed)
	}
	load := func(doc string) error {
		r, err := manifest.Parse([]byte(doc))
		if err != nil {
			return err
		}
		cp.store.SetManifests(r)
		return nil
	}
	require.NoError(t, load(manifests(webID)))

	dst, err := destination.Dial(cp.addr, destination.WithLogger(quiet), destination.WithWorkload("default:books-0"))
	require.NoError(t, err)
	defer dst.Close()
	m := testutil.NewMetrics(t)
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		WithIdentity(p.certify(t, booksID)), WithMeterProvider(m.Provider), WithLogger(quiet),
		WithInboundPolicy(authz.WithSource(dst.InboundPolicies())))
	defer srv.Close()
	hs := origproto.NewServer(srv)
	hs.ErrorLog = quietLog
	go hs.Serve(srv.Listener(lis))
	defer hs.Close()

	const books = "books.default.svc.cluster.local:7000"
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		books: {{Addr: netip.MustParseAddrPort(lis.Addr().String()), H2: true, Identity: booksID}},
	})
	require.NoError(t, err)
	from2 := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext
	client := func(id string) *http.Client {
		c := NewClient(WithEndpoints(eps), WithIdentity(p.certify(t, id)), WithLogger(quiet), WithDialContext(from2),
			WithBalancerOptions(balancer.WithFallback(false)))
		t.Cleanup(c.Close)
		return &http.Client{Transport: c, Timeout: testutil.Timeout}
	}
	web, reviews := client(webID), client(reviewsID)
	status := func(c *http.Client) int {
		resp, err := c.Get("http://" + books + "/")
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return status(web) == 200 && status(reviews) == 403 }, testutil.Timeout, 20*time.Millisecond,
		"the Server's authorization admits web only")
	// The condition may have held across the policy's arrival (web
	// admitted by the default policy, reviews denied by the Server's): one
	// more request is surely admitted by the Server's authorization.
	require.Equal(t, 200, status(web))
	assert.NotEmpty(t, m.Value(t, "inbound_http_authz_allow_total", `srv_name="books-http"`, `authz_name="books-callers"`))

	// The edit: reviews instead of web, enforced with the watch's next
	// message, no restart (the time it took is logged, not asserted).
	edited := time.Now()
	require.NoError(t, load(manifests(reviewsID)))
	require.Eventually(t, func() bool { return status(reviews) == 200 && status(web) == 403 }, testutil.Timeout, 20*time.Millisecond)
	t.Logf("the edit was enforced after %v", time.Since(edited))

	// A bad manifest is refused; the last good policy stays.
	require.Error(t, load("apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: x}\nspec: {port: http, nope: 1}\n"))
	assert.Equal(t, 200, status(reviews))
	assert.Equal(t, 403, status(web))
}

// TestInboundRateLimitOverride: a rate limit's override raises one named
// client identity's limit above the per-identity one, over real mTLS
// connections: in a burst of 30, web (overridden to 20 a second) gets
// about 20 through, reviews (5 a second per identity) about 5.
func TestInboundRateLimitOverride(t *testing.T) {
	p := newPKI(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := netip.MustParseAddrPort(lis.Addr().String()).Port()
	server := &authz.Server{
		Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-http"},
		Authorizations: []authz.Authz{{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "all"},
			Networks: []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}}}},
		RateLimit: &authz.RateLimit{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPLocalRateLimitPolicy", Name: "books"},
			Identity: 5, Overrides: []authz.Override{{RPS: 20, Identities: []string{webID}}}},
	}
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		WithIdentity(p.certify(t, booksID)), WithLogger(quiet),
		WithInboundPolicy(authz.WithSource(authz.StaticSource{port: server}), authz.WithoutLocalhost()))
	defer srv.Close()
	hs := origproto.NewServer(srv)
	hs.ErrorLog = quietLog
	go hs.Serve(srv.Listener(lis))
	defer hs.Close()
	const books = "books.default.svc.cluster.local:7000"
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		books: {{Addr: netip.MustParseAddrPort(lis.Addr().String()), H2: true, Identity: booksID}},
	})
	require.NoError(t, err)
	burst := func(id string) (passed int) {
		c := NewClient(WithEndpoints(eps), WithIdentity(p.certify(t, id)), WithLogger(quiet), WithBalancerOptions(balancer.WithFallback(false)))
		defer c.Close()
		hc := &http.Client{Transport: c, Timeout: testutil.Timeout}
		for range 30 {
			resp, err := hc.Get("http://" + books + "/")
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				passed++
			} else {
				require.Equal(t, 429, resp.StatusCode)
			}
		}
		return passed
	}
	web := burst(webID)
	start := time.Now()
	reviews := burst(reviewsID)
	elapsed := time.Since(start)
	// Each bucket starts full (burst = rate) and refills while its burst
	// runs: at least the rate gets through, and for reviews at most its 5
	// plus what 5 a second refills meanwhile.
	assert.GreaterOrEqual(t, web, 20, "the overridden identity")
	assert.GreaterOrEqual(t, reviews, 5)
	assert.LessOrEqual(t, reviews, 5+int(5*elapsed.Seconds())+1, "reviews held to 5 a second (burst took %v)", elapsed)
}
