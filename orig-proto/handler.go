package origproto

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/rw"
)

// HandlerOption configures [NewHandler].
type HandlerOption interface{ applyHandler(*handler) }

type handlerOptionFunc func(*handler)

func (f handlerOptionFunc) applyHandler(h *handler) { f(h) }

// WithTrust sets the policy that decides whether a request comes from a
// mesh peer, whose l5d-* headers are honoured. The default trusts a client
// with a verified mesh identity ([identity.PeerFromContext]), loopback and
// the networks of [WithTrustedNetworks].
func WithTrust(trusted func(*http.Request) bool) HandlerOption {
	return handlerOptionFunc(func(h *handler) {
		if trusted != nil {
			h.trusted = trusted
		}
	})
}

// WithTrustedNetworks adds networks whose peers the default policy trusts.
func WithTrustedNetworks(nets ...netip.Prefix) HandlerOption {
	return handlerOptionFunc(func(h *handler) { h.networks = append(h.networks, nets...) })
}

type handler struct {
	next     http.Handler
	trusted  func(*http.Request) bool
	networks []netip.Prefix
}

// NewHandler returns the receiving side: an HTTP/2 request from a trusted
// peer with a valid l5d-orig-proto reaches next as the HTTP/1 request it was
// (version, origin-form unless the value says absolute-form, Host from
// :authority, the header removed), and its response carries the header
// back. An invalid value is answered 400. From a peer that is not trusted,
// every l5d-* request header is removed and nothing is downgraded. An
// HTTP/1 request's ask to upgrade to h2c is removed from every request
// (see [NewServer]): an application that would answer it never sees it.
func NewHandler(next http.Handler, opts ...HandlerOption) http.Handler {
	h := &handler{next: next}
	h.trusted = h.defaultTrust
	for _, o := range opts {
		if o != nil {
			o.applyHandler(h)
		}
	}
	return h
}

func (h *handler) defaultTrust(r *http.Request) bool {
	if p, ok := identity.PeerFromContext(r.Context()); ok && p.ID != "" {
		return true // an authenticated meshed peer
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			return false
		}
		a, err := netip.ParseAddr(host)
		if err != nil {
			return false
		}
		ap = netip.AddrPortFrom(a, 0)
	}
	a := ap.Addr().Unmap()
	if a.IsLoopback() {
		return true
	}
	for _, n := range h.networks {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	trusted := h.trusted(r)
	in := r
	r = withoutH2CUpgrade(r)
	values, has := r.Header[Header]
	if !trusted {
		if has || hasL5d(r.Header) {
			r = withOwnHeader(r)
			stripL5d(r.Header)
			if p, ok := identity.PeerFromContext(r.Context()); ok && p.ID != "" {
				// What TLS verified is not the client's word.
				r.Header[ClientIDHeader] = []string{p.ID}
			}
		}
		h.next.ServeHTTP(w, guardTrailers(in, r, false))
		return
	}
	if !has || r.ProtoMajor != 2 {
		if has {
			// Only an HTTP/2 request can have been upgraded.
			r = withOwnHeader(r)
			delete(r.Header, Header)
		}
		h.next.ServeHTTP(w, guardTrailers(in, r, true))
		return
	}
	if err := CheckHTTP2Request(r); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	down, p, err := downgrade(r, values)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	dw, st := rw.Wrap(w)
	st.OnHead = prepareHTTP11
	if p.minor == 0 {
		st.OnHead = prepareHTTP10
	}
	h.next.ServeHTTP(dw, guardTrailers(in, down, true))
	// A handler that wrote nothing leaves the response to net/http, which
	// sends the header map as it is: prepare it now.
	if st.Status == 0 {
		st.OnHead(w.Header())
	}
	st.Release()
}

// errInvalidValue is the reason a request with a bad l5d-orig-proto is
// refused.
var errInvalidValue = errors.New("invalid l5d-orig-proto value")

// downgrade returns the HTTP/1 request that an upgraded HTTP/2 request was,
// given the values of its l5d-orig-proto header. It copies only what it
// changes: the request, its URL and its header map; header values, the
// body and the trailers are shared with r.
func downgrade(r *http.Request, values []string) (*http.Request, proto, error) {
	if len(values) != 1 {
		return nil, proto{}, errInvalidValue
	}
	p, ok := parseProto(values[0])
	if !ok {
		return nil, proto{}, errInvalidValue
	}
	// The request and its URL in one allocation.
	d := &downgraded{req: *r, url: *r.URL}
	down, u := &d.req, &d.url
	down.URL = u
	down.Header = make(http.Header, len(r.Header))
	for k, v := range r.Header {
		down.Header[k] = v
	}
	delete(down.Header, Header)
	stripHopByHop(down.Header)
	down.Proto, down.ProtoMajor, down.ProtoMinor = p.version(), 1, p.minor
	u.Scheme, u.Host = "", ""
	if !p.absolute && plainOriginForm(r.RequestURI) && u.Opaque == "" {
		// The target net/http parsed is already what an HTTP/1 request
		// line carries, and it needs no second look.
		down.RequestURI = r.RequestURI
		return down, p, nil
	}
	down.RequestURI = u.RequestURI()
	if p.absolute {
		u.Scheme, u.Host = "http", r.Host
		down.RequestURI = u.String()
	}
	if _, err := url.ParseRequestURI(down.RequestURI); err != nil {
		return nil, proto{}, fmt.Errorf("invalid request target or authority: %q", down.RequestURI)
	}
	return down, p, nil
}

