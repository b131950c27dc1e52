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
