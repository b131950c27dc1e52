package identity_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	xcredentials "google.golang.org/grpc/experimental/credentials"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	books    = "books.default.serviceaccount.identity.linkerd.cluster.local"
	authors  = "authors.default.serviceaccount.identity.linkerd.cluster.local"
	svcName  = "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"
	timeout  = 30 * time.Second
	booksTok = "books-token"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// mesh is a trust chain, the embedded issuer serving Certify over TLS with
// the identity service's own identity on loopback, and a token per
// identity.
type mesh struct {
	anchors *x509.CertPool
	issuer  *controlplane.Issuer
	addr    string
	tokens  controlplane.StaticTokens
	rootPEM []byte // the trust anchor, PEM
}

func newMesh(t *testing.T, opts ...controlplane.IssuerOption) *mesh {
	t.Helper()
	root, err := controlplane.NewRootCA("root.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("identity.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	m := &mesh{anchors: x509.NewCertPool(), tokens: controlplane.StaticTokens{
		booksTok: books, "authors-token": authors, "svc-token": svcName,
	}}
	m.anchors.AddCert(root.Cert)
	m.rootPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.DER})
	m.issuer, err = controlplane.NewIssuer(m.anchors, [][]byte{iss.DER}, iss.Key, m.tokens,
		append([]controlplane.IssuerOption{controlplane.WithIssuerLogger(quiet)}, opts...)...)
	require.NoError(t, err)

	// The identity service's own certificate, from its own issuer.
	svc := m.certified(t, svcName, "svc-token")
	srv := grpc.NewServer(grpc.Creds(xcredentials.NewTLSWithALPNDisabled(svc.ServerConfig())))
	m.issuer.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	m.addr = lis.Addr().String()
	return m
}

// certified returns the local identity name, certified in process.
func (m *mesh) certified(t *testing.T, name, token string) *identity.Local {
	t.Helper()
	l, err := identity.NewLocal(name, m.anchors)
	require.NoError(t, err)
	c := identity.NewCertifier(l, m.dial(t, l), m.tokenFile(t, token), identity.WithLogger(quiet))
	if m.addr == "" { // bootstrapping the service itself
		resp, err := m.issuer.Certify(context.Background(), certifyRequest(l, token))
		require.NoError(t, err)
		require.NoError(t, l.SetCertificate(resp.LeafCertificate, resp.IntermediateCertificates))
		return l
	}
	require.NoError(t, c.Certify(context.Background()))
	return l
}

func (m *mesh) dial(t *testing.T, l *identity.Local) *grpc.ClientConn {
	t.Helper()
	addr := m.addr
	if addr == "" {
		addr = "127.0.0.1:1" // never dialled: grpc connects lazily
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(l.TransportCredentials(svcName)))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return cc
}

func (m *mesh) tokenFile(t *testing.T, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(p, []byte(token+"\n"), 0o600))
	return p
}

func TestNewLocal(t *testing.T) {
	pool := x509.NewCertPool()
	l, err := identity.NewLocal(books, pool)
	require.NoError(t, err)
	csr, err := x509.ParseCertificateRequest(l.CSR())
	require.NoError(t, err)
	assert.Equal(t, []string{books}, csr.DNSNames, "exactly the identity as its one DNS SAN")
	assert.Equal(t, books, csr.Subject.CommonName)
	assert.Empty(t, csr.IPAddresses)
	assert.Empty(t, csr.URIs)
	assert.Equal(t, x509.ECDSA, csr.PublicKeyAlgorithm)
	assert.Nil(t, l.Certificate(), "no certificate before one is installed")
	select {
	case <-l.Ready():
		t.Fatal("ready without a certificate")
	default:
	}
	for _, bad := range []string{"", "Books.default", "books.default.", "a..b", "-a.b", "a_b.c", string(make([]byte, 254))} {
		_, err := identity.NewLocal(bad, pool)
		assert.ErrorIs(t, err, identity.ErrInvalidName, "%q", bad)
	}
	_, err = identity.NewLocal(books, nil)
	assert.ErrorIs(t, err, identity.ErrNoAnchors)
}

