package origproto

import (
	"net/http"
	"net/textproto"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// Header is the name of the header that carries the original protocol.
const Header = "L5d-Orig-Proto"

const absoluteForm = "; absolute-form"

// proto is an HTTP/1 version and request form carried across HTTP/2.
type proto struct {
	minor    int // 0 or 1
	absolute bool
}

func (p proto) String() string {
	s := "HTTP/1.1"
	if p.minor == 0 {
		s = "HTTP/1.0"
	}
	if p.absolute {
		s += absoluteForm
	}
	return s
}

// version is the response form of p, without the request form.
func (p proto) version() string { return proto{minor: p.minor}.String() }

// parseProto accepts exactly the four values of Linkerd's proxies.
func parseProto(v string) (proto, bool) {
	switch v {
	case "HTTP/1.1":
		return proto{minor: 1}, true
	case "HTTP/1.0":
		return proto{minor: 0}, true
	case "HTTP/1.1" + absoluteForm:
		return proto{minor: 1, absolute: true}, true
	case "HTTP/1.0" + absoluteForm:
		return proto{minor: 0, absolute: true}, true
	}
	return proto{}, false
}

// hopByHop are the connection-specific headers that never cross a hop, and
// that HTTP/2 forbids.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Http2-Settings",
}

// stripHopByHop removes from h the headers named by Connection, then the
// fixed hop-by-hop list. TE survives as "trailers" when it asked for them.
// It runs before any header of our own is added, so that a client naming
// l5d-orig-proto in Connection cannot remove it.
func stripHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for v != "" {
			var name string
			name, v, _ = strings.Cut(v, ",")
			if name = textproto.TrimString(name); name != "" && !isHopByHop(name) {
				deleteFold(h, name)
			}
		}
	}
	wantsTrailers := httpguts.HeaderValuesContainsToken(h["Te"], "trailers")
	for _, name := range hopByHop {
		delete(h, name)
	}
	if wantsTrailers {
		h["Te"] = []string{"trailers"}
	}
}

// isHopByHop reports whether name is in the fixed list, which is removed
// anyway.
func isHopByHop(name string) bool {
	for _, n := range hopByHop {
		if strings.EqualFold(n, name) {
			return true
		}
	}
	return false
}

// deleteFold removes the header name in any spelling, without building its
// canonical form.
func deleteFold(h http.Header, name string) {
	for k := range h {
		if strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}

// stripL5d removes every l5d-* header.
func stripL5d(h http.Header) {
	for name := range h {
		if len(name) >= 4 && strings.EqualFold(name[:4], "l5d-") {
			delete(h, name)
		}
	}
}

// withoutH2CUpgrade returns r without a request to upgrade its connection
// to h2c: the h2c token of Upgrade, HTTP2-Settings, and their names in
// Connection. An application that answers such a request
// (golang.org/x/net/http2/h2c) serves the connection's later streams
// itself, past every check of the stack in front of it. Other upgrades
// stay. r is copied when changed, with its own header map.
func withoutH2CUpgrade(r *http.Request) *http.Request {
	if r.ProtoMajor != 1 {
		return r
	}
	up, hasUp := r.Header["Upgrade"]
	_, hasSettings := r.Header["Http2-Settings"]
	if !hasSettings && (!hasUp || !hasToken(up, "h2c")) {
		return r
	}
	r = r.WithContext(r.Context())
	r.Header = r.Header.Clone()
	delete(r.Header, "Http2-Settings")
	drop := []string{"http2-settings"}
	if kept := withoutToken(up, "h2c"); len(kept) > 0 {
		r.Header["Upgrade"] = kept
	} else {
		delete(r.Header, "Upgrade")
		drop = append(drop, "upgrade")
	}
	if conn := r.Header["Connection"]; conn != nil {
		kept := conn
		for _, t := range drop {
			kept = withoutToken(kept, t)
		}
		if len(kept) > 0 {
			r.Header["Connection"] = kept
		} else {
			delete(r.Header, "Connection")
		}
	}
	return r
}

// hasToken reports whether a comma-separated list header holds token,
// case-insensitively.
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for _, p := range strings.Split(v, ",") {
			if strings.EqualFold(textproto.TrimString(p), token) {
				return true
			}
		}
	}
	return false
}

// withoutToken returns the tokens of a comma-separated list header other
// than token, one per value; nil when none is left.
func withoutToken(values []string, token string) []string {
	var out []string
	for _, v := range values {
		for _, p := range strings.Split(v, ",") {
			if p = textproto.TrimString(p); p != "" && !strings.EqualFold(p, token) {
				out = append(out, p)
			}
		}
	}
	return out
}

// wantsUpgrade reports whether an HTTP/1 request asks for a protocol
// upgrade other than h2c, or is a CONNECT: such requests are never sent
// over HTTP/2.
func wantsUpgrade(r *http.Request) bool {
	if r.Method == http.MethodConnect {
		return true
	}
	if r.ProtoMajor == 1 && r.ProtoMinor == 0 {
		return false // HTTP/1.0 has no upgrades
	}
	for _, v := range r.Header["Upgrade"] {
		for _, p := range strings.Split(v, ",") {
			if p = textproto.TrimString(p); p != "" && !strings.EqualFold(p, "h2c") {
				return true
			}
		}
	}
	return false
}
