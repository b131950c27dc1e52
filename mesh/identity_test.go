package mesh

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/proxyapi/identitypb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

const (
	booksID   = "books.default.serviceaccount.identity.linkerd.cluster.local"
	webID     = "web.default.serviceaccount.identity.linkerd.cluster.local"
	reviewsID = "reviews.default.serviceaccount.identity.linkerd.cluster.local"
)

// certify returns the identity name certified by a fresh issuer's chain,
// in process; all identities of one test share anchors.
type pki struct {
	anchors *x509.CertPool
	issuer  *controlplane.Issuer
	root    *controlplane.CA
}

func newPKI(t *testing.T) *pki {
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("issuer", time.Hour)
	require.NoError(t, err)
	p := &pki{anchors: x509.NewCertPool(), root: root}
	p.anchors.AddCert(root.Cert)
	p.issuer, err = controlplane.NewIssuer(p.anchors, [][]byte{iss.DER}, iss.Key,
		controlplane.StaticTokens{booksID: booksID, webID: webID, reviewsID: reviewsID}, controlplane.WithIssuerLogger(quiet))
	require.NoError(t, err)
	return p
}

func (p *pki) certify(t *testing.T, name string) *identity.Local {
	l, err := identity.NewLocal(name, p.anchors)
	require.NoError(t, err)
	resp, err := p.issuer.Certify(context.Background(), &identitypb.CertifyRequest{
		Identity: name, Token: []byte(name), CertificateSigningRequest: l.CSR()})
	require.NoError(t, err)
	require.NoError(t, l.SetCertificate(resp.LeafCertificate, resp.IntermediateCertificates))
	return l
}

// A client whose identity has no certificate yet sends nothing: a
// connection made without it would stay anonymous for as long as it is
// pooled, and the server would see no identity after the certificate
// came. A request whose context ends first fails, and nothing reaches
// the application; one made before the certificate and those after it
// carry the identity.
func TestFirstRequestsWaitForTheCertificate(t *testing.T) {
	p := newPKI(t)
	var reached atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.WriteString(w, r.Proto+" id="+r.Header.Get("L5d-Client-Id"))
	})
	server := NewServer(app, WithIdentity(p.certify(t, booksID)), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer server.Close()
	addr := serveMeshed(t, server)
	const books = "books.default.svc.cluster.local:7000"
	for _, h2 := range []bool{false, true} {
		t.Run("h2="+strconv.FormatBool(h2), func(t *testing.T) {
			eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {{Addr: addr, H2: h2, Identity: booksID}}})
			require.NoError(t, err)
			web, err := identity.NewLocal(webID, p.anchors)
			require.NoError(t, err)
			client := NewClient(WithEndpoints(eps), WithIdentity(web), WithMeterProvider(noop.NewMeterProvider()),
				WithLogger(quiet), WithBalancerOptions(balancer.WithFallback(false)))
			defer client.Close()
			get := func(ctx context.Context) (string, error) {
				req, err := http.NewRequestWithContext(ctx, "GET", "http://"+books+"/", nil)
				require.NoError(t, err)
				resp, err := client.RoundTrip(req)
				if err != nil {
					return "", err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return string(b), err
			}
			before := reached.Load()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			_, err = get(ctx)
			cancel()
			assert.Error(t, err, "a request before the certificate")
			assert.Equal(t, before, reached.Load(), "nothing reached the application without the certificate")

			const proto = "HTTP/1.1" // with h2, upgraded between the peers and downgraded for the application
			waiting := make(chan string, 1)
			go func() {
				body, err := get(context.Background())
				if err != nil {
					body = err.Error()
				}
				waiting <- body
			}()
			resp, err := p.issuer.Certify(context.Background(), &identitypb.CertifyRequest{
				Identity: webID, Token: []byte(webID), CertificateSigningRequest: web.CSR()})
			require.NoError(t, err)
			require.NoError(t, web.SetCertificate(resp.LeafCertificate, resp.IntermediateCertificates))
			assert.Equal(t, proto+" id="+webID, <-waiting, "the request made before the certificate")
			for i := range 3 {
				body, err := get(context.Background())
				require.NoError(t, err)
				assert.Equal(t, proto+" id="+webID, body, "request %d after the certificate", i)
			}
		})
	}
}

