package origproto

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/proxyerr"
	"github.com/inmesh/inmesh/internal/transport"
	"github.com/inmesh/inmesh/tap"
)

type peerKey struct{}

// WithPeer returns a context saying whether the endpoint a request goes to
// is a mesh peer that accepts upgraded requests (discovery's h2 hint).
func WithPeer(ctx context.Context, peer bool) context.Context {
	return context.WithValue(ctx, peerKey{}, peer)
}

// EndpointContext is a context that says of the endpoint a request goes
// to what [WithPeer] says (Peer) and, once [EndpointContext.SetServerTLS]
// is called, what [WithServerTLS] says, with Context as its parent. It is
// for a per-request object that is allocated anyway: a field of it set
// and used by address is that context at no allocation of its own. Set it
// before first use and leave it unchanged after.
type EndpointContext struct {
	context.Context
	Peer bool
	tls  serverTLS // id "": it says nothing of the server's TLS
}

// SetServerTLS makes c say what WithServerTLS(c.Context, name, serverName)
// would; an empty name says nothing.
func (c *EndpointContext) SetServerTLS(name, serverName string) {
	c.tls = serverTLS{id: name, serverName: serverName}
}

// Value returns Peer for the key of [WithPeer], the server's TLS for that
// of [WithServerTLS] once set, and the parent's value for any other key.
func (c *EndpointContext) Value(key any) any {
	switch key.(type) {
	case peerKey:
		return c.Peer
	case serverIdentityKey:
		if c.tls.id != "" {
			return &c.tls
		}
	}
	return c.Context.Value(key)
}

// String names the context as context.WithValue's would.
func (c *EndpointContext) String() string {
	if c.tls.id != "" {
		return fmt.Sprintf("%v.WithValue(origproto.peerKey, %t).WithValue(origproto.serverIdentityKey, %s)", c.Context, c.Peer, c.tls.id)
	}
	return fmt.Sprintf("%v.WithValue(origproto.peerKey, %t)", c.Context, c.Peer)
}

// PeerFromContext returns what [WithPeer] said, and whether it said
// anything.
func PeerFromContext(ctx context.Context) (peer, ok bool) {
	peer, ok = ctx.Value(peerKey{}).(bool)
	return peer, ok
}

// Option configures a [Transport].
type Option interface{ apply(*Transport) }

type optionFunc func(*Transport)

func (f optionFunc) apply(t *Transport) { f(t) }

// WithHint sets how the transport decides, for a request whose context
// says nothing ([WithPeer]), whether its endpoint is a mesh peer. The
// default is never.
func WithHint(hint func(*http.Request) bool) Option {
	return optionFunc(func(t *Transport) {
		if hint != nil {
			t.hint = hint
		}
	})
}

// WithHTTP1 sets the transport of requests that are not upgraded (default:
// an HTTP/1 transport of its own, which closes idle connections after 90s
// and keeps at most 1,000 of them, 64 per host).
func WithHTTP1(rt http.RoundTripper) Option {
	return optionFunc(func(t *Transport) {
		if rt != nil {
			t.h1 = rt
		}
	})
}

// WithH2 sets the transport of upgraded requests and of those that must
// stay HTTP/2 ([HTTP2Only]); it must speak HTTP/2 without TLS (prior
// knowledge). The default is [NewH2Transport].
func WithH2(rt http.RoundTripper) Option {
	return optionFunc(func(t *Transport) {
		if rt != nil {
			t.h2 = rt
		}
	})
}

