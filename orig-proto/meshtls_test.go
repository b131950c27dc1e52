package origproto

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/proxyapi/identitypb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	booksID   = "books.default.serviceaccount.identity.linkerd.cluster.local"
	authorsID = "authors.default.serviceaccount.identity.linkerd.cluster.local"
)

// certifiedPair returns two identities certified by one issuer in process.
func certifiedPair(t testing.TB) (server, client *identity.Local, anchors *x509.CertPool) {
	server, client, anchors, _, _ = certifiedPairWithIssuer(t)
	return server, client, anchors
}

func certifiedPairWithIssuer(t testing.TB) (server, client *identity.Local, anchors *x509.CertPool, issuer *controlplane.Issuer, root *controlplane.CA) {
	t.Helper()
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("issuer", time.Hour)
	require.NoError(t, err)
	anchors = x509.NewCertPool()
	anchors.AddCert(root.Cert)
	issuer, err = controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key,
		controlplane.StaticTokens{"b": booksID, "a": authorsID}, controlplane.WithIssuerLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	certify := func(name, token string) *identity.Local {
		l, err := identity.NewLocal(name, anchors)
		require.NoError(t, err)
		resp, err := issuer.Certify(context.Background(), identityRequest(l, token))
		require.NoError(t, err)
		require.NoError(t, l.SetCertificate(resp.LeafCertificate, resp.IntermediateCertificates))
		return l
	}
	return certify(booksID, "b"), certify(authorsID, "a"), anchors, issuer, root
}

// meshTLSServer serves an application that reports what it saw of each
// request, on one port for meshed mTLS and plaintext, and returns the
// address.
func meshTLSServer(t *testing.T, local *identity.Local) string {
	t.Helper()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := identity.PeerFromContext(r.Context())
		w.Header().Set("X-Seen", strings.Join([]string{r.Proto, r.Header.Get(ClientIDHeader), boolString(ok && p.TLS)}, "|"))
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(NewHandler(app))
	srv.ErrorLog = quietLogger
	go srv.Serve(GuardListener(MeshTLSListener(lis, local)))
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

func boolString(b bool) string {
	if b {
		return "tls"
	}
	return "plain"
}

// seenVia sends a GET through rt and returns what the application saw.
func seenVia(t *testing.T, rt http.RoundTripper, url string, h http.Header) string {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := rt.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.Header.Get("X-Seen")
}

// One port serves meshed mTLS (HTTP/1, and HTTP/2 with prior knowledge
// inside it) and plaintext (HTTP/1 and h2c): the application sees the
// client's verified identity in l5d-client-id and its context, and never a
// l5d-client-id a client sent itself.
func TestMeshTLSListener(t *testing.T) {
	server, client, _ := certifiedPair(t)
	addr := meshTLSServer(t, server)
	forged := http.Header{ClientIDHeader: {"admin.default.serviceaccount.identity.linkerd.cluster.local"}}

	h1TLS := &http.Transport{TLSClientConfig: client.ClientConfig(booksID)}
	defer h1TLS.CloseIdleConnections()
	assert.Equal(t, "HTTP/1.1|"+authorsID+"|tls", seenVia(t, h1TLS, "https://"+addr+"/", forged))

	// HTTP/2 with prior knowledge inside mTLS, as Linkerd's proxies send it.
	h2TLS := &http.Transport{Protocols: new(http.Protocols)}
	h2TLS.Protocols.SetUnencryptedHTTP2(true)
	h2TLS.DialContext = func(ctx context.Context, network, a string) (net.Conn, error) {
		raw, err := (&net.Dialer{}).DialContext(ctx, network, a)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(raw, client.ClientConfig(booksID))
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return struct{ net.Conn }{tc}, nil // not a *tls.Conn: no ALPN needed
	}
	defer h2TLS.CloseIdleConnections()
	assert.Equal(t, "HTTP/2.0|"+authorsID+"|tls", seenVia(t, h2TLS, "http://"+addr+"/", forged))

	// A TLS client without a certificate is served, without an identity.
	anonymous, err := identity.NewLocal("anonymous.default.serviceaccount.identity.linkerd.cluster.local", server.Anchors())
	require.NoError(t, err)
	anon := &http.Transport{TLSClientConfig: anonymous.ClientConfig(booksID)}
	defer anon.CloseIdleConnections()
	assert.Equal(t, "HTTP/1.1||tls", seenVia(t, anon, "https://"+addr+"/", forged))

	for _, mode := range []testutil.Mode{testutil.H1, testutil.H2C} {
		plain := testutil.NewTransport(t, mode)
		want := "HTTP/1.1||plain"
		if mode == testutil.H2C {
			want = "HTTP/2.0||plain"
		}
		assert.Equal(t, want, seenVia(t, plain, "http://"+addr+"/", forged), "plaintext %v", mode)
	}

	// A ClientHello for another name fails its handshake.
	other := &http.Transport{TLSClientConfig: client.ClientConfig(authorsID)}
	defer other.CloseIdleConnections()
	req, _ := http.NewRequest("GET", "https://"+addr+"/", nil)
	_, err = other.RoundTrip(req)
	assert.Error(t, err)
}

// The detection of the first bytes never panics and never hangs on
// arbitrary bytes in arbitrary pieces; a plaintext request still reads
// back whole.
func FuzzMeshConnDetect(f *testing.F) {
	server, _, _ := certifiedPair(f)
	ml := MeshTLSListener(nil, server).(*meshTLSListener)
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), uint8(3))
	f.Add([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), uint8(1))
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00}, uint8(2))
	f.Add([]byte{0x16}, uint8(1))
	f.Add([]byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, piece uint8) {
		a, b := net.Pipe()
		defer a.Close()
		c := &meshConn{Conn: b, cfg: ml.cfg}
		defer c.Close()
		// The client writes its bytes in pieces and reads whatever comes back
		// (a TLS alert): net.Pipe has no buffer, unlike a socket.
		go func() { _, _ = io.Copy(io.Discard, a) }()
		go func() {
			defer a.Close()
			step := int(piece)%7 + 1
			for i := 0; i < len(data); i += step {
				a.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := a.Write(data[i:min(i+step, len(data))]); err != nil {
					return
				}
			}
		}()
		b.SetDeadline(time.Now().Add(5 * time.Second))
		got, _ := io.ReadAll(bufio.NewReader(c))
		if len(data) > 0 && data[0] != tlsRecordHandshake {
			if string(got) != string(data) {
				t.Fatalf("plaintext read back as %q, sent %q", got, data)
			}
		}
	})
}