// Two peers with identities: the request crosses as mTLS (the server's
// certificate carries its identity), the application sees the client's
// identity in l5d-client-id; a plaintext client of the same port is
// served without one, even when it sends one; an endpoint whose advertised
// identity differs from its certificate's fails with an identity error,
// and nothing reaches the application in plaintext.
func TestMeshedMTLS(t *testing.T) {
	p := newPKI(t)
	var reached atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		peer, _ := identity.PeerFromContext(r.Context())
		io.WriteString(w, r.Proto+" "+r.Header.Get("L5d-Client-Id")+" tls="+boolText(peer.TLS))
	})
	server := NewServer(app, WithIdentity(p.certify(t, booksID)), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer server.Close()
	addr := serveMeshed(t, server)

	const books, wrong = "books.default.svc.cluster.local:7000", "wrong.default.svc.cluster.local:7000"
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		books: {{Addr: addr, H2: true, Identity: booksID}},
		wrong: {{Addr: addr, H2: true, Identity: reviewsID}},
	})
	require.NoError(t, err)
	client := NewClient(WithEndpoints(eps), WithIdentity(p.certify(t, webID)), WithMeterProvider(noop.NewMeterProvider()),
		WithLogger(quiet), WithBalancerOptions(balancer.WithFallback(false)))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: testutil.Timeout}

	resp, err := hc.Get("http://" + books + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "HTTP/1.1 "+webID+" tls=true", string(body), "upgraded inside mTLS, the client's identity for the app")

	// A plaintext client on the same port, sending a l5d-client-id.
	req, _ := http.NewRequest("GET", "http://"+addr.String()+"/", nil)
	req.Header.Set("L5d-Client-Id", "admin.default.serviceaccount.identity.linkerd.cluster.local")
	resp, err = testutil.NewTransport(t, testutil.H1).RoundTrip(req)
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "HTTP/1.1  tls=false", string(body), "served, without a client identity")

	before := reached.Load()
	_, err = hc.Get("http://" + wrong + "/")
	var idErr *identity.IdentityError
	require.True(t, errors.As(err, &idErr), "%v", err)
	assert.Equal(t, reviewsID, idErr.Expected)
	assert.Equal(t, before, reached.Load(), "nothing reached the app in plaintext")
}

func boolText(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

const (
	tlsBooks = "books.default.svc.cluster.local:7000"
	tlsPlain = "plain.default.svc.cluster.local:7000"
)

// tlsTraffic is what sendTLSTraffic leaves: the metrics of both stacks,
// the server's address and the two clients.
type tlsTraffic struct {
	m                *testutil.Metrics
	addr             netip.AddrPort
	meshed, unmeshed *Client
}

// sendTLSTraffic serves the books identity and sends it three requests:
// through a client with an identity, one to books (an endpoint with the
// server's identity: mTLS) and one to plain (the same server as an
// endpoint without one: plaintext); and one to books through a client
// without an identity.
func sendTLSTraffic(t *testing.T) *tlsTraffic {
	p := newPKI(t)
	tr := &tlsTraffic{m: testutil.NewMetrics(t)}
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	server := NewServer(app, WithIdentity(p.certify(t, booksID)), WithMeterProvider(tr.m.Provider), WithLogger(quiet))
	t.Cleanup(server.Close)
	tr.addr = serveMeshed(t, server)
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		tlsBooks: {{Addr: tr.addr, H2: true, Identity: booksID, Labels: map[string]string{"pod": "books-0", "namespace": "default"}}},
		tlsPlain: {{Addr: tr.addr, H2: true}},
	})
	require.NoError(t, err)
	get := func(c *Client, authority string) {
		t.Helper()
		resp, err := (&http.Client{Transport: c, Timeout: testutil.Timeout}).Get("http://" + authority + "/")
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
	}
	tr.meshed = NewClient(WithEndpoints(eps), WithIdentity(p.certify(t, webID)), WithMeterProvider(tr.m.Provider),
		WithLogger(quiet), WithBalancerOptions(balancer.WithFallback(false)))
	get(tr.meshed, tlsBooks)
	get(tr.meshed, tlsPlain)
	tr.unmeshed = NewClient(WithEndpoints(eps), WithMeterProvider(tr.m.Provider), WithLogger(quiet))
	get(tr.unmeshed, tlsBooks)
	return tr
}