// Transport sends eligible HTTP/1 requests to mesh peers as HTTP/2 with
// l5d-orig-proto, requests that are HTTP/2 end to end ([HTTP2Only]: an
// HTTP/2 request, gRPC) as HTTP/2 to any endpoint, peer or not, and
// everything else through an HTTP/1 transport, untouched. A request with
// [RequireIDHeader] is sent without it, and only when its endpoint proves
// that identity over mTLS; otherwise it is answered 502 unsent. It is safe
// for concurrent use.
type Transport struct {
	h1, h2 http.RoundTripper
	hint   func(*http.Request) bool
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	tls    *tlsTransports // nil without a client identity
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport.
func NewTransport(opts ...Option) *Transport {
	t := &Transport{hint: func(*http.Request) bool { return false },
		dial: (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext}
	for _, o := range opts {
		if o != nil {
			o.apply(t)
		}
	}
	if t.h1 == nil {
		t.h1 = transport.HTTP1(transport.Limits{})
	}
	if t.h2 == nil {
		t.h2 = NewH2Transport()
	}
	return t
}

// NewH2Transport returns an HTTP/2 transport without TLS (prior knowledge)
// that keeps one connection per peer: dials to a peer are not made in
// parallel, so a burst of requests on a cold start shares one connection
// rather than racing to open many. A connection without streams for 90s is
// closed (set IdleConnTimeout on the result to change it). It asks for no
// compression and decodes none: responses come as the server encoded them.
func NewH2Transport() *http.Transport { return transport.H2(transport.Limits{}) }

// Eligible reports whether r may be upgraded: an HTTP/1.x request that is
// neither a CONNECT nor a protocol upgrade (other than h2c), nor one that
// must stay HTTP/2 ([HTTP2Only]), nor one whose header list HTTP/2 would
// count past a mesh peer's limit ([MaxUpgradedHeaderList]).
func Eligible(r *http.Request) bool {
	return r.ProtoMajor == 1 && !wantsUpgrade(r) && !IsGRPC(r) && headerListSize(r) <= MaxUpgradedHeaderList
}

// MaxUpgradedHeaderList is the largest header list, as HTTP/2 counts it
// (each field's name and value and 32 bytes), of a request that is
// upgraded: the 64 KiB of headers a peer's [NewServer] takes. HTTP/2's
// count of many small headers passes it long before their HTTP/1 bytes
// do; such a request goes to the peer as HTTP/1, which takes it, rather
// than fail in the client's own HTTP/2 transport, where it would count as
// the endpoint's failure.
const MaxUpgradedHeaderList = 64 << 10

// headerListSize is r's header list as HTTP/2 counts it, pseudo-headers
// and l5d-orig-proto included, with some slack for both.
func headerListSize(r *http.Request) int {
	n := 256 + len(r.Host) + len(r.URL.Path) + len(r.URL.RawQuery)
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 32
		}
	}
	return n
}

// HTTP2Only reports whether r must travel as HTTP/2 on every hop: it
// arrived as HTTP/2, or it is gRPC, which is defined over HTTP/2 only (a
// net/http-based gRPC client such as connect-go builds its requests with
// ProtoMajor 1 whatever the wire will be). Such a request passes every
// inmesh hop as HTTP/2, never with l5d-orig-proto; CONNECT is the
// exception, as net/http's transports do not tunnel it over HTTP/2.
func HTTP2Only(r *http.Request) bool {
	return (r.ProtoMajor == 2 || IsGRPC(r)) && r.Method != http.MethodConnect
}

// IsGRPC reports whether r is a gRPC request: its content-type is
// application/grpc, alone or with a +suffix or parameters. gRPC-Web
// (application/grpc-web), which runs over HTTP/1 too, is not.
func IsGRPC(r *http.Request) bool { return proxyerr.IsGRPC(r) }

// ErrConnectOverHTTP2 is the error of an HTTP/2 CONNECT given to
// [Transport]: net/http's HTTP/2 transport does not tunnel it, and its
// HTTP/1 transport would write the stream's bytes after the request
// unframed, where the server reads them as further requests of its own.
var ErrConnectOverHTTP2 = errors.New("origproto: an HTTP/2 CONNECT is not forwarded")

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodConnect {
		if r.ProtoMajor == 2 {
			if r.Body != nil {
				r.Body.Close()
			}
			return nil, ErrConnectOverHTTP2
		}
		if !r.Close {
			// After a CONNECT the connection is the tunnel's or the
			// server's to close: never one to pool for the next request.
			r = r.Clone(r.Context())
			r.Close = true
		}
	}
	r, failed := t.checkRequireID(r)
	if failed != nil {
		return failed, nil
	}
	if t.tls != nil {
		if s := serverTLSFrom(r.Context()); s.id != "" {
			// Wait for the local certificate here, under the request's
			// context: net/http dials under a context the request's end
			// does not cancel, and a connection made without the
			// certificate would stay anonymous for as long as it is
			// pooled.
			if err := t.tls.local.Wait(r.Context()); err != nil {
				if r.Body != nil {
					r.Body.Close()
				}
				return nil, &identity.IdentityError{Expected: s.id, Err: err}
			}
			p := t.tls.get(s)
			resp, err := t.send(p.h1, p.h2, r)
			if err == nil {
				// Every connection of p proved s.id in its handshake.
				tap.NoteServer(r.Context(), s.id)
			}
			return resp, err
		}
	}
	return t.send(t.h1, t.h2, r)
}