// downgraded holds a downgraded request and its URL.
type downgraded struct {
	req http.Request
	url url.URL
}

// plainOriginForm reports whether t is an origin-form target of only
// unreserved characters, slashes and an optional query of unreserved
// characters, '=' and '&': a target that parses as itself and reads back
// unchanged.
func plainOriginForm(t string) bool {
	if len(t) == 0 || t[0] != '/' || len(t) > 1 && t[1] == '/' {
		return false
	}
	query := false
	for i := 1; i < len(t); i++ {
		c := t[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '-', c == '.', c == '_', c == '~', c == '/':
		case c == '?' && !query:
			query = true
		case query && (c == '=' || c == '&'):
		default:
			return false
		}
	}
	return true
}

// headerLower is [Header] in the form HTTP/2 sends, so that net/http
// writes it without converting it on every response.
const headerLower = "l5d-orig-proto"

// prepareHTTP11 and prepareHTTP10 strip the HTTP/1 application's
// connection headers from its response and add l5d-orig-proto, as the
// head goes out.
func prepareHTTP11(h http.Header) { prepareHead(h, http11) }
func prepareHTTP10(h http.Header) { prepareHead(h, http10) }

// http11 and http10 are the response values of l5d-orig-proto, shared by
// every response and never modified.
var http11, http10 = []string{"HTTP/1.1"}, []string{"HTTP/1.0"}

func prepareHead(h http.Header, version []string) {
	declared := h["Trailer"]
	stripHopByHop(h)
	if declared != nil {
		h["Trailer"] = declared // trailers are end-to-end, not hop-by-hop, on HTTP/2
	}
	delete(h, Header)
	h[headerLower] = version
}

func hasL5d(h http.Header) bool {
	for name := range h {
		if len(name) >= 4 && strings.EqualFold(name[:4], "l5d-") {
			return true
		}
	}
	return false
}

// guardTrailers returns r, a copy of src or src itself, with a body
// that, when src's ends, gives r the trailers the server filled in for
// src, without what a client may not send in them: l5d-client-id (an
// identity is what TLS verified, never a client's word; withPeer removes
// the header the same way) and, from a peer that is not trusted, every
// l5d-*. Only a chunked HTTP/1 body or an HTTP/2 one can carry trailers;
// other requests are returned as they are.
func guardTrailers(src, r *http.Request, trusted bool) *http.Request {
	if !mayHaveTrailers(src) {
		return r
	}
	if r == src {
		r = r.WithContext(r.Context())
	}
	r.Body = &trailerGuard{ReadCloser: src.Body, r: src, out: r, all: !trusted}
	return r
}

// withOwnHeader returns a shallow copy of r with a copy of its header: a
// deep copy (Clone) would have trailers of its own, which the server
// never fills.
func withOwnHeader(r *http.Request) *http.Request {
	out := r.WithContext(r.Context())
	out.Header = r.Header.Clone()
	return out
}

// mayHaveTrailers reports whether r's body can end with trailers: a
// chunked HTTP/1 body or an HTTP/2 one.
func mayHaveTrailers(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return false
	}
	return r.ProtoMajor != 1 || slices.Contains(r.TransferEncoding, "chunked")
}

// trailerGuard is a request body that cleans its request's trailers at
// its end. The server fills the trailers of the request it made (r): the
// map a shallow copy (out) shares, which a deep copy (Clone) does not;
// trailers an HTTP/1 request did not declare come in a map of their own,
// which out is given. A copy of out made before the end would not be:
// the guard is the last step before the handler that reads the body.
type trailerGuard struct {
	io.ReadCloser
	r, out *http.Request
	all    bool
}

func (g *trailerGuard) Read(p []byte) (int, error) {
	n, err := g.ReadCloser.Read(p)
	if err != nil && g.r.Trailer != nil {
		if g.all {
			stripL5d(g.r.Trailer)
		} else {
			delete(g.r.Trailer, ClientIDHeader)
		}
		if g.out.Trailer == nil {
			g.out.Trailer = g.r.Trailer
		}
	}
	return n, err
}