// TestTLSMetricLabels: the request and response series carry Linkerd's
// tls labels (linkerd/app/core/src/transport/labels.rs): outbound
// tls="true" with the server's server_id over mTLS, inbound tls="true"
// with the client's client_id, and no_tls_reason="no_tls_from_remote" for
// a plaintext client of a stack with an identity; a stack without an
// identity says tls="disabled".
func TestTLSMetricLabels(t *testing.T) {
	tr := sendTLSTraffic(t)
	defer tr.meshed.Close()
	defer tr.unmeshed.Close()
	m := tr.m

	assert.Equal(t, "1", m.Value(t, "response_total", `direction="outbound"`, `authority="`+tlsBooks+`"`, `tls="true"`, `server_id="`+booksID+`"`))
	assert.Equal(t, "1", m.Value(t, "response_total", `direction="outbound"`, `authority="`+tlsPlain+`"`, `tls="no_identity"`,
		`no_tls_reason="not_provided_by_service_discovery"`))
	assert.Equal(t, "1", m.Value(t, "response_total", `direction="outbound"`, `authority="`+tlsBooks+`"`, `tls="disabled"`))
	assert.Equal(t, "1", m.Value(t, "response_total", `direction="inbound"`, `tls="true"`, `client_id="`+webID+`"`))
	// The plain endpoint was reached in plaintext by the meshed client,
	// and the unmeshed client is plaintext too.
	for _, a := range []string{tlsBooks, tlsPlain} {
		assert.Equal(t, "1", m.Value(t, "response_total", `direction="inbound"`, `authority="`+a+`"`, `tls="no_identity"`,
			`no_tls_reason="no_tls_from_remote"`), a)
	}
}

// Connections are counted in Linkerd's tcp_* families with the labels
// `linkerd viz edges` groups by (viz/metrics-api/edges.go: direction,
// dst_*, server_id, no_tls_reason) and `linkerd viz stat` reads (peer
// "src" inbound, "dst" outbound), as linkerd/app/core/src/transport/labels.rs
// writes them: outbound the endpoint's labels and TLS, inbound the
// client's TLS; open while they are, closed after.
func TestTCPMetricLabels(t *testing.T) {
	tr := sendTLSTraffic(t)
	m, addr, meshed, unmeshed := tr.m, tr.addr, tr.meshed, tr.unmeshed

	target := `target_addr="` + addr.String() + `"`
	out := []string{`direction="outbound"`, `peer="dst"`, target}
	in := []string{`direction="inbound"`, `peer="src"`, target}
	with := func(base []string, more ...string) []string { return append(append([]string(nil), base...), more...) }
	for _, tc := range []struct {
		name   string
		labels []string
		open   string
	}{
		{"outbound mTLS", with(out, `tls="true"`, `server_id="`+booksID+`"`, `dst_pod="books-0"`, `dst_namespace="default"`), "1"},
		{"outbound without identity", with(out, `tls="no_identity"`, `no_tls_reason="not_provided_by_service_discovery"`), "1"},
		{"outbound without mesh TLS", with(out, `tls="disabled"`), "1"},
		{"inbound mTLS", with(in, `tls="true"`, `client_id="`+webID+`"`), "1"},
		{"inbound plaintext", with(in, `tls="no_identity"`, `no_tls_reason="no_tls_from_remote"`), "2"},
	} {
		assert.Equal(t, tc.open, m.Value(t, "tcp_open_total", tc.labels...), "%s: %v", tc.name, m.Lines(t, "tcp_open_total"))
		assert.Equal(t, tc.open, m.Value(t, "tcp_open_connections", tc.labels...), tc.name)
		for _, fam := range []string{"tcp_read_bytes_total", "tcp_write_bytes_total"} {
			v, err := strconv.Atoi(m.Value(t, fam, tc.labels...))
			if assert.NoError(t, err, "%s %s", tc.name, fam) {
				assert.Positive(t, v, "%s %s", tc.name, fam)
			}
		}
	}

	// Closed: the clients' connections, and then the server's ends of them.
	meshed.Close()
	unmeshed.Close()
	require.Eventually(t, func() bool {
		for _, l := range m.Lines(t, "tcp_open_connections") {
			if !strings.HasSuffix(l, " 0") {
				return false
			}
		}
		return true
	}, testutil.Timeout, 5*time.Millisecond, "connections still open: %v", m.Lines(t, "tcp_open_connections"))
	// Both sides count the bytes on the wire, TLS records included: what
	// the client wrote on its mTLS connection the server read.
	wrote, err := strconv.Atoi(m.Value(t, "tcp_write_bytes_total", with(out, `tls="true"`)...))
	require.NoError(t, err)
	read, err := strconv.Atoi(m.Value(t, "tcp_read_bytes_total", with(in, `tls="true"`)...))
	require.NoError(t, err)
	assert.InDelta(t, wrote, read, 0.1*float64(wrote), "bytes the client wrote %d, the server read %d", wrote, read)
	assert.Equal(t, "2", m.Value(t, "tcp_close_total", with(in, `tls="no_identity"`, `errno=""`)...))
	assert.Equal(t, "1", m.Value(t, "tcp_close_total", with(out, `tls="true"`, `errno=""`)...))
}