// The Certify client obtains a certificate from the issuer over TLS,
// verified against the anchors and the service's identity; the local
// identity is ready then, and the certificate carries its name.
func TestCertifyOverTLS(t *testing.T) {
	m := newMesh(t)
	l := m.certified(t, books, booksTok)
	select {
	case <-l.Ready():
	default:
		t.Fatal("not ready after a certificate")
	}
	leaf := l.Certificate().Leaf
	assert.Equal(t, []string{books}, leaf.DNSNames)
	assert.Len(t, l.Certificate().Certificate, 2, "leaf and issuer")
}

// A token for another service account is refused, and the identity stays
// not ready.
func TestCertifyRefusesAnotherServiceAccount(t *testing.T) {
	m := newMesh(t)
	l, err := identity.NewLocal(books, m.anchors)
	require.NoError(t, err)
	c := identity.NewCertifier(l, m.dial(t, l), m.tokenFile(t, "authors-token"), identity.WithLogger(quiet))
	err = c.Certify(context.Background())
	assert.Equal(t, codes.FailedPrecondition, status.Code(errors.Unwrap(err)), "%v", err)
	assert.Nil(t, l.Certificate())
}

// The Certify client refuses an identity service that is not the one
// named: another certified workload serving Certify is not trusted.
func TestCertifyChecksTheServiceIdentity(t *testing.T) {
	m := newMesh(t)
	impostor := m.certified(t, authors, "authors-token")
	srv := grpc.NewServer(grpc.Creds(xcredentials.NewTLSWithALPNDisabled(impostor.ServerConfig())))
	m.issuer.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(lis)
	defer srv.Stop()
	l, err := identity.NewLocal(books, m.anchors)
	require.NoError(t, err)
	cc, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(l.TransportCredentials(svcName)))
	require.NoError(t, err)
	defer cc.Close()
	err = identity.NewCertifier(l, cc, m.tokenFile(t, booksTok)).Certify(context.Background())
	assert.ErrorContains(t, err, "cannot verify the server as "+svcName)
	assert.Nil(t, l.Certificate())
}

