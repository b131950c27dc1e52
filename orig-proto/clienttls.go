package origproto

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/transport"
)

type serverIdentityKey struct{}

// WithServerIdentity returns a context saying that the endpoint a request
// goes to proves the identity name (discovery's tls_identity): with a
// client identity ([WithClientIdentity]) the Transport reaches it only
// over mTLS that verifies name, never in plaintext.
func WithServerIdentity(ctx context.Context, name string) context.Context {
	return WithServerTLS(ctx, name, "")
}

// WithServerTLS is [WithServerIdentity] with the TLS server name to send
// when it differs from the identity (discovery's server_name, a DNS name
// for a URI identity); an empty serverName is name.
func WithServerTLS(ctx context.Context, name, serverName string) context.Context {
	return context.WithValue(ctx, serverIdentityKey{}, &serverTLS{id: name, serverName: serverName})
}

// serverTLS is what WithServerTLS says of a request's endpoint. A context
// holds it by address, so that an [EndpointContext] answers with its own
// field at no allocation.
type serverTLS struct{ id, serverName string }

// serverTLSFrom returns what ctx says of its endpoint's TLS, the zero
// value when it says nothing.
func serverTLSFrom(ctx context.Context) serverTLS {
	if s, _ := ctx.Value(serverIdentityKey{}).(*serverTLS); s != nil {
		return *s
	}
	return serverTLS{}
}

// ServerIdentityFromContext returns the identity [WithServerIdentity] or
// [WithServerTLS] said, empty when they said nothing.
func ServerIdentityFromContext(ctx context.Context) string {
	return serverTLSFrom(ctx).id
}

// WithClientIdentity makes the Transport a meshed client with the identity
// local: a request whose endpoint has an identity ([WithServerIdentity])
// goes over mTLS with it, HTTP/1 or HTTP/2 with prior knowledge inside
// (upgraded or not, as in plaintext), on connections of its own per
// server identity. A server that does not prove the identity fails the
// request with an *identity.IdentityError, and the connection is not
// used; the identity one proved is its tapped request's
// tap.Event.ServerID. Without this option, endpoint identities are
// ignored.
func WithClientIdentity(local *identity.Local) Option {
	return optionFunc(func(t *Transport) {
		if local != nil {
			t.tls = &tlsTransports{local: local, dial: t.dial, byID: make(map[serverTLS]*tlsPair)}
		}
	})
}

// WithDialContext sets how the Transport's own connections are dialled
// (its mTLS connections, under their handshake); nil changes nothing.
func WithDialContext(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return optionFunc(func(t *Transport) {
		if dial != nil {
			t.dial = dial
			if t.tls != nil {
				t.tls.dial = dial
			}
		}
	})
}

// maxTLSIdentities bounds the server identities whose connection pools a
// Transport keeps; past it the oldest pool is closed and dropped.
const maxTLSIdentities = 1024

// tlsTransports keeps an HTTP/1 and an HTTP/2 transport per server
// identity and server name, whose connections are mTLS to that identity.
type tlsTransports struct {
	local *identity.Local
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)

	mu    sync.Mutex
	byID  map[serverTLS]*tlsPair
	order []serverTLS
}

type tlsPair struct{ h1, h2 *http.Transport }

func (ts *tlsTransports) get(s serverTLS) *tlsPair {
	if s.serverName == s.id {
		s.serverName = "" // the same connections as without one
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if p := ts.byID[s]; p != nil {
		return p
	}
	if len(ts.order) >= maxTLSIdentities {
		old := ts.order[0]
		ts.order = ts.order[1:]
		ts.byID[old].closeIdle()
		delete(ts.byID, old)
	}
	dial := ts.dialer(s.id, s.serverName)
	p := &tlsPair{h1: transport.HTTP1(transport.Limits{}), h2: transport.H2(transport.Limits{})}
	p.h1.DialContext, p.h2.DialContext = dial, dial
	ts.byID[s] = p
	ts.order = append(ts.order, s)
	return p
}

func (p *tlsPair) closeIdle() {
	p.h1.CloseIdleConnections()
	p.h2.CloseIdleConnections()
}

func (ts *tlsTransports) closeIdle() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, p := range ts.byID {
		p.closeIdle()
	}
}

// dialer returns a dial function whose connections are mTLS to the server
// identity id. The connection it returns hides its TLS type, so that
// net/http speaks HTTP/1 or HTTP/2 with prior knowledge over it, as over
// plaintext, without ALPN.
func (ts *tlsTransports) dialer(id, serverName string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	cfg := ts.local.ClientConfigFor(id, serverName)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := ts.dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			var idErr *identity.IdentityError
			if !errors.As(err, &idErr) && ctx.Err() == nil {
				err = &identity.IdentityError{Expected: id, Err: err}
			}
			return nil, err
		}
		return &MeshTLSConn{Conn: tc}, nil
	}
}

// MeshTLSConn is a client connection of meshed mTLS, as the Transport
// dials it: its *tls.Conn is hidden so that net/http serves HTTP over it as
// over plaintext.
type MeshTLSConn struct{ net.Conn }

// ConnectionState returns the TLS state of the connection.
func (c *MeshTLSConn) ConnectionState() tls.ConnectionState {
	return c.Conn.(*tls.Conn).ConnectionState()
}