// A connection closed while its meshed TLS is still being detected (the
// server shutting down under a client that sent nothing yet) leaves no
// open connection behind in tcp_open_connections.
func TestTCPMetricsCloseDuringDetection(t *testing.T) {
	p := newPKI(t)
	m := testutil.NewMetrics(t)
	server := NewServer(http.NotFoundHandler(), WithIdentity(p.certify(t, booksID)), WithMeterProvider(m.Provider), WithLogger(quiet))
	defer server.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := server.Listener(lis)
	defer ln.Close()
	client, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	conn, err := ln.Accept()
	require.NoError(t, err)
	read := make(chan error, 1)
	go func() { _, err := conn.Read(make([]byte, 1)); read <- err }()
	require.NoError(t, conn.Close())
	select {
	case err := <-read:
		assert.Error(t, err)
	case <-time.After(testutil.Timeout):
		t.Fatal("the read outlived Close")
	}
	for _, l := range m.Lines(t, "tcp_open_connections") {
		assert.True(t, strings.HasSuffix(l, " 0"), "an open connection left behind: %s", l)
	}
	opened, closed := m.Lines(t, "tcp_open_total"), m.Lines(t, "tcp_close_total")
	assert.Equal(t, len(opened), len(closed), "opened %v, closed %v", opened, closed)
}

// An endpoint with a URI (SPIFFE) identity and a server name, as Linkerd's
// destination controller describes an external workload, is reached over
// mTLS with the server name as SNI, and proves the URI identity with a URI
// SAN (linkerd2-proxy: linkerd/proxy/api-resolve/src/pb.rs, the SNI;
// linkerd/meshtls/verifier/src/lib.rs, the identity).
// The application sees a client's identity as Linkerd's proxy reads it
// (linkerd2-proxy linkerd/meshtls/verifier/src/lib.rs): the first DNS
// name of its certificate that parses as an identity, in lower case, or
// its first URI; an upper-case name is lowercased rather than skipped for
// the next, and a name that does not parse is skipped.
func TestClientIDFromFirstIdentitySAN(t *testing.T) {
	p := newPKI(t)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("L5d-Client-Id"))
	})
	server := NewServer(app, WithIdentity(p.certify(t, booksID)), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer server.Close()
	addr := serveMeshed(t, server)
	upperWeb := strings.ToUpper(webID[:3]) + webID[3:]
	for _, tc := range []struct {
		name  string
		names []string
		want  string
	}{
		{"lower case", []string{webID, reviewsID}, webID},
		{"upper case first", []string{upperWeb, reviewsID}, webID},
		{"underscore first", []string{"web_api." + webID[4:], reviewsID}, "web_api." + webID[4:]},
		{"an address skipped", []string{"10.0.0.1", reviewsID}, reviewsID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert := testutil.DNSLeaf(t, p.root.Cert, p.root.Key, tc.names...)
			tr := &http.Transport{DialTLSContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				raw, err := (&net.Dialer{}).DialContext(ctx, network, addr.String())
				if err != nil {
					return nil, err
				}
				c := tls.Client(raw, &tls.Config{MinVersion: tls.VersionTLS13, ServerName: booksID, Certificates: []tls.Certificate{cert},
					InsecureSkipVerify: true}) // the server's side is not under test
				if err := c.HandshakeContext(ctx); err != nil {
					raw.Close()
					return nil, err
				}
				return c, nil
			}}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: testutil.Timeout}).Get("https://books.default.svc.cluster.local/")
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, tc.want, string(body))
		})
	}
}

