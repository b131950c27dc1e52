package origproto

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/felixge/httpsnoop"
)

// HandlerOption configures [NewHandler].
type HandlerOption interface{ applyHandler(*handler) }

type handlerOptionFunc func(*handler)

func (f handlerOptionFunc) applyHandler(h *handler) { f(h) }

// WithTrust sets the policy that decides whether a request comes from a
// mesh peer, whose l5d-* headers are honoured. The default trusts loopback
// and the networks of [WithTrustedNetworks]; an identity-based policy (a
// verified TLS peer) plugs in here.
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
// every l5d-* request header is removed and nothing is downgraded.
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
	values, has := r.Header[Header]
	if !h.trusted(r) {
		if has || hasL5d(r.Header) {
			r = r.Clone(r.Context())
			stripL5d(r.Header)
		}
		h.next.ServeHTTP(w, r)
		return
	}
	if !has || r.ProtoMajor != 2 {
		if has {
			// Only an HTTP/2 request can have been upgraded.
			r = r.Clone(r.Context())
			delete(r.Header, Header)
		}
		h.next.ServeHTTP(w, r)
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
	dw, prepare := downgradedWriter(w, p.version())
	h.next.ServeHTTP(dw, down)
	// A handler that wrote nothing leaves the response to net/http, which
	// sends the header map as it is: strip it now.
	prepare()
}

// errInvalidValue is the reason a request with a bad l5d-orig-proto is
// refused.
var errInvalidValue = errors.New("invalid l5d-orig-proto value")

// downgrade returns the HTTP/1 request that an upgraded HTTP/2 request was,
// given the values of its l5d-orig-proto header.
func downgrade(r *http.Request, values []string) (*http.Request, proto, error) {
	if len(values) != 1 {
		return nil, proto{}, errInvalidValue
	}
	p, ok := parseProto(values[0])
	if !ok {
		return nil, proto{}, errInvalidValue
	}
	down := r.Clone(r.Context())
	down.Trailer = r.Trailer // filled in as the body is read
	delete(down.Header, Header)
	stripHopByHop(down.Header)
	down.Proto, down.ProtoMajor, down.ProtoMinor = p.version(), 1, p.minor
	down.URL.Scheme, down.URL.Host = "", ""
	down.RequestURI = down.URL.RequestURI()
	if p.absolute {
		down.URL.Scheme, down.URL.Host = "http", r.Host
		down.RequestURI = down.URL.String()
	}
	if _, err := url.ParseRequestURI(down.RequestURI); err != nil {
		return nil, proto{}, fmt.Errorf("invalid request target or authority: %q", down.RequestURI)
	}
	return down, p, nil
}

// downgradedWriter strips the HTTP/1 application's connection headers from
// its response and adds l5d-orig-proto, as the head goes out; prepare does
// it for a handler that returns without writing.
func downgradedWriter(w http.ResponseWriter, version string) (_ http.ResponseWriter, prepare func()) {
	done := false
	prepare = func() {
		if !done {
			done = true
			h := w.Header()
			declared := h["Trailer"]
			stripHopByHop(h)
			if declared != nil {
				h["Trailer"] = declared // trailers are end-to-end, not hop-by-hop, on HTTP/2
			}
			h[Header] = []string{version}
		}
	}
	return httpsnoop.Wrap(w, httpsnoop.Hooks{
		WriteHeader: func(next httpsnoop.WriteHeaderFunc) httpsnoop.WriteHeaderFunc {
			return func(code int) {
				if code >= 200 {
					prepare()
				}
				next(code)
			}
		},
		Write: func(next httpsnoop.WriteFunc) httpsnoop.WriteFunc {
			return func(b []byte) (int, error) {
				prepare()
				return next(b)
			}
		},
		ReadFrom: func(next httpsnoop.ReadFromFunc) httpsnoop.ReadFromFunc {
			return func(src io.Reader) (int64, error) {
				prepare()
				return next(src)
			}
		},
		Flush: func(next httpsnoop.FlushFunc) httpsnoop.FlushFunc {
			return func() {
				prepare()
				next()
			}
		},
	}), prepare
}

func hasL5d(h http.Header) bool {
	for name := range h {
		if len(name) >= 4 && strings.EqualFold(name[:4], "l5d-") {
			return true
		}
	}
	return false
}
