package origproto

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"
)

// NewServer returns an http.Server for h that serves HTTP/1.1 and HTTP/2
// without TLS (prior knowledge; never the h2c Upgrade dance, whose ask
// (Upgrade: h2c, HTTP2-Settings) h never sees) on one listener, with limits for a proxy facing other proxies: 64 KiB of request
// headers, a 10s deadline for them, idle connections closed after 2
// minutes, and up to 1000 concurrent streams per HTTP/2 connection. Stop it
// with Shutdown, which drains requests in flight.
//
// Serve it on a listener wrapped by [GuardListener], which refuses
// ambiguous HTTP/1 framing and cuts HTTP/2 header blocks that are not
// finished within the server's ReadHeaderTimeout (ReadTimeout if that is
// zero). The server itself answers 400 to an HTTP/2 request that is
// malformed in ways net/http lets through (see [CheckHTTP2Request]), and
// runs HTTP/1 requests full duplex, so that a response can go out while
// the request body is still arriving.
//
// On a [MeshTLSListener] (under the guard), each request of a meshed TLS
// connection carries its client's verified identity in its context
// ([identity.PeerFromContext]) and in l5d-client-id; a l5d-client-id that
// a client sends itself is removed, on TLS and plaintext connections
// alike.
func NewServer(h http.Handler) *http.Server {
	srv := &http.Server{
		Handler:           serverHandler{h},
		Protocols:         new(http.Protocols),
		MaxHeaderBytes:    64 << 10,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          1000,
			MaxDecoderHeaderTableSize:     4096,
			MaxReceiveBufferPerConnection: 4 << 20,
			MaxReceiveBufferPerStream:     1 << 20,
		},
	}
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if g, ok := c.(*guardConn); ok {
			if d := srv.ReadHeaderTimeout; d > 0 {
				g.headerTimeout = d
			} else if d := srv.ReadTimeout; d > 0 {
				g.headerTimeout = d
			}
			c = g.Conn
		}
		if pc, ok := c.(peerConn); ok {
			ctx = context.WithValue(ctx, connKey{}, pc)
		}
		return ctx
	}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv
}

type serverHandler struct{ next http.Handler }

func (s serverHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = withoutH2CUpgrade(withPeer(r))
	if r.ProtoMajor == 1 {
		_ = http.NewResponseController(w).EnableFullDuplex() // ErrNotSupported: nothing to do
	} else if err := CheckHTTP2Request(r); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.next.ServeHTTP(w, r)
}

// CheckHTTP2Request returns an error naming what is malformed in an HTTP/2
// request that net/http's server accepts: an :authority that is not a
// host with an optional port (userinfo, a path, a query, spaces), a
// :method that is not a token, a host
// header that differs from :authority, an absolute :path naming another
// authority, a :path with a space or control byte, and content-length
// values that are not one decimal number. Requests of other protocols
// return nil.
func CheckHTTP2Request(r *http.Request) error {
	if r.ProtoMajor != 2 {
		return nil
	}
	if !isTokenString(r.Method) {
		return errors.New("malformed :method")
	}
	if r.Method != http.MethodConnect || r.Host != "" {
		if !validAuthority(r.Host) {
			return errors.New("malformed :authority")
		}
	}
	if hs := r.Header["Host"]; len(hs) > 0 && (len(hs) > 1 || !strings.EqualFold(hs[0], r.Host)) {
		return errors.New("host header differs from :authority")
	}
	for i := 0; i < len(r.RequestURI); i++ {
		if c := r.RequestURI[i]; c <= ' ' || c == 0x7f {
			return errors.New("malformed :path")
		}
	}
	if r.URL != nil && (r.URL.Host != "" && !strings.EqualFold(r.URL.Host, r.Host) || r.URL.Opaque != "") {
		return errors.New(":path names another authority")
	}
	if cl := r.Header["Content-Length"]; len(cl) > 0 {
		for _, v := range cl {
			if _, ok := parseLength([]byte(v)); !ok || v != cl[0] {
				return errors.New("malformed or conflicting content-length")
			}
		}
	}
	return nil
}

// validAuthority reports whether a is host[:port] with a registered name,
// an IPv4 address or a bracketed IP literal (RFC 3986 section 3.2.2),
// without userinfo.
func validAuthority(a string) bool {
	if a == "" {
		return false
	}
	host, port := a, ""
	if a[0] == '[' {
		end := strings.IndexByte(a, ']')
		if end < 0 {
			return false
		}
		for i := 1; i < end; i++ {
			if c := a[i]; !(isHex(c) || c == ':' || c == '.') {
				return false
			}
		}
		host, port = "", a[end+1:]
		if port != "" {
			if port[0] != ':' {
				return false
			}
			port = port[1:]
		}
	} else if i := strings.LastIndexByte(a, ':'); i >= 0 {
		host, port = a[:i], a[i+1:]
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !(tokenChars[c] && c != '|' && c != '^' && c != '`' && c != '#' || c == '(' || c == ')' || c == ',' || c == ';' || c == '=') {
			return false
		}
	}
	for i := 0; i < len(port); i++ {
		if port[i] < '0' || port[i] > '9' {
			return false
		}
	}
	return true
}

func isHex(c byte) bool { _, ok := unhex(c); return ok }
