package mesh

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// get sends a GET to url through rt and reads the response to its end.
func get(t *testing.T, rt http.RoundTripper, url string) {
	t.Helper()
	resp, err := (&http.Client{Transport: rt, Timeout: testutil.Timeout}).Get(url)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// okServer is a loopback HTTP server answering 200, closed at the end of
// the test.
func okServer(t *testing.T) netip.AddrPort {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(srv.Close)
	return netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://"))
}

// The outbound stack labels a connection it dials to an endpoint with the
// logical authority the balancer chose the endpoint for, as Linkerd's
// proxy labels it (linkerd/app/outbound/src/http/concrete.rs:
// OutboundEndpointLabels{authority: parent}): `linkerd viz stat svc/books`
// selects the TCP columns of a Service by
// tcp_*{direction="outbound",peer="dst",authority=~"^books.default.svc.cluster.local.*"}.
// A connection dialled to the request's own address (no endpoint chosen)
// has none, as Linkerd's forwarded connections have none.
func TestTCPOutboundCarriesTheBalancedAuthority(t *testing.T) {
	const books = "books.default.svc.cluster.local:7000"
	ep := okServer(t)
	direct := okServer(t)
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {{Addr: ep, Labels: map[string]string{"pod": "books-0"}}}})
	require.NoError(t, err)
	m := testutil.NewMetrics(t)
	client := NewClient(WithEndpoints(eps), WithMeterProvider(m.Provider), WithLogger(quiet))
	defer client.Close()
	get(t, client, "http://"+books+"/")
	get(t, client, "http://"+direct.String()+"/")

	// A request's bytes are counted once its write has returned, which
	// may be after its response came.
	var text string
	require.Eventually(t, func() bool {
		text = m.Scrape(t)
		written, _ := testutil.Select(t, text, "tcp_write_bytes_total", `direction="outbound"`, `peer="dst"`)
		return len(written) == 2
	}, testutil.Timeout, 5*time.Millisecond)
	for _, fam := range []string{"tcp_open_total", "tcp_open_connections", "tcp_read_bytes_total", "tcp_write_bytes_total"} {
		lines, _ := testutil.Select(t, text, fam, `direction="outbound"`, `peer="dst"`, `authority=~"^books.default.svc.cluster.local.*"`, `dst_pod="books-0"`)
		assert.Len(t, lines, 1, "%s of svc/books:\n%s", fam, testutil.Family(text, fam))
	}
	lines, _ := testutil.Select(t, text, "tcp_open_total", `direction="outbound"`, `peer="dst"`, `target_addr="`+direct.String()+`"`)
	require.Len(t, lines, 1, "%s", testutil.Family(text, "tcp_open_total"))
	assert.NotContains(t, lines[0], "authority=", "no authority was balanced for the request to an address")
}

// The authority label of connections is bounded for the life of the
// stack as classify bounds the request metrics' (WithMaxAuthorities): the
// first authorities keep their names, later ones are "other".
func TestTCPAuthorityLabelsBounded(t *testing.T) {
	const n = 4
	authorities := make(map[string][]endpoint.Endpoint)
	var names []string
	for i := range n {
		name := fmt.Sprintf("svc-%d.default.svc.cluster.local:80", i)
		names = append(names, name)
		authorities[name] = []endpoint.Endpoint{{Addr: okServer(t)}} // a connection of its own
	}
	eps, err := balancer.NewStaticSource(authorities)
	require.NoError(t, err)
	m := testutil.NewMetrics(t)
	client := NewClient(WithEndpoints(eps), WithMeterProvider(m.Provider), WithLogger(quiet), WithMaxAuthorities(2))
	defer client.Close()
	for _, name := range names {
		get(t, client, "http://"+name+"/")
	}
	got := labelValues(t, m, "tcp_open_total", "authority")
	assert.Equal(t, map[string]bool{names[0]: true, names[1]: true, "other": true}, got)
	_, others := m.Select(t, "tcp_open_total", `peer="dst"`, `authority="other"`)
	assert.Equal(t, float64(n-2), others, "the connections past the bound are counted under other")
}

