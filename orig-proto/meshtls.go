package origproto

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/ratelog"
)

// MeshTLSListener returns a listener whose connections serve meshed mTLS
// and plaintext on one port, told apart by their first byte: a connection
// that opens with a TLS handshake record is a TLS client, whose ClientHello
// must name local's identity as SNI (another name fails the handshake);
// its TLS is terminated with local's [identity.Local.ServerConfig] and the
// HTTP inside is served as on plaintext (HTTP/1, or HTTP/2 with prior
// knowledge, which is what Linkerd's proxies send inside mTLS, with no
// ALPN). Anything else is served as plaintext, unchanged.
//
// Detection happens on the connection's first read, in the goroutine that
// serves it, so a slow or silent client holds nothing but its own
// connection; the server's read deadlines bound it. Wrap the result in
// [GuardListener] (the guard then sees the decrypted bytes) and serve it
// with [NewServer], which gives each request its peer
// ([identity.PeerFromContext]) and l5d-client-id.
func MeshTLSListener(ln net.Listener, local *identity.Local) net.Listener {
	return &meshTLSListener{Listener: ln, cfg: MeshTLSConfig(local)}
}

// MeshTLSConfig returns the TLS configuration with which
// [MeshTLSListener] terminates meshed TLS: local's
// [identity.Local.ServerConfig], refusing a ClientHello whose SNI is not
// local's identity, as Linkerd's proxy terminates only TLS for its own
// identity. The refusal comes after the server has shown its certificate,
// so that a meshed client can say which identity it expected and which it
// was shown ([identity.IdentityError]), and it is logged (slog.Default(),
// at most once per SNI and 10 seconds).
func MeshTLSConfig(local *identity.Local) *tls.Config {
	cfg := local.ServerConfig()
	name := local.Name()
	refused := ratelog.New(nil, 0)
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if hello.ServerName == name {
			return nil, nil
		}
		requested := hello.ServerName
		if len(requested) > maxLoggedName {
			// The client's to choose, up to 64 KiB: keep and print a
			// bounded part.
			requested = requested[:maxLoggedName] + "..."
		}
		refused.Warn("sni:"+requested, "identity: refused a meshed TLS connection for another identity",
			"requested", requested, "local", name, "client", remoteAddr(hello))
		other := cfg.Clone()
		other.GetConfigForClient = nil
		other.VerifyConnection = func(tls.ConnectionState) error {
			return fmt.Errorf("origproto: TLS for %q is not for the local identity %s", hello.ServerName, name)
		}
		return other, nil
	}
	return cfg
}

type meshTLSListener struct {
	net.Listener
	cfg *tls.Config
}

func (l *meshTLSListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &meshConn{Conn: c, cfg: l.cfg}, nil
}

// tlsRecordHandshake is the first byte of a TLS connection: the content
// type of the record that carries the ClientHello.
const tlsRecordHandshake = 0x16

// meshConn is a connection whose protocol (meshed TLS or plaintext) is
// decided by its first byte, on its first read or write.
type meshConn struct {
	net.Conn
	cfg *tls.Config

	once sync.Once
	err  error
	tls  *tls.Conn
	// closer is tls for Close, which the server calls from another
	// goroutine (Server.Close, Shutdown), maybe while detect runs.
	closer atomic.Pointer[tls.Conn]
	peer   identity.Peer
	// first is the byte read to decide, handed on by the next Read of a
	// plaintext connection.
	first    [1]byte
	hasFirst bool
}

// ErrTLSHandshake wraps the error of a meshed TLS handshake that failed.
var ErrTLSHandshake = errors.New("origproto: meshed TLS handshake failed")

func (c *meshConn) detect() {
	if _, err := io.ReadFull(c.Conn, c.first[:]); err != nil {
		c.err = err
		return
	}
	c.hasFirst = true
	if c.first[0] != tlsRecordHandshake {
		return
	}
	c.hasFirst = false
	c.tls = tls.Server(&prefixConn{Conn: c.Conn, prefix: c.first[:]}, c.cfg)
	c.closer.Store(c.tls)
	if err := c.tls.Handshake(); err != nil {
		c.err = fmt.Errorf("%w: %v", ErrTLSHandshake, err)
		return
	}
	cs := c.tls.ConnectionState()
	c.peer = identity.PeerFromState(&cs)
}

func (c *meshConn) Read(b []byte) (int, error) {
	c.once.Do(c.detect)
	switch {
	case c.err != nil:
		return 0, c.err
	case c.tls != nil:
		return c.tls.Read(b)
	case c.hasFirst:
		if len(b) == 0 {
			return 0, nil
		}
		b[0], c.hasFirst = c.first[0], false
		return 1, nil
	}
	return c.Conn.Read(b)
}

func (c *meshConn) Write(b []byte) (int, error) {
	c.once.Do(c.detect)
	switch {
	case c.err != nil:
		return 0, c.err
	case c.tls != nil:
		return c.tls.Write(b)
	}
	return c.Conn.Write(b)
}

func (c *meshConn) Close() error {
	if t := c.closer.Load(); t != nil {
		return t.Close()
	}
	return c.Conn.Close()
}

// NetConn returns the connection the listener accepted, under the
// meshed TLS, as tls.Conn's NetConn does.
func (c *meshConn) NetConn() net.Conn { return c.Conn }

// Peer returns what the connection's TLS says of the client: the zero Peer
// for plaintext.
func (c *meshConn) Peer() identity.Peer {
	c.once.Do(c.detect)
	return c.peer
}

// DetectErr returns the error that ended the detection of the
// connection's protocol (its first read, or its meshed TLS handshake), nil
// when it was detected; it detects first.
func (c *meshConn) DetectErr() error {
	c.once.Do(c.detect)
	return c.err
}

// prefixConn reads prefix before the rest of its connection.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// peerConn is a connection that knows its client's identity.
type peerConn interface{ Peer() identity.Peer }

type connKey struct{}

// peerOf returns the peer of the connection a request came on, as
// [NewServer] recorded it; the zero Peer for plaintext.
func peerOf(ctx context.Context) identity.Peer {
	if pc, ok := ctx.Value(connKey{}).(peerConn); ok {
		return pc.Peer()
	}
	return identity.Peer{}
}

// ClientIDHeader is the request header in which the inbound side gives the
// application its client's verified identity, as Linkerd's proxy does.
const ClientIDHeader = "L5d-Client-Id"

// withPeer returns r with its connection's peer in its context and
// l5d-client-id set to the client's verified identity, or removed when
// there is none (so that no client can send one of its own), as a header
// or as a trailer.
func withPeer(r *http.Request) *http.Request {
	p := peerOf(r.Context())
	_, sent := r.Header[ClientIDHeader]
	if !p.TLS && !sent {
		return guardTrailers(r, r, true)
	}
	ctx := r.Context()
	if p.TLS {
		ctx = identity.WithPeer(ctx, p)
	}
	out := withOwnHeader(r.WithContext(ctx))
	delete(out.Header, ClientIDHeader)
	if p.ID != "" {
		out.Header[ClientIDHeader] = []string{p.ID}
	}
	return guardTrailers(r, out, true)
}

// maxLoggedName bounds the bytes of a client's requested server name that
// a refusal keeps and logs: a DNS name is at most 253 bytes.
const maxLoggedName = 253

// remoteAddr returns the address of the client of hello, empty when
// unknown.
func remoteAddr(hello *tls.ClientHelloInfo) string {
	if hello.Conn == nil || hello.Conn.RemoteAddr() == nil {
		return ""
	}
	return hello.Conn.RemoteAddr().String()
}