// Run retries until the token appears, reading the file anew each time, and
// the identity becomes ready.
func TestRunReadsTheTokenEachTime(t *testing.T) {
	m := newMesh(t)
	l, err := identity.NewLocal(books, m.anchors)
	require.NoError(t, err)
	token := filepath.Join(t.TempDir(), "token")
	c := identity.NewCertifier(l, m.dial(t, l), token, identity.WithLogger(quiet), identity.WithRefreshBounds(20*time.Millisecond, time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.NoError(t, os.WriteFile(token, []byte(booksTok), 0o600))
	select {
	case <-l.Ready():
	case <-time.After(timeout):
		t.Fatal("never certified")
	}
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
}

// Linkerd's proxy's refresh schedule (linkerd2-proxy
// linkerd/proxy/identity-client/src/certify.rs, refresh_in): 70% of the
// time left, within the bounds; the minimum without a valid certificate.
func TestRefreshIn(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	const min, max = 10 * time.Second, 24 * time.Hour
	for _, tc := range []struct {
		left, want time.Duration
	}{
		{48 * time.Hour, max},
		{24*time.Hour + 20*time.Second, 16*time.Hour + 48*time.Minute + 14*time.Second}, // Linkerd's default lifetime and skew
		{10 * time.Hour, 7 * time.Hour},
		{time.Minute, 42 * time.Second},
		{5 * time.Second, min},
		{0, min},
		{-time.Hour, min},
	} {
		assert.Equal(t, tc.want, identity.RefreshIn(now, now.Add(tc.left), min, max), "%v left", tc.left)
	}
	assert.Equal(t, min, identity.RefreshIn(now, time.Time{}, min, max), "no certificate")
}

// mTLS between two certified identities over a real socket: the server sees
// the client's verified identity; a client expecting another identity
// refuses the server; a client without a certificate is served, without
// an identity; a renewal is presented on the next handshake while the
// connection made before it goes on.
func TestMutualTLS(t *testing.T) {
	m := newMesh(t)
	server := m.certified(t, books, booksTok)
	client := m.certified(t, authors, "authors-token")
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server.ServerConfig())
	require.NoError(t, err)
	defer lis.Close()
	peers := make(chan identity.Peer, 8)
	serials := make(chan string, 8)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				if tc.Handshake() != nil {
					return
				}
				cs := tc.ConnectionState()
				peers <- identity.PeerFromState(&cs)
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	dial := func(l *identity.Local, expect string) (*tls.Conn, error) {
		c, err := tls.Dial("tcp", lis.Addr().String(), l.ClientConfig(expect))
		if err == nil {
			serials <- c.ConnectionState().PeerCertificates[0].SerialNumber.String()
			_, err = c.Write([]byte("x")) // the server's side of the handshake completes
		}
		return c, err
	}

	first, err := dial(client, books)
	require.NoError(t, err)
	defer first.Close()
	assert.Equal(t, identity.Peer{TLS: true, ID: authors}, <-peers)
	firstSerial := <-serials

	_, err = dial(client, "reviews.default.serviceaccount.identity.linkerd.cluster.local")
	var idErr *identity.IdentityError
	require.ErrorAs(t, err, &idErr, "%v", err)
	assert.ErrorIs(t, err, identity.ErrWrongName)

	anonymous, err := identity.NewLocal("anonymous.default.serviceaccount.identity.linkerd.cluster.local", m.anchors)
	require.NoError(t, err)
	c, err := dial(anonymous, books)
	require.NoError(t, err)
	c.Close()
	assert.Equal(t, identity.Peer{TLS: true}, <-peers, "served, without an identity")
	<-serials

	// Renewal: a new certificate for the server, a new serial on the next
	// handshake, and the first connection still carries bytes.
	require.NoError(t, identity.NewCertifier(server, m.dial(t, server), m.tokenFile(t, booksTok)).Certify(context.Background()))
	c, err = dial(client, books)
	require.NoError(t, err)
	c.Close()
	<-peers
	assert.NotEqual(t, firstSerial, <-serials, "the renewed certificate")
	_, err = first.Write([]byte("y"))
	require.NoError(t, err)
	buf := make([]byte, 2)
	first.SetReadDeadline(time.Now().Add(timeout))
	_, err = io.ReadFull(first, buf)
	require.NoError(t, err)
	assert.Equal(t, "xy", string(buf))
}

// A certificate is installed only when it verifies.
func TestSetCertificateRefuses(t *testing.T) {
	m := newMesh(t)
	l, err := identity.NewLocal(books, m.anchors)
	require.NoError(t, err)
	other, err := identity.NewLocal(books, m.anchors)
	require.NoError(t, err)
	resp, err := m.issuer.Certify(context.Background(), certifyRequest(other, booksTok))
	require.NoError(t, err)
	assert.ErrorIs(t, l.SetCertificate(resp.LeafCertificate, resp.IntermediateCertificates), identity.ErrWrongKey)
	assert.ErrorIs(t, l.SetCertificate(resp.LeafCertificate, nil), identity.ErrUntrustedCrt, "no path to the anchors")
	authorsLocal, err := identity.NewLocal(authors, m.anchors)
	require.NoError(t, err)
	resp, err = m.issuer.Certify(context.Background(), certifyRequest(authorsLocal, "authors-token"))
	require.NoError(t, err)
	assert.ErrorIs(t, l.SetCertificate(resp.LeafCertificate, resp.IntermediateCertificates), identity.ErrWrongName)
	assert.Nil(t, l.Certificate())
}

func TestEnvFromLookup(t *testing.T) {
	full := map[string]string{
		identity.EnvLocalName:    books,
		identity.EnvTokenFile:    "/var/run/secrets/tokens/linkerd-identity-token",
		identity.EnvTrustAnchors: "-----BEGIN CERTIFICATE-----",
		identity.EnvSvcAddr:      "linkerd-identity-headless.linkerd.svc.cluster.local.:8080",
		identity.EnvSvcName:      svcName,
		identity.EnvMinRefresh:   "10s",
		identity.EnvMaxRefresh:   "1d",
	}
	lookup := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	env, ok, err := identity.EnvFromLookup(lookup(full))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, books, env.LocalName)
	assert.Equal(t, 10*time.Second, env.MinRefresh)
	assert.Equal(t, 24*time.Hour, env.MaxRefresh)

	_, ok, err = identity.EnvFromLookup(lookup(nil))
	assert.NoError(t, err)
	assert.False(t, ok, "no identity without a local name")

	for name, value := range map[string]string{identity.EnvMinRefresh: "soon", identity.EnvLocalName: "Books", identity.EnvSvcName: ""} {
		bad := map[string]string{}
		for k, v := range full {
			bad[k] = v
		}
		bad[name] = value
		_, _, err := identity.EnvFromLookup(lookup(bad))
		assert.ErrorContains(t, err, name)
	}
}