// Linkerd writes an address as target_addr, target_ip and target_port
// (linkerd/app/core/src/transport/labels.rs, TargetAddr) on every tcp_*
// series: those of the connections dialled to an endpoint or an address,
// those accepted from the application, and those accepted from clients.
// A connection dialled to a name has no IP of its own: target_ip is empty.
func TestTCPTargetIPAndPort(t *testing.T) {
	srv := okServer(t)
	// The name is dialled by the test's dial function, not resolved.
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == "books.test:80" {
			addr = srv.String()
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	m := testutil.NewMetrics(t)
	client := NewClient(WithMeterProvider(m.Provider), WithLogger(quiet), WithDialContext(dial))
	defer client.Close()
	server := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		WithMeterProvider(m.Provider), WithLogger(quiet))
	defer server.Close()
	inbound := serveMeshed(t, server)
	// The application's connections, accepted by the outbound stack's
	// listener, as a proxy serves them.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	outbound := lis.Addr().String()
	proxy := origproto.NewServer(&httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.Out.URL.Scheme, pr.Out.URL.Host = "http", pr.In.Host },
		Transport: client,
		ErrorLog:  quietLog,
	})
	proxy.ErrorLog = quietLog
	go proxy.Serve(client.Listener(lis))
	defer proxy.Close()

	get(t, client, "http://"+inbound.String()+"/")
	get(t, client, "http://books.test/")
	app := &http.Transport{}
	defer app.CloseIdleConnections()
	req, err := http.NewRequest("GET", "http://"+outbound+"/", nil)
	require.NoError(t, err)
	req.Host = srv.String()
	resp, err := app.RoundTrip(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	port := func(ap string) string { return ap[strings.LastIndexByte(ap, ':')+1:] }
	for _, want := range [][]string{
		{`direction="outbound"`, `peer="dst"`, `target_addr="` + inbound.String() + `"`, `target_ip="127.0.0.1"`, `target_port="` + port(inbound.String()) + `"`},
		{`direction="outbound"`, `peer="dst"`, `target_addr="books.test:80"`, `target_ip=""`, `target_port="80"`},
		{`direction="outbound"`, `peer="src"`, `target_addr="` + outbound + `"`, `target_ip="127.0.0.1"`, `target_port="` + port(outbound) + `"`},
		{`direction="inbound"`, `peer="src"`, `target_addr="` + inbound.String() + `"`, `target_ip="127.0.0.1"`, `target_port="` + port(inbound.String()) + `"`},
	} {
		lines, _ := m.Select(t, "tcp_open_total", want...)
		assert.Len(t, lines, 1, "%v in:\n%s", want, strings.Join(m.Lines(t, "tcp_open_total"), "\n"))
	}
}

// handSource answers the watches of ports when the test says so.
type handSource struct {
	mu      sync.Mutex
	updates map[uint16]func(*authz.Server)
	watched chan struct{}
}

func newHandSource() *handSource {
	return &handSource{updates: map[uint16]func(*authz.Server){}, watched: make(chan struct{}, 16)}
}

func (s *handSource) Watch(port uint16, update func(*authz.Server)) func() {
	s.mu.Lock()
	s.updates[port] = update
	s.mu.Unlock()
	s.watched <- struct{}{}
	return func() {}
}

func (s *handSource) answer(port uint16, srv *authz.Server) {
	s.mu.Lock()
	u := s.updates[port]
	s.mu.Unlock()
	u(srv)
}

// openServer is a Linkerd Server named name whose one route admits every
// client.
func openServer(name string) *authz.Server {
	return &authz.Server{
		Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: name},
		Routes: []authz.Route{{
			Meta:  authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPRoute", Name: "all"},
			Rules: []authz.Rule{{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/"}}}}},
			Authorizations: []authz.Authz{{
				Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "all"},
				Networks: []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}},
			}},
		}},
	}
}