// send sends r through h1 or h2: HTTP/2 as it is, HTTP/1 to a peer
// upgraded to HTTP/2, HTTP/1 to others as it is.
func (t *Transport) send(h1, h2 http.RoundTripper, r *http.Request) (*http.Response, error) {
	if HTTP2Only(r) {
		return h2.RoundTrip(r)
	}
	peer, ok := PeerFromContext(r.Context())
	if !ok {
		peer = t.hint(r)
	}
	if !peer || !Eligible(r) {
		return h1.RoundTrip(r)
	}
	up, p := upgrade(r)
	resp, err := h2.RoundTrip(up)
	if err != nil {
		return nil, &UpgradeError{Err: err}
	}
	version := p.version()
	if v, ok := parseProto(resp.Header.Get(Header)); ok {
		version = v.version()
	}
	delete(resp.Header, Header)
	if len(resp.Trailer) > 0 {
		// HTTP/1 carries trailers only in a chunked body.
		resp.ContentLength = -1
		delete(resp.Header, "Content-Length")
	}
	resp.Proto = version
	resp.ProtoMajor, resp.ProtoMinor = 1, 1
	if strings.HasSuffix(version, "1.0") {
		resp.ProtoMinor = 0
	}
	resp.Request = r
	return resp, nil
}

// CloseIdleConnections closes the idle connections of the transports the
// Transport made itself (its mTLS ones) and of those it was given that
// have the method.
func (t *Transport) CloseIdleConnections() {
	for _, rt := range []http.RoundTripper{t.h1, t.h2} {
		if c, ok := rt.(interface{ CloseIdleConnections() }); ok {
			c.CloseIdleConnections()
		}
	}
	if t.tls != nil {
		t.tls.closeIdle()
	}
}

// upgrade returns the HTTP/2 form of an eligible HTTP/1 request: a copy
// without its hop-by-hop headers, with l5d-orig-proto. Only the request
// and its header map are copied; header values, the URL, the body and the
// trailers (filled in as the body is read) are shared with r, which the
// RoundTripper contract keeps unchanged while the request is in flight.
func upgrade(r *http.Request) (*http.Request, proto) {
	p := proto{minor: r.ProtoMinor, absolute: isAbsoluteForm(r)}
	if p.minor != 0 {
		p.minor = 1
	}
	up := new(http.Request)
	*up = *r
	up.Header = make(http.Header, len(r.Header)+1)
	for k, v := range r.Header {
		up.Header[k] = v
	}
	stripHopByHop(up.Header)
	// One of four shared values, never modified.
	up.Header[Header] = requestValues[p.minor][b2i(p.absolute)]
	up.Proto, up.ProtoMajor, up.ProtoMinor = "HTTP/2.0", 2, 0
	up.TransferEncoding = nil
	up.Close = false
	if up.Host == "" {
		up.Host = r.URL.Host
	}
	return up, p
}

// requestValues are the l5d-orig-proto values of upgraded requests, by
// minor version and absolute form.
var requestValues = [2][2][]string{
	{{proto{minor: 0}.String()}, {proto{minor: 0, absolute: true}.String()}},
	{{proto{minor: 1}.String()}, {proto{minor: 1, absolute: true}.String()}},
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// isAbsoluteForm reports whether a request came in with an absolute-form
// target (GET http://host/path HTTP/1.1).
func isAbsoluteForm(r *http.Request) bool {
	u := r.RequestURI
	return len(u) > 7 && (strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://"))
}

// UpgradeError is the error of an upgraded request that failed on its
// HTTP/2 hop (a refused connection, a stream reset, a GOAWAY). It is an
// ordinary error for the HTTP/1 side, which answers it as a bad gateway.
type UpgradeError struct{ Err error }

func (e *UpgradeError) Error() string {
	return fmt.Sprintf("origproto: upgraded request failed: %v", e.Err)
}
func (e *UpgradeError) Unwrap() error { return e.Err }
