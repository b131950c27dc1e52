package mesh

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	xcredentials "google.golang.org/grpc/experimental/credentials"
)

// With certificates of a twenty-second lifetime, both peers renew them from
// the issuer (over the Identity API, on Linkerd's schedule: at 70% of the
// life left) three times while requests flow without a pause: no request
// fails, and new connections see each new certificate.
func TestRenewalUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 45 seconds")
	}
	t.Parallel()
	const lifetime = 20 * time.Second
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("issuer", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	svcName := controlplane.IdentityServiceName("linkerd", "cluster.local")
	issuer, err := controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key,
		controlplane.StaticTokens{"books": booksID, "web": webID},
		controlplane.WithIssuanceLifetime(lifetime), controlplane.WithClockSkew(0), controlplane.WithIssuerLogger(quiet))
	require.NoError(t, err)
	svc, err := identity.NewLocal(svcName, anchors)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel()
	bg.Add(1)
	go func() { defer bg.Done(); issuer.KeepCertified(ctx, svc) }()
	<-svc.Ready()
	gs := grpc.NewServer(grpc.Creds(xcredentials.NewTLSWithALPNDisabled(svc.ServerConfig())))
	issuer.Register(gs)
	idLis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go gs.Serve(idLis)
	defer gs.Stop()

	certified := func(name, token string) *identity.Local {
		l, err := identity.NewLocal(name, anchors)
		require.NoError(t, err)
		cc, err := grpc.NewClient("passthrough:///"+idLis.Addr().String(), grpc.WithTransportCredentials(l.TransportCredentials(svcName)))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		tokenFile := filepath.Join(t.TempDir(), "token")
		require.NoError(t, os.WriteFile(tokenFile, []byte(token), 0o600))
		c := identity.NewCertifier(l, cc, tokenFile, identity.WithLogger(quiet), identity.WithRefreshBounds(time.Second, time.Hour))
		bg.Add(1)
		go func() { defer bg.Done(); _ = c.Run(ctx) }()
		select {
		case <-l.Ready():
		case <-time.After(testutil.Timeout):
			t.Fatal("never certified")
		}
		return l
	}
	serverID, clientID := certified(booksID, "books"), certified(webID, "web")

	server := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("L5d-Client-Id"))
	}), WithIdentity(serverID), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer server.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := origproto.NewServer(server)
	srv.ErrorLog = quietLog
	go srv.Serve(server.Listener(lis))
	defer srv.Close()
	const books = "books.default.svc.cluster.local:7000"
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		books: {{Addr: netip.MustParseAddrPort(lis.Addr().String()), H2: true, Identity: booksID}},
	})
	require.NoError(t, err)
	client := NewClient(WithEndpoints(eps), WithIdentity(clientID), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: testutil.Timeout}

	var sent, failed atomic.Int64
	var lastErr atomic.Value
	load, stopLoad := context.WithCancel(ctx)
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		// A request every 2 ms or as fast as they go, whichever is slower:
		// continuous, without taking a core from the tests beside it.
		pace := time.NewTicker(2 * time.Millisecond)
		defer pace.Stop()
		for load.Err() == nil {
			select {
			case <-pace.C:
			case <-load.Done():
				return
			}
			resp, err := hc.Get("http://" + books + "/")
			sent.Add(1)
			if err != nil {
				failed.Add(1)
				lastErr.Store(err.Error())
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != webID {
				failed.Add(1)
				lastErr.Store(resp.Status + " " + string(b))
			}
		}
	}()

	// New connections (a TLS handshake of their own) see the server's
	// current certificate: wait for three after the first.
	serials := map[string]bool{}
	deadline := time.Now().Add(4 * lifetime)
	for len(serials) < 4 && time.Now().Before(deadline) {
		c, err := tls.Dial("tcp", lis.Addr().String(), clientID.ClientConfig(booksID))
		require.NoError(t, err, "a new connection during the renewals")
		serials[c.ConnectionState().PeerCertificates[0].SerialNumber.String()] = true
		c.Close()
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
	stopLoad()
	<-loaded
	assert.GreaterOrEqual(t, len(serials), 4, "three renewals of the server's certificate seen on new connections")
	assert.Zero(t, failed.Load(), "failed requests of %d (last: %v)", sent.Load(), lastErr.Load())
	t.Logf("%d requests, %d server certificates", sent.Load(), len(serials))
}
