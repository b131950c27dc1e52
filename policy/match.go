package policy

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// HostKind is how a route's hosts matched a request.
type HostKind uint8

// The kinds of host match, in increasing precedence.
const (
	// HostAny: the route has no host matches, so it applies to any host.
	HostAny HostKind = iota
	// HostSuffix: a wildcard (*.example.com) matched.
	HostSuffix
	// HostExact: an exact host matched.
	HostExact
)

var hostKindNames = [...]string{"any", "suffix", "exact"}

// String returns "any", "suffix" or "exact".
func (k HostKind) String() string {
	if int(k) < len(hostKindNames) {
		return hostKindNames[k]
	}
	return "unknown"
}

// Match says which route, rule and match selected a request, and how
// strongly: the values best match compares, most significant first (Host,
// HostLen, then PathLen with an exact path above any other path of the same
// length, Method, Headers and QueryParams for HTTP, as the Gateway API's
// HTTPRoute precedence orders them; Service, RPCMethod and Headers for
// gRPC). Select returns it by value.
type Match struct {
	// Route and Rule are the indexes of the selected rule in the policy,
	// -1 when nothing matched. Match is the index of the best of the rule's
	// matches, -1 when the rule has none (it matches every request).
	Route, Rule, Match int
	Host               HostKind
	// HostLen is the length of the matched exact host, or of the matched
	// suffix with its leading dot (".example.com").
	HostLen int
	// Path is the kind of the path match, and PathLen its length: that of
	// the exact path or the prefix (without a trailing "/"), or of the
	// whole path for a regex. A match without a path condition counts as
	// the prefix "/".
	Path    PathKind
	PathLen int
	// Headers and QueryParams count the conditions of the match; Method
	// says whether it named a method.
	Headers, QueryParams int
	Method               bool
	// Service and RPCMethod are the lengths of the gRPC service and method
	// names matched (zero when the match accepts any).
	Service, RPCMethod int
	// GRPC is set for matches of a gRPC route table.
	GRPC bool
}

var noMatch = Match{Route: -1, Rule: -1, Match: -1}

