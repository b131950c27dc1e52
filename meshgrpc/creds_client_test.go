package meshgrpc_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	xcredentials "google.golang.org/grpc/experimental/credentials"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// certified returns a local identity certified by a new issuer of dir's
// anchors.
func certified(t *testing.T, d *controlplane.IdentityDir, name string) *identity.Local {
	t.Helper()
	issuer, err := controlplane.NewIssuer(d.Anchors, d.Chain, d.Key, controlplane.StaticTokens{})
	require.NoError(t, err)
	l, err := identity.NewLocal(name, d.Anchors)
	require.NoError(t, err)
	require.NoError(t, issuer.CertifyLocal(l))
	return l
}

// mTLS to an endpoint whose identity discovery gives: the server proves
// that identity and sees the client's; an endpoint advertised with
// another identity than its certificate's fails UNAVAILABLE naming the
// identity, and gets no call; one without an identity is reached in
// plaintext.
func TestMTLS(t *testing.T) {
	d, _, err := controlplane.LoadIdentityDir(t.TempDir())
	require.NoError(t, err)
	server := certified(t, d, booksID)
	client := certified(t, d, webID)

	var clientID string
	seen := make(chan string, 1)
	a := startApp(t, &app{handle: func(ctx context.Context, _ int64) error {
		p, _ := peer.FromContext(ctx)
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			select {
			case seen <- identity.PeerIdentity(ti.State.PeerCertificates[0]):
			default:
			}
		}
		return nil
	}}, xcredentials.NewTLSWithALPNDisabled(server.ServerConfig()))

	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr, Identity: booksID}}})
	c := dial(t, serveStore(t, store), meshgrpc.WithIdentity(client))
	_, err = c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	require.NoError(t, err)
	select {
	case clientID = <-seen:
	case <-time.After(testutil.Timeout):
		t.Fatal("no call seen")
	}
	assert.Equal(t, webID, clientID, "the server verified the client's certificate")

	// The same server advertised as someone else.
	b := startApp(t, &app{}, xcredentials.NewTLSWithALPNDisabled(server.ServerConfig()))
	store2 := controlplane.NewStore()
	store2.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: b.addr, Identity: "impostor.default.serviceaccount.identity.linkerd.cluster.local"}}})
	// Its calls fail fast, naming the failed handshake.
	c2 := dial(t, serveStore(t, store2), meshgrpc.WithIdentity(client),
		meshgrpc.WithBalancerOptions(balancer.WithQueue(0, testutil.ShortTimeout)))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	_, err = c2.EmptyCall(ctx, &testgrpc.Empty{})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.NoError(t, ctx.Err())
	assert.Contains(t, status.Convert(err).Message(), "impostor.default")
	assert.Zero(t, b.calls.Load())

	// An endpoint without an identity is reached in plaintext.
	plain := startApp(t, &app{}, nil)
	store3 := controlplane.NewStore()
	store3.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: plain.addr}}})
	c3 := dial(t, serveStore(t, store3), meshgrpc.WithIdentity(client))
	_, err = c3.EmptyCall(callCtx(t), &testgrpc.Empty{})
	require.NoError(t, err)
	assert.Equal(t, int64(1), plain.calls.Load())
}

// When discovery changes an endpoint's identity, the connection verified
// for the old one is not reused: calls fail fast once the server cannot
// prove the new identity.
func TestIdentityChange(t *testing.T) {
	d, _, err := controlplane.LoadIdentityDir(t.TempDir())
	require.NoError(t, err)
	server := certified(t, d, booksID)
	client := certified(t, d, webID)
	a := startApp(t, &app{}, xcredentials.NewTLSWithALPNDisabled(server.ServerConfig()))
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr, Identity: booksID}}})
	c := dial(t, serveStore(t, store), meshgrpc.WithIdentity(client),
		meshgrpc.WithBalancerOptions(balancer.WithQueue(0, testutil.ShortTimeout)))
	_, err = c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	require.NoError(t, err)

	store.PutEndpoints(books, []endpoint.Endpoint{{Addr: a.addr, Identity: "impostor.default.serviceaccount.identity.linkerd.cluster.local"}})
	require.Eventually(t, func() bool {
		_, err = c.EmptyCall(callCtx(t), &testgrpc.Empty{})
		return status.Code(err) == codes.DeadlineExceeded
	}, testutil.Timeout, 10*time.Millisecond)
	assert.Contains(t, status.Convert(err).Message(), "impostor.default")
}

// A client whose identity has no certificate yet opens no meshed
// connection: grpc-go would keep one made without the certificate for
// the channel's life, and the server would see an anonymous caller after
// the certificate came. A call whose deadline ends first fails without
// reaching the server; one made before the certificate and those after
// it carry the identity.
func TestFirstCallsWaitForTheCertificate(t *testing.T) {
	e := newEnv(t)
	web, err := identity.NewLocal(webID, e.pki.anchors)
	require.NoError(t, err)
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: netip.MustParseAddrPort(e.addr), Identity: booksID}}})
	c := dial(t, serveStore(t, store), meshgrpc.WithIdentity(web))

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err = c.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	cancel()
	assert.Error(t, err, "a call before the certificate")

	waiting := make(chan string, 1)
	go func() {
		resp, err := c.UnaryCall(ctxT(t), &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		if err != nil {
			waiting <- err.Error()
			return
		}
		waiting <- resp.GetUsername()
	}()
	require.NoError(t, e.pki.issuer.CertifyLocal(web))
	assert.Equal(t, webID, <-waiting, "the call made before the certificate")
	for i := range 3 {
		resp, err := c.UnaryCall(ctxT(t), &testgrpc.SimpleRequest{})
		require.NoError(t, err)
		assert.Equal(t, webID, resp.GetUsername(), "call %d after the certificate", i)
	}
}

// An endpoint with a URI (SPIFFE) identity and a server name, as Linkerd's
// destination controller describes an external workload: the channel's
// connection sends the server name as SNI and verifies the URI identity.
func TestURIIdentityWithServerName(t *testing.T) {
	const spiffeID, serverName = "spiffe://root.linkerd.cluster.local/proxy-harness", "ew.external.svc"
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	cert := testutil.URILeaf(t, root.Cert, root.Key, spiffeID)
	sni := make(chan string, 8)
	a := startApp(t, &app{}, xcredentials.NewTLSWithALPNDisabled(&tls.Config{MinVersion: tls.VersionTLS13,
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			select {
			case sni <- h.ServerName:
			default:
			}
			return &cert, nil
		}}))
	iss, err := controlplane.NewIssuer(anchors, [][]byte{root.DER}, root.Key, controlplane.StaticTokens{}, controlplane.WithIssuerLogger(quiet))
	require.NoError(t, err)
	web, err := identity.NewLocal(webID, anchors)
	require.NoError(t, err)
	require.NoError(t, iss.CertifyLocal(web))
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr, Identity: spiffeID, ServerName: serverName}}})
	c := dial(t, serveStore(t, store), meshgrpc.WithIdentity(web))
	_, err = c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	require.NoError(t, err, "the endpoint proves its URI identity")
	assert.Equal(t, serverName, <-sni)
}