func TestURIIdentityWithServerName(t *testing.T) {
	const spiffeID, serverName, authority = "spiffe://root.linkerd.cluster.local/proxy-harness", "ew.external.svc", "ew.default.svc.cluster.local:7000"
	p := newPKI(t)
	cert := testutil.URILeaf(t, p.root.Cert, p.root.Key, spiffeID)
	sni := make(chan string, 4)
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS13,
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			sni <- h.ServerName
			return &cert, nil
		}})
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }), ErrorLog: quietLog}
	go srv.Serve(lis)
	defer srv.Close()
	addr := netip.MustParseAddrPort(lis.Addr().String())
	for _, tc := range []struct {
		name     string
		ep       endpoint.Endpoint
		wantSNI  string
		identity bool // fails with an identity error
	}{
		{"server name and URI identity", endpoint.Endpoint{Addr: addr, Identity: spiffeID, ServerName: serverName}, serverName, false},
		{"another URI identity", endpoint.Endpoint{Addr: addr, Identity: "spiffe://root.linkerd.cluster.local/other", ServerName: serverName}, serverName, true},
		{"a DNS identity the certificate lacks", endpoint.Endpoint{Addr: addr, Identity: booksID}, booksID, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{authority: {tc.ep}})
			require.NoError(t, err)
			client := NewClient(WithEndpoints(eps), WithIdentity(p.certify(t, webID)), WithMeterProvider(noop.NewMeterProvider()),
				WithLogger(quiet), WithBalancerOptions(balancer.WithFallback(false)))
			defer client.Close()
			r, err := (&http.Client{Transport: client, Timeout: testutil.Timeout}).Get("http://" + authority + "/")
			if tc.identity {
				var idErr *identity.IdentityError
				assert.ErrorAs(t, err, &idErr)
			} else if assert.NoError(t, err, "the endpoint proves its URI identity") {
				r.Body.Close()
			}
			assert.Equal(t, tc.wantSNI, <-sni, "SNI")
		})
	}
}

// A request whose context ends while the identity has no certificate yet
// leaves nothing behind: no dial goes on waiting for the certificate (net/http
// dials under a context the request's end does not cancel), so none
// connects when it comes, and one request then makes one connection.
func TestRequestsBeforeTheCertificateLeaveNoDials(t *testing.T) {
	p := newPKI(t)
	server := NewServer(http.NotFoundHandler(), WithIdentity(p.certify(t, booksID)), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer server.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var accepted atomic.Int32
	srv := origproto.NewServer(server)
	srv.ErrorLog = quietLog
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	go srv.Serve(server.Listener(lis))
	defer srv.Close()
	const books = "books.default.svc.cluster.local:7000"
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		books: {{Addr: netip.MustParseAddrPort(lis.Addr().String()), Identity: booksID}}})
	require.NoError(t, err)
	web, err := identity.NewLocal(webID, p.anchors)
	require.NoError(t, err)
	client := NewClient(WithEndpoints(eps), WithIdentity(web), WithMeterProvider(noop.NewMeterProvider()),
		WithLogger(quiet), WithBalancerOptions(balancer.WithFallback(false)))
	defer client.Close()
	// waiting counts the goroutines blocked waiting for the certificate
	// (not those passing through Wait with one: other tests run beside).
	waiting := func() int {
		buf := make([]byte, 1<<22)
		n := 0
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, "identity.(*Local).Wait(") {
				n++
			}
		}
		return n
	}
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+books+"/", nil)
		_, err := client.RoundTrip(req)
		cancel()
		assert.ErrorIs(t, err, identity.ErrNotReady)
	}
	assert.Zero(t, waiting(), "goroutines still waiting for the certificate after their requests ended")
	require.NoError(t, p.issuer.CertifyLocal(web))
	resp, err := (&http.Client{Transport: client, Timeout: testutil.Timeout}).Get("http://" + books + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, int32(1), accepted.Load(), "connections for one request after the certificate")
}