// Compare returns -1, 0 or +1 as m is a worse, equal or better match than
// o. Equal matches go to the earlier rule.
func (m Match) Compare(o Match) int {
	for _, d := range [...]int{
		int(m.Host) - int(o.Host), m.HostLen - o.HostLen,
		m.PathLen - o.PathLen, b2i(m.Path == PathExact) - b2i(o.Path == PathExact),
		m.Service - o.Service, m.RPCMethod - o.RPCMethod,
		b2i(m.Method) - b2i(o.Method), m.Headers - o.Headers, m.QueryParams - o.QueryParams,
	} {
		if d != 0 {
			if d < 0 {
				return -1
			}
			return 1
		}
	}
	return 0
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// String describes m for people, in the order of precedence: "route 1 rule 0 match 2: host exact(11) path prefix(4) method headers 1".
func (m Match) String() string {
	if m.Route < 0 {
		return "no match"
	}
	b := []byte("route ")
	b = strconv.AppendInt(b, int64(m.Route), 10)
	b = append(b, " rule "...)
	b = strconv.AppendInt(b, int64(m.Rule), 10)
	if m.Match < 0 {
		b = append(b, " (no matches)"...)
	} else {
		b = append(b, " match "...)
		b = strconv.AppendInt(b, int64(m.Match), 10)
	}
	b = append(b, ": host "...)
	b = append(b, m.Host.String()...)
	if m.Host != HostAny {
		b = append(b, '(')
		b = strconv.AppendInt(b, int64(m.HostLen), 10)
		b = append(b, ')')
	}
	if m.GRPC {
		b = append(b, " rpc service("...)
		b = strconv.AppendInt(b, int64(m.Service), 10)
		b = append(b, ") method("...)
		b = strconv.AppendInt(b, int64(m.RPCMethod), 10)
		b = append(b, ')')
	} else {
		b = append(b, " path "...)
		b = append(b, m.Path.String()...)
		b = append(b, '(')
		b = strconv.AppendInt(b, int64(m.PathLen), 10)
		b = append(b, ')')
	}
	if m.Method {
		b = append(b, " method"...)
	}
	b = append(b, " headers "...)
	b = strconv.AppendInt(b, int64(m.Headers), 10)
	if m.QueryParams > 0 {
		b = append(b, " query "...)
		b = strconv.AppendInt(b, int64(m.QueryParams), 10)
	}
	return string(b)
}

// Explanation is what [RouteTable.Explain] found: the selected route, its
// match, and the best match of another rule (the runner-up), if any.
type Explanation struct {
	Route    *Route
	Winner   Match
	RunnerUp *Match
}

// Select returns the route of r by best match, and how it matched; nil
// and a Match with Route -1 when no route matches (or t is nil). It does
// not allocate for requests whose path needs no escaping.
func (t *RouteTable) Select(r *http.Request) (*Route, Match) {
	if t == nil {
		return nil, noMatch
	}
	req := newRequest(r)
	best, _ := t.find(&req, false)
	if best.Route < 0 {
		return nil, best
	}
	return t.routes[best.Route].rules[best.Rule].route, best
}

// Explain is [RouteTable.Select] with the runner-up: the best match of any
// other rule. It is meant for introspection, not for every request.
func (t *RouteTable) Explain(r *http.Request) Explanation {
	if t == nil {
		return Explanation{Winner: noMatch}
	}
	req := newRequest(r)
	best, second := t.find(&req, true)
	e := Explanation{Winner: best}
	if best.Route >= 0 {
		e.Route = t.routes[best.Route].rules[best.Rule].route
	}
	if second.Route >= 0 {
		e.RunnerUp = &second
	}
	return e
}

// find scans every rule; a candidate replaces the best only when strictly
// better, so ties go to the earlier route and rule.
func (t *RouteTable) find(req *request, runnerUp bool) (best, second Match) {
	best, second = noMatch, noMatch
	for i := range t.routes {
		rt := &t.routes[i]
		host, hostLen, ok := matchHosts(rt.hosts, req)
		if !ok {
			continue
		}
		// The host is the most significant part of a match: a route whose
		// host match is weaker than the best so far cannot win.
		if !runnerUp && best.Route >= 0 && (host < best.Host || host == best.Host && hostLen < best.HostLen) {
			continue
		}
		for j := range rt.rules {
			m, ok := t.matchRule(&rt.rules[j], req)
			if !ok {
				continue
			}
			m.Route, m.Rule, m.Host, m.HostLen, m.GRPC = i, j, host, hostLen, t.grpc
			switch {
			case best.Route < 0 || m.Compare(best) > 0:
				second, best = best, m
			case runnerUp && (second.Route < 0 || m.Compare(second) > 0):
				second = m
			}
		}
	}
	return best, second
}

func (t *RouteTable) matchRule(rule *compiledRule, req *request) (Match, bool) {
	if t.grpc {
		if len(rule.grpc) == 0 {
			// An implicit match of every request, even one that is not a
			// gRPC call, as in Linkerd.
			return Match{Match: -1}, true
		}
		best, found := Match{}, false
		for k := range rule.grpc {
			if m, ok := rule.grpc[k].match(req); ok && (!found || m.Compare(best) > 0) {
				m.Match, best, found = k, m, true
			}
		}
		return best, found
	}
	if len(rule.http) == 0 {
		return Match{Match: -1, Path: PathPrefix, PathLen: 1}, true
	}
	best, found := Match{}, false
	for k := range rule.http {
		if m, ok := rule.http[k].match(req); ok && (!found || m.Compare(best) > 0) {
			m.Match = k
			best, found = m, true
		}
	}
	return best, found
}

// request is what matching reads of an *http.Request, extracted once.
type request struct {
	r *http.Request
	// method is the method as sent: GET when r.Method is empty.
	method  string
	host    string // without port; hasHost false when the request has none
	hasHost bool
	// path is the path as sent, percent-encoded (gRPC's method names are
	// matched on it: grpc-go's server decodes nothing); decoded is the
	// path as a net/http handler reads it (URL.Path), which HTTP routes
	// match, so that "/%61dmin" is authorized and routed as the "/admin"
	// the application serves for it.
	path    string
	decoded string
}

func newRequest(r *http.Request) request {
	req := request{r: r, method: r.Method}
	if req.method == "" {
		req.method = http.MethodGet // net/http: "an empty string means GET"
	}
	authority := r.Host
	if authority == "" && r.URL != nil {
		authority = r.URL.Host
	}
	if authority != "" {
		req.host, req.hasHost = hostOf(authority), true
	}
	if r.URL != nil {
		req.path = r.URL.EscapedPath()
		req.decoded = r.URL.Path
	}
	if req.method != http.MethodConnect {
		if req.path == "" {
			req.path = "/"
		}
		if req.decoded == "" {
			req.decoded = "/"
		}
	}
	return req
}

// hostOf returns the host of an authority: no userinfo, no port, an IPv6
// literal with its brackets.
func hostOf(a string) string {
	if i := strings.LastIndexByte(a, '@'); i >= 0 {
		a = a[i+1:]
	}
	if strings.HasPrefix(a, "[") {
		if i := strings.IndexByte(a, ']'); i >= 0 {
			return a[:i+1]
		}
		return a
	}
	if i := strings.LastIndexByte(a, ':'); i >= 0 {
		return a[:i]
	}
	return a
}

type hostMatcher struct {
	exact     string
	suffix    bool
	labels    []string // reversed
	suffixLen int
}

// matchHosts returns the best of the route's host matches; ok is false
// when the route has hosts and none matches.
func matchHosts(hosts []hostMatcher, req *request) (kind HostKind, n int, ok bool) {
	if len(hosts) == 0 {
		return HostAny, 0, true
	}
	if !req.hasHost {
		return 0, 0, false
	}
	for i := range hosts {
		k, l, hit := hosts[i].match(req.host)
		if hit && (!ok || k > kind || k == kind && l > n) {
			kind, n, ok = k, l, true
		}
	}
	return kind, n, ok
}

func (h *hostMatcher) match(host string) (HostKind, int, bool) {
	if !h.suffix {
		if !strings.HasSuffix(h.exact, ".") {
			host = strings.TrimSuffix(host, ".")
		}
		return HostExact, len(h.exact), asciiEqualFold(h.exact, host)
	}
	if len(h.labels) == 0 || h.labels[0] != "" {
		host = strings.TrimSuffix(host, ".")
	}
	for _, l := range h.labels {
		if len(host) < len(l) || !asciiEqualFold(host[len(host)-len(l):], l) {
			return 0, 0, false
		}
		host = host[:len(host)-len(l)]
		if !strings.HasSuffix(host, ".") {
			return 0, 0, false
		}
		host = host[:len(host)-1]
	}
	return HostSuffix, h.suffixLen, true
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

type httpMatcher struct {
	method    string
	hasPath   bool
	pathKind  PathKind
	path      string // exact path, or prefix without trailing "/"
	prefixAll bool   // the prefix "/"
	re        *wholeRegex
	headers   []valueMatcher
	query     []valueMatcher
}

func (m *httpMatcher) match(req *request) (Match, bool) {
	out := Match{Path: PathPrefix, PathLen: 1}
	if m.method != "" {
		if req.method != m.method {
			return out, false
		}
		out.Method = true
	}
	if m.hasPath {
		out.Path = m.pathKind
		switch m.pathKind {
		case PathExact:
			if req.decoded != m.path {
				return out, false
			}
			out.PathLen = len(m.path)
		case PathPrefix:
			if !m.prefixAll {
				rest, ok := strings.CutPrefix(strings.TrimRight(req.decoded, "/"), m.path)
				if !ok || rest != "" && rest[0] != '/' {
					return out, false
				}
				out.PathLen = len(m.path)
			}
		case PathRegex:
			if !m.re.matchString(req.decoded) {
				return out, false
			}
			out.PathLen = len(req.decoded)
		}
	}
	for i := range m.headers {
		if !m.headers[i].matchHeader(req.r) {
			return out, false
		}
	}
	out.Headers = len(m.headers)
	for i := range m.query {
		if !m.query[i].matchQuery(req.r) {
			return out, false
		}
	}
	out.QueryParams = len(m.query)
	return out, true
}

type grpcMatcher struct {
	service, method string
	headers         []valueMatcher
}

func (m *grpcMatcher) match(req *request) (Match, bool) {
	var out Match
	if req.method != http.MethodPost {
		return out, false
	}
	// The path must be /service/method[/...].
	p, ok := strings.CutPrefix(req.path, "/")
	if !ok {
		return out, false
	}
	service, rest, ok := strings.Cut(p, "/")
	if !ok {
		return out, false
	}
	method, _, _ := strings.Cut(rest, "/")
	if m.service != "" {
		if service != m.service {
			return out, false
		}
		out.Service = len(m.service)
	}
	if m.method != "" {
		if method != m.method {
			return out, false
		}
		out.RPCMethod = len(m.method)
	}
	for i := range m.headers {
		if !m.headers[i].matchHeader(req.r) {
			return out, false
		}
	}
	out.Headers = len(m.headers)
	return out, true
}

// valueMatcher is a header or query-parameter condition.
type valueMatcher struct {
	name  string // canonical header key, or parameter name
	host  bool   // the header is Host, read from Request.Host
	value string
	re    *wholeRegex
}

func (v *valueMatcher) matchHeader(r *http.Request) bool {
	if v.host {
		return r.Host != "" && v.matchHeaderValue(r.Host)
	}
	for _, hv := range r.Header[v.name] {
		if v.matchHeaderValue(hv) {
			return true
		}
	}
	return false
}

func (v *valueMatcher) matchHeaderValue(hv string) bool {
	if v.re == nil {
		return hv == v.value
	}
	// As Linkerd: a regex applies only to values of visible ASCII.
	for i := 0; i < len(hv); i++ {
		if c := hv[i]; (c < ' ' || c > '~') && c != '\t' {
			return false
		}
	}
	return v.re.matchString(hv)
}

// matchQuery walks the raw query as application/x-www-form-urlencoded
// pairs; it decodes only pairs that need it, into a pooled buffer.
func (v *valueMatcher) matchQuery(r *http.Request) bool {
	if r.URL == nil {
		return false
	}
	q := r.URL.RawQuery
	for q != "" {
		var pair string
		pair, q, _ = strings.Cut(q, "&")
		if pair == "" {
			continue
		}
		rawName, rawValue, _ := strings.Cut(pair, "=")
		if !needsDecode(rawName) && !needsDecode(rawValue) {
			if rawName == v.name && v.matchQueryValue(rawValue) {
				return true
			}
			continue
		}
		if v.matchDecoded(rawName, rawValue) {
			return true
		}
	}
	return false
}

// decodeBufs holds buffers for form decoding, so that matching a query that
// needs decoding does not allocate either.
var decodeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

func (v *valueMatcher) matchDecoded(rawName, rawValue string) bool {
	bp := decodeBufs.Get().(*[]byte)
	b := formDecode((*bp)[:0], rawName)
	ok := string(lossyUTF8(b)) == v.name
	if ok {
		b = lossyUTF8(formDecode(b[:0], rawValue))
		if v.re == nil {
			ok = string(b) == v.value
		} else {
			ok = v.re.matchBytes(b)
		}
	}
	if cap(b) <= 4096 {
		*bp = b[:0]
		decodeBufs.Put(bp)
	}
	return ok
}

func (v *valueMatcher) matchQueryValue(s string) bool {
	if v.re == nil {
		return s == v.value
	}
	return v.re.matchString(s)
}

// needsDecode reports whether s differs from its form decoding.
func needsDecode(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '%' || c == '+' || c >= utf8.RuneSelf {
			return true
		}
	}
	return false
}

// formDecode appends the form decoding of s to dst: "+" is a space, "%XX"
// a byte, and a "%" not followed by two hex digits stays as it is.
func formDecode(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			dst = append(dst, ' ')
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			dst = append(dst, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// lossyUTF8 returns b with each maximal invalid UTF-8 subsequence replaced
// by U+FFFD, as Rust's from_utf8_lossy does; b itself when valid.
func lossyUTF8(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	out := make([]byte, 0, len(b)+8)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || n > 1 {
			out = append(out, b[i:i+n]...)
			i += n
			continue
		}
		out = append(out, "\uFFFD"...)
		i += invalidPrefixLen(b[i:])
	}
	return out
}

// invalidPrefixLen returns the length of the maximal prefix of b that
// starts a valid UTF-8 sequence without completing it, at least 1.
func invalidPrefixLen(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for ; n <= need && n < len(b); n++ {
		if b[n] < lo || b[n] > hi {
			break
		}
		lo, hi = 0x80, 0xBF
	}
	return n
}
