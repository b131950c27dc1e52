package origproto

import (
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

// parseHeaderBlock turns "Name: value" lines into a header, keeping only
// the fields an HTTP/1 server would have accepted.
func parseHeaderBlock(block string) http.Header {
	h := http.Header{}
	for _, line := range strings.Split(block, "\n") {
		name, value, ok := strings.Cut(line, ":")
		value = textproto.TrimString(value)
		if !ok || !httpguts.ValidHeaderFieldName(name) || !httpguts.ValidHeaderFieldValue(value) {
			continue
		}
		h.Add(name, value)
	}
	return h
}

var forbiddenInH2 = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Http2-Settings"}

func FuzzUpgrade(f *testing.F) {
	f.Add("GET", "Host: a\nConnection: keep-alive, X-Secret\nX-Secret: 1\nTe: trailers, gzip", 1, false)
	f.Add("POST", "Transfer-Encoding: chunked\nUpgrade: h2c\nHTTP2-Settings: AAA\nConnection: Upgrade, HTTP2-Settings", 1, true)
	f.Add("GET", "Connection: l5d-orig-proto\nL5d-Orig-Proto: HTTP/1.0; absolute-form", 0, false)
	f.Add("PUT", "Keep-Alive: 5\nProxy-Connection: close\nTE: gzip", 0, true)
	f.Fuzz(func(t *testing.T, method, block string, minor int, absolute bool) {
		if !httpguts.ValidHeaderFieldName(method) {
			return
		}
		in := parseHeaderBlock(block)
		r := &http.Request{Method: method, URL: &url.URL{Scheme: "http", Host: "peer:4143", Path: "/x"},
			Host: "books:7000", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: minor & 1, Header: in.Clone()}
		if absolute {
			r.RequestURI = "http://books:7000/x"
		}
		named := map[string]bool{}
		for _, v := range in["Connection"] {
			for _, n := range strings.Split(v, ",") {
				named[textproto.CanonicalMIMEHeaderKey(textproto.TrimString(n))] = true
			}
		}
		up, p := upgrade(r)
		if up.ProtoMajor != 2 {
			t.Fatal("not HTTP/2")
		}
		if got := up.Header.Values(Header); len(got) != 1 || got[0] != p.String() {
			t.Fatalf("l5d-orig-proto %q", got)
		}
		if back, ok := parseProto(up.Header.Get(Header)); !ok || back != p || p.absolute != absolute || p.minor != minor&1 {
			t.Fatalf("value %q does not round-trip", up.Header.Get(Header))
		}
		for _, name := range forbiddenInH2 {
			if _, ok := up.Header[name]; ok {
				t.Fatalf("%s crosses to HTTP/2", name)
			}
		}
		if te := up.Header.Values("Te"); len(te) > 0 && (len(te) != 1 || te[0] != "trailers") {
			t.Fatalf("TE %q", te)
		}
		for name, vs := range up.Header {
			if named[name] && name != Header && !(name == "Te" && vs[0] == "trailers") {
				t.Fatalf("%s was named in Connection but crossed", name)
			}
			if !httpguts.ValidHeaderFieldName(name) {
				t.Fatalf("invalid name %q", name)
			}
			for _, v := range vs {
				if !httpguts.ValidHeaderFieldValue(v) {
					t.Fatalf("invalid value %q", v)
				}
			}
		}
		// The caller's request is untouched.
		if len(r.Header) != len(in) || r.ProtoMajor != 1 {
			t.Fatal("the original request was modified")
		}
	})
}

func FuzzDowngrade(f *testing.F) {
	f.Add("HTTP/1.1", "X-A: 1\nConnection: X-A", "/p?q=1", "books:7000")
	f.Add("HTTP/1.0; absolute-form", "L5d-Dst-Override: x:1", "/", "books")
	f.Add("HTTP/1.1;absolute-form", "", "/", "h")
	f.Add("-", "Te: trailers", "//x", "[::1]:80")
	f.Fuzz(func(t *testing.T, value, block, path, host string) {
		// What an HTTP/2 server admits: a :path that starts with / (or is
		// *) and a valid :authority.
		u, err := url.ParseRequestURI(path)
		if err != nil || !(strings.HasPrefix(path, "/") || path == "*") || !httpguts.ValidHostHeader(host) {
			return
		}
		in := parseHeaderBlock(block)
		in.Set(Header, value)
		r := &http.Request{Method: "GET", URL: u, Host: host, Proto: "HTTP/2.0", ProtoMajor: 2, Header: in.Clone(), RequestURI: path}
		down, p, err := downgrade(r, r.Header.Values(Header))
		if _, ok := parseProto(value); !ok {
			if err == nil {
				t.Fatalf("accepted %q", value)
			}
			return
		}
		if err != nil {
			if strings.Contains(err.Error(), "invalid request target") {
				return // a target or authority that cannot form a request line is refused
			}
			t.Fatalf("refused %q: %v", value, err)
		}
		if down.ProtoMajor != 1 || down.ProtoMinor != p.minor || down.Proto != p.version() {
			t.Fatalf("version %s for %q", down.Proto, value)
		}
		if _, ok := down.Header[Header]; ok {
			t.Fatal("l5d-orig-proto reaches the app")
		}
		for _, name := range forbiddenInH2 {
			if _, ok := down.Header[name]; ok {
				t.Fatalf("%s reaches the app", name)
			}
		}
		if p.absolute {
			if !strings.HasPrefix(down.RequestURI, "http://") || down.URL.Host != host {
				t.Fatalf("absolute-form lost: %q", down.RequestURI)
			}
		} else if strings.HasPrefix(down.RequestURI, "http") && !strings.HasPrefix(path, "http") || down.URL.Host != "" {
			t.Fatalf("origin-form expected: %q", down.RequestURI)
		}
		if _, err := url.ParseRequestURI(down.RequestURI); err != nil {
			t.Fatalf("request target %q does not parse: %v", down.RequestURI, err)
		}
		if down.Host != host {
			t.Fatalf("host %q, want %q", down.Host, host)
		}
		if plainOriginForm(path) && u.RequestURI() != path {
			t.Fatalf("target %q taken as is, but reads back as %q", path, u.RequestURI())
		}
		if r.Header.Get(Header) != value || r.URL != u || r.Proto != "HTTP/2.0" {
			t.Fatal("the downgrade changed the request it was given")
		}
	})
}

func FuzzStripL5d(f *testing.F) {
	f.Add("L5d-Orig-Proto: HTTP/1.1\nl5d-client-id: x\nL5D-DST-OVERRIDE: y\nX-L5d: keep")
	f.Fuzz(func(t *testing.T, block string) {
		h := parseHeaderBlock(block)
		stripL5d(h)
		for name := range h {
			if strings.HasPrefix(strings.ToLower(name), "l5d-") {
				t.Fatalf("%s kept", name)
			}
		}
	})
}