func TestParseAnchors(t *testing.T) {
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	bundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.DER})
	pool, err := identity.ParseAnchors(bundle)
	require.NoError(t, err)
	assert.True(t, pool.Equal(func() *x509.CertPool { p := x509.NewCertPool(); p.AddCert(root.Cert); return p }()))
	_, err = identity.ParseAnchors([]byte("nothing"))
	assert.ErrorIs(t, err, identity.ErrNoAnchors)
	_, err = identity.ParseAnchors(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}))
	assert.Error(t, err)
}

// The Certifier's metrics, with Linkerd's proxy's names and labels
// (linkerd2-proxy linkerd/identity/src/metrics.rs under the
// control_identity prefix): the expiry of the current certificate, the
// time of the last refresh, and refreshes counted by result.
func TestCertifierMetrics(t *testing.T) {
	m := newMesh(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	l, err := identity.NewLocal(books, m.anchors)
	require.NoError(t, err)
	token := m.tokenFile(t, "not-a-token")
	c := identity.NewCertifier(l, m.dial(t, l), token, identity.WithLogger(quiet), identity.WithMeterProvider(mp),
		identity.WithRefreshBounds(10*time.Millisecond, time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool { return counted(t, reader, "error") >= 1 }, timeout, 5*time.Millisecond)
	require.NoError(t, os.WriteFile(token, []byte(booksTok), 0o600))
	select {
	case <-l.Ready():
	case <-time.After(timeout):
		t.Fatal("never certified")
	}
	require.Eventually(t, func() bool { return counted(t, reader, "ok") == 1 }, timeout, 5*time.Millisecond)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	gauges := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if g, ok := mt.Data.(metricdata.Gauge[float64]); ok && len(g.DataPoints) == 1 {
				gauges[mt.Name] = g.DataPoints[0].Value
			}
		}
	}
	assert.InDelta(t, float64(l.Expiry().Unix()), gauges["control_identity_cert_expiration_timestamp_seconds"], 1)
	assert.NotZero(t, gauges["control_identity_cert_refresh_timestamp_seconds"])
	cancel()
	<-done
}

// A failed renewal while the certificate is still valid is tried again
// after the minimum refresh interval, not on the schedule of a success
// (70% of the time left, here an hour away): an Identity service that is
// back (here a token fixed) renews the certificate long before it expires.
func TestRunRetriesAFailedRenewalAfterTheMinimum(t *testing.T) {
	m := newMesh(t)
	l := m.certified(t, books, booksTok)
	first := l.Certificate().Leaf.SerialNumber.String()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	token := m.tokenFile(t, "not-a-token")
	c := identity.NewCertifier(l, m.dial(t, l), token, identity.WithLogger(quiet), identity.WithMeterProvider(mp),
		identity.WithRefreshBounds(10*time.Millisecond, time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return counted(t, reader, "error") >= 1 }, timeout, 5*time.Millisecond)
	require.NoError(t, os.WriteFile(token, []byte(booksTok), 0o600))
	require.Eventually(t, func() bool { return l.Certificate().Leaf.SerialNumber.String() != first }, timeout, 5*time.Millisecond,
		"the failed renewal was not tried again")
}