// A connection accepted under an inbound policy carries the srv_* labels
// of its port's Server, as Linkerd's proxy labels it
// (ServerLabels::inbound): `linkerd viz stat server/books-http` selects
// the TCP columns of a Server by
// tcp_*{direction="inbound",peer="src",srv_kind="server",srv_name="books-http"}.
//
// A connection keeps the Server it was accepted under, as in Linkerd's
// proxy, while the requests on it meet the policy in force. A connection
// accepted before its port's first policy arrived (its first request
// waits for it) carries the Server that decides that request, not the
// default, which decides nothing on a port whose policy comes within the
// wait.
func TestTCPInboundCarriesTheServerAcceptedUnder(t *testing.T) {
	src := newHandSource()
	m := testutil.NewMetrics(t)
	server := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		WithMeterProvider(m.Provider), WithLogger(quiet), WithInboundPolicy(authz.WithSource(src)))
	defer server.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := netip.MustParseAddrPort(lis.Addr().String())
	srv := origproto.NewServer(server)
	srv.ErrorLog = quietLog
	active := make(chan struct{}, 1)
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateActive {
			select {
			case active <- struct{}{}:
			default:
			}
		}
	}
	go srv.Serve(server.Listener(lis))
	defer srv.Close()
	<-src.watched

	// The first connection is accepted, and its request read, while the
	// port's policy is pending: the request waits for it.
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	done := make(chan struct{})
	go func() {
		defer close(done)
		get(t, tr, "http://"+addr.String()+"/")
	}()
	<-active
	src.answer(addr.Port(), openServer("books-http"))
	<-done

	books := []string{`direction="inbound"`, `peer="src"`, `srv_group="policy.linkerd.io"`, `srv_kind="server"`, `srv_name="books-http"`,
		`srv_port="` + fmt.Sprint(addr.Port()) + `"`, `target_addr="` + addr.String() + `"`, `tls="disabled"`}
	_, open := m.Select(t, "tcp_open_connections", books...)
	assert.Equal(t, 1.0, open, "the first connection, under the Server that decided its request:\n%s", strings.Join(m.Lines(t, "tcp_open_total"), "\n"))
	_, read := m.Select(t, "tcp_read_bytes_total", books...)
	assert.Positive(t, read, "its bytes, counted aside until it was labelled")
	defaults, _ := m.Select(t, "tcp_open_total", `srv_kind="default"`)
	assert.Empty(t, defaults, "the default decided nothing")

	// The Server changes: the open connection keeps the one it was
	// accepted under, its next request meets the new one; a new
	// connection carries the new one.
	src.answer(addr.Port(), openServer("books-http-v2"))
	get(t, tr, "http://"+addr.String()+"/")
	_, v2Requests := m.Select(t, "request_total", `direction="inbound"`, `srv_name="books-http-v2"`)
	assert.Equal(t, 1.0, v2Requests, "the request meets the new Server")
	_, open = m.Select(t, "tcp_open_connections", books...)
	assert.Equal(t, 1.0, open, "the connection keeps its Server")
	v2Conns, _ := m.Select(t, "tcp_open_total", `srv_name="books-http-v2"`)
	assert.Empty(t, v2Conns)

	tr2 := &http.Transport{}
	defer tr2.CloseIdleConnections()
	get(t, tr2, "http://"+addr.String()+"/")
	_, v2Open := m.Select(t, "tcp_open_connections", `direction="inbound"`, `srv_name="books-http-v2"`)
	assert.Equal(t, 1.0, v2Open, "a new connection, under the new Server")
}

// A connection that closes while its port's first policy is pending is
// counted under the policy in force then (the default), its bytes
// included: counted aside meanwhile, they are not lost.
func TestTCPInboundClosedBeforeThePolicyIsCounted(t *testing.T) {
	src := newHandSource()
	m := testutil.NewMetrics(t)
	server := NewServer(http.NotFoundHandler(), WithMeterProvider(m.Provider), WithLogger(quiet), WithInboundPolicy(authz.WithSource(src)))
	defer server.Close()
	addr := serveMeshed(t, server)
	<-src.watched

	c, err := net.Dial("tcp", addr.String())
	require.NoError(t, err)
	_, err = io.WriteString(c, "GET / HT") // half a request line: nothing to answer yet
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	_, _ = io.Copy(io.Discard, c) // the server closes its side
	c.Close()

	require.Eventually(t, func() bool {
		_, closed := m.Select(t, "tcp_close_total", `direction="inbound"`)
		return closed == 1
	}, testutil.Timeout, 5*time.Millisecond)
	def := []string{`direction="inbound"`, `peer="src"`, `srv_kind="default"`, `srv_name="all-unauthenticated"`}
	for _, fam := range []string{"tcp_open_total", "tcp_close_total"} {
		_, n := m.Select(t, fam, def...)
		assert.Equal(t, 1.0, n, "%s:\n%s", fam, strings.Join(m.Lines(t, fam), "\n"))
	}
	_, read := m.Select(t, "tcp_read_bytes_total", def...)
	assert.Equal(t, float64(len("GET / HT")), read, "%s", strings.Join(m.Lines(t, "tcp_read_bytes_total"), "\n"))
}