var quietLogger = log.New(io.Discard, "", 0)

func identityRequest(l *identity.Local, token string) *identitypb.CertifyRequest {
	return &identitypb.CertifyRequest{Identity: l.Name(), Token: []byte(token), CertificateSigningRequest: l.CSR()}
}

// A meshed client that expects another identity than the server's is told
// both: the server shows its certificate before it refuses the ClientHello
// for a name it is not, so the client names the identity it expected and
// the one it was shown (not "remote error: tls: internal error"), and the
// server logs the refusal with both names. Not parallel: the refusal goes
// to slog.Default().
func TestMeshTLSRefusalNamesBothIdentities(t *testing.T) {
	var logs testutil.LogLines
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(logs.Logger())
	server, client, _ := certifiedPair(t)
	addr := meshTLSServer(t, server)

	c, err := tls.Dial("tcp", addr, client.ClientConfig(authorsID))
	if err == nil {
		c.Close()
	}
	var idErr *identity.IdentityError
	require.ErrorAs(t, err, &idErr)
	assert.Equal(t, authorsID, idErr.Expected)
	assert.Equal(t, booksID, idErr.Presented)
	assert.ErrorIs(t, err, identity.ErrWrongName)
	assert.Contains(t, err.Error(), "cannot verify the server as "+authorsID+": it presented "+booksID)
	assert.NotContains(t, err.Error(), "internal error")
	require.Eventually(t, func() bool {
		return logs.Count("refused a meshed TLS connection for another identity", "requested="+authorsID, "local="+booksID) == 1
	}, 10*time.Second, 5*time.Millisecond, logs.String())

	// A client that does not verify what it is shown gets no further: the
	// server refuses the handshake once it has shown its certificate.
	blind := &tls.Config{ServerName: authorsID, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	c, err = tls.Dial("tcp", addr, blind)
	if err == nil {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Write([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
		if err == nil {
			_, err = c.Read(make([]byte, 1))
		}
		c.Close()
	}
	assert.Error(t, err, "served a client asking for another identity")
}

// A ClientHello's server name is the client's to choose, up to 64 KiB: the
// refusal's line (and the key it is rate-limited by) keeps a bounded part
// of it, so that clients sending distinct long names cannot make the
// server keep or print megabytes. Not parallel: the refusal goes to
// slog.Default().
func TestMeshTLSRefusalBoundsTheRequestedName(t *testing.T) {
	var logs testutil.LogLines
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(logs.Logger())
	server, _, _ := certifiedPair(t)
	addr := meshTLSServer(t, server)

	long := strings.Repeat("a", 60000)
	c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: long, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err == nil {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = c.Read(make([]byte, 1))
		c.Close()
	}
	require.Eventually(t, func() bool {
		return logs.Count("refused a meshed TLS connection for another identity") == 1
	}, 10*time.Second, 5*time.Millisecond, "no refusal logged")
	assert.Less(t, len(logs.String()), 2048, "the line holds the whole requested name")
}