// A proxy whose certificate expired (a control plane away for longer
// than its lifetime) renews it as soon as the Identity service answers:
// it presents no client certificate rather than the expired one, which
// the service's TLS would refuse.
func TestCertifyAfterExpiry(t *testing.T) {
	root, err := controlplane.NewRootCA("root.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("identity.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	tokens := controlplane.StaticTokens{booksTok: books}
	// Leaves of one second (whole seconds: at most two) from the service;
	// its own certificate from a long-lived issuer of the same CA.
	short, err := controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key, tokens,
		controlplane.WithIssuanceLifetime(time.Second), controlplane.WithClockSkew(0), controlplane.WithIssuerLogger(quiet))
	require.NoError(t, err)
	long, err := controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key, tokens, controlplane.WithIssuerLogger(quiet))
	require.NoError(t, err)
	svc, err := identity.NewLocal(svcName, anchors)
	require.NoError(t, err)
	require.NoError(t, long.CertifyLocal(svc))
	srv := grpc.NewServer(grpc.Creds(xcredentials.NewTLSWithALPNDisabled(svc.ServerConfig())))
	short.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(lis)
	defer srv.Stop()

	m := &mesh{anchors: anchors, addr: lis.Addr().String()}
	l, err := identity.NewLocal(books, anchors)
	require.NoError(t, err)
	c := identity.NewCertifier(l, m.dial(t, l), m.tokenFile(t, booksTok), identity.WithLogger(quiet))
	require.NoError(t, c.Certify(context.Background()))
	first := l.Certificate().Leaf.SerialNumber.String()
	require.Eventually(t, func() bool { return time.Now().After(l.Expiry()) }, timeout, 10*time.Millisecond)
	// A new connection, as after the control plane's restart.
	c = identity.NewCertifier(l, m.dial(t, l), m.tokenFile(t, booksTok), identity.WithLogger(quiet))
	require.NoError(t, c.Certify(context.Background()), "renewing an expired certificate")
	assert.NotEqual(t, first, l.Certificate().Leaf.SerialNumber.String())
}

// counted returns control_identity_cert_refreshes_total{result}.
func counted(t *testing.T, reader *sdkmetric.ManualReader, result string) int64 {
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if s, ok := mt.Data.(metricdata.Sum[int64]); ok && mt.Name == "control_identity_cert_refreshes_total" {
				for _, dp := range s.DataPoints {
					if v, _ := dp.Attributes.Value("result"); v.AsString() == result {
						return dp.Value
					}
				}
			}
		}
	}
	return 0
}

// A first certification that fails (here: the token not yet written)
// says that there is no certificate yet, not that a current one stays in
// use, and is tried again from the start of a backoff (100ms, doubling up
// to the minimum refresh interval), not after the 10 s refresh interval:
// the identity is ready soon after the token appears.
func TestRunRetriesAFirstFailureFromTheBackoffStart(t *testing.T) {
	m := newMesh(t)
	var logs testutil.LogLines
	l, err := identity.NewLocal(books, m.anchors)
	require.NoError(t, err)
	token := filepath.Join(t.TempDir(), "token")
	c := identity.NewCertifier(l, m.dial(t, l), token, identity.WithLogger(logs.Logger()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return logs.Count("certification failed") >= 1 }, timeout, 5*time.Millisecond)
	assert.GreaterOrEqual(t, logs.Count("level=WARN", "no certificate yet, the identity is not ready", "identity="+books), 1, logs.String())
	assert.Zero(t, logs.Count("stays in use"), logs.String())
	require.NoError(t, os.WriteFile(token, []byte(booksTok), 0o600))
	start := time.Now()
	select {
	case <-l.Ready():
	case <-time.After(timeout):
		t.Fatal("never certified")
	}
	assert.Less(t, time.Since(start), identity.DefaultMinRefresh/2, "waited for the refresh interval")
}

// Trust anchors that are not the mesh's (the Identity service's chain
// does not lead to them) are named in an error line on each failure,
// with where they came from, beside the gRPC Unavailable the call gets.
func TestRunNamesTheAnchorsOfAnUntrustedService(t *testing.T) {
	m := newMesh(t)
	other, err := controlplane.NewRootCA("another.root", time.Hour)
	require.NoError(t, err)
	wrong := x509.NewCertPool()
	wrong.AddCert(other.Cert)
	var logs testutil.LogLines
	l, err := identity.NewLocal(books, wrong)
	require.NoError(t, err)
	c := identity.NewCertifier(l, m.dial(t, l), m.tokenFile(t, booksTok), identity.WithLogger(logs.Logger()),
		identity.WithAnchorsName("/etc/mesh/ca.crt"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool {
		return logs.Count("level=ERROR", "does not chain to the trust anchors", "anchors=/etc/mesh/ca.crt") >= 1
	}, timeout, 5*time.Millisecond, logs.String())
}

// A trust anchors file that holds no certificate is named in the error.
func TestReadAnchorsNamesTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(p, []byte("not a certificate\n"), 0o600))
	_, err := identity.ReadAnchors(p)
	assert.ErrorIs(t, err, identity.ErrNoAnchors)
	assert.ErrorContains(t, err, p)
	_, err = identity.ReadAnchors(filepath.Join(t.TempDir(), "missing.crt"))
	assert.ErrorContains(t, err, "missing.crt")
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.DER}), 0o600))
	pool, err := identity.ReadAnchors(p)
	require.NoError(t, err)
	assert.NotNil(t, pool)
}

// A workload whose certificate has expired makes and takes no meshed
// connection, on either side, as with Linkerd's proxy, whose certificate
// resolver presents the expired certificate to clients and servers alike
// and whose peers refuse it (linkerd2-proxy linkerd/meshtls/src/creds/
// store.rs CertResolver). As a server it shows the expired certificate and
// the client refuses it, naming the expiry; as a client its handshake
// fails, naming its own expiry, instead of going on without a certificate
// as an unauthenticated client. Its control-plane connection still
// presents none, so that it can renew (TestCertifyAfterExpiry).
func TestExpiredCertificateOnBothSides(t *testing.T) {
	root, err := controlplane.NewRootCA("root.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("identity.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	tokens := controlplane.StaticTokens{booksTok: books, "authors-token": authors}
	short, err := controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key, tokens,
		controlplane.WithIssuanceLifetime(time.Second), controlplane.WithClockSkew(0), controlplane.WithIssuerLogger(quiet))
	require.NoError(t, err)
	long, err := controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key, tokens, controlplane.WithIssuerLogger(quiet))
	require.NoError(t, err)
	expired, err := identity.NewLocal(books, anchors)
	require.NoError(t, err)
	require.NoError(t, short.CertifyLocal(expired))
	valid, err := identity.NewLocal(authors, anchors)
	require.NoError(t, err)
	require.NoError(t, long.CertifyLocal(valid))
	require.Eventually(t, func() bool { return time.Now().After(expired.Expiry()) }, timeout, 10*time.Millisecond)

	// serve accepts one connection with cfg and reports what its handshake
	// saw of the client.
	serve := func(cfg *tls.Config) (string, <-chan identity.Peer) {
		lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
		require.NoError(t, err)
		t.Cleanup(func() { lis.Close() })
		peers := make(chan identity.Peer, 1)
		go func() {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			tc := c.(*tls.Conn)
			tc.SetDeadline(time.Now().Add(timeout))
			if tc.Handshake() == nil {
				cs := tc.ConnectionState()
				peers <- identity.PeerFromState(&cs)
				return
			}
			close(peers)
		}()
		return lis.Addr().String(), peers
	}

	// The expired side as the server.
	addr, peers := serve(expired.ServerConfig())
	_, err = tls.Dial("tcp", addr, valid.ClientConfig(books))
	var idErr *identity.IdentityError
	require.ErrorAs(t, err, &idErr)
	assert.ErrorIs(t, err, identity.ErrExpired)
	assert.Equal(t, books, idErr.Presented)
	_, served := <-peers
	assert.False(t, served)

	// The expired side as the client.
	addr, peers = serve(valid.ServerConfig())
	c, err := tls.Dial("tcp", addr, expired.ClientConfig(authors))
	if err == nil {
		_, err = c.Write([]byte("x"))
		c.Close()
	}
	assert.ErrorIs(t, err, identity.ErrExpired)
	assert.ErrorContains(t, err, "the local certificate expired at "+expired.Expiry().UTC().Format(time.RFC3339))
	p, served := <-peers
	assert.False(t, served, "served as %+v", p)
}
