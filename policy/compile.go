package policy

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/inmesh/inmesh/hedge"
)

// The default limits of [Options].
const (
	MaxRoutes   = 256  // routes of one protocol of a policy
	MaxRules    = 256  // rules of one route
	MaxMatches  = 64   // hosts of a route, matches of a rule, headers or query params of a match, filters of a rule
	MaxRegexLen = 1024 // bytes of one regular expression
)

// Options bound what [Compile] accepts; zero fields mean the package
// limits [MaxRoutes], [MaxRules], [MaxMatches] and [MaxRegexLen].
type Options struct {
	MaxRoutes   int
	MaxRules    int
	MaxMatches  int
	MaxRegexLen int
}

func (o Options) withDefaults() Options {
	if o.MaxRoutes <= 0 {
		o.MaxRoutes = MaxRoutes
	}
	if o.MaxRules <= 0 {
		o.MaxRules = MaxRules
	}
	if o.MaxMatches <= 0 {
		o.MaxMatches = MaxMatches
	}
	if o.MaxRegexLen <= 0 {
		o.MaxRegexLen = MaxRegexLen
	}
	return o
}

// Table is a compiled policy: a route table per protocol, ready to select
// the route of a request without allocating. A Table is immutable and safe
// for concurrent use.
type Table struct {
	policy       *Policy
	http1, http2 *RouteTable
	grpc         *RouteTable
	forbidden    bool
}

// Compile turns p into a route table, or returns an error naming the field
// at fault ("http1.routes[2].rules[0].matches[1].path: bad regex: ...").
// A nil p compiles to the empty table, which selects no route.
func Compile(p *Policy, opts Options) (*Table, error) {
	opts = opts.withDefaults()
	t := &Table{policy: p}
	if p == nil {
		return t, nil
	}
	if p.DetectTimeout < 0 {
		return nil, fmt.Errorf("detectTimeout: negative duration %v", p.DetectTimeout)
	}
	var err error
	switch p.Protocol {
	case ProtocolDetect, ProtocolHTTP1, ProtocolHTTP2:
		if p.Protocol != ProtocolHTTP2 {
			if t.http1, err = CompileHTTP(p.Parent, p.HTTP1, opts, "http1"); err != nil {
				return nil, err
			}
		}
		if p.Protocol != ProtocolHTTP1 {
			if t.http1 != nil && sameHTTP(p.HTTP1, p.HTTP2) {
				// One decoded copy for both versions (what a decoder
				// makes of Linkerd's default policies): one table too.
				t.http2 = t.http1
			} else if t.http2, err = CompileHTTP(p.Parent, p.HTTP2, opts, "http2"); err != nil {
				return nil, err
			}
		}
	case ProtocolGRPC:
		if t.grpc, err = CompileGRPC(p.Parent, p.GRPC, opts, "grpc"); err != nil {
			return nil, err
		}
	case ProtocolOpaque:
		t.forbidden = len(p.Opaque.Routes) > 0 && p.Opaque.Routes[0].Forbidden
	case ProtocolTLS:
	default:
		return nil, fmt.Errorf("protocol: unknown protocol %d", p.Protocol)
	}
	return t, nil
}

// sameHTTP reports whether a and b are the same routes (the same slice,
// not equal ones) with the same failure accrual.
func sameHTTP(a, b HTTPProtocol) bool {
	return a.FailureAccrual == b.FailureAccrual && len(a.Routes) == len(b.Routes) &&
		(len(a.Routes) == 0 || &a.Routes[0] == &b.Routes[0])
}

// SharesHTTPTables reports whether HTTP/1 and HTTP/2 requests select from
// one route table, and so get the same [*Route] for the same match: a
// caller that keeps state per route and version keys it by both.
func (t *Table) SharesHTTPTables() bool {
	return t != nil && t.http1 != nil && t.http1 == t.http2
}

// Forbidden reports whether the policy refuses every connection to its
// target: an opaque policy whose route forbids it ([OpaqueRoute.Forbidden];
// Linkerd's proxy reads the first and only opaque route), such as the one
// Linkerd's policy controller answers for a port that a Service does not
// declare. Its requests are refused without a response.
func (t *Table) Forbidden() bool { return t != nil && t.forbidden }

// Policy returns the policy the table was compiled from (nil for the empty
// table).
func (t *Table) Policy() *Policy { return t.policy }

// For returns the route table for r: the gRPC table of a gRPC policy, the
// HTTP/1 or HTTP/2 table of an HTTP policy (by r.ProtoMajor when the
// protocol is detected), nil when the policy has no HTTP routes (opaque,
// TLS, or the empty table).
func (t *Table) For(r *http.Request) *RouteTable {
	if t == nil {
		return nil
	}
	if t.grpc != nil {
		return t.grpc
	}
	if t.http1 != nil && (t.http2 == nil || r.ProtoMajor < 2) {
		return t.http1
	}
	return t.http2
}

// Select returns the route of r in the table [Table.For] picks, and how it
// matched; nil and a Match with Route -1 when no route matches. It does not
// allocate.
func (t *Table) Select(r *http.Request) (*Route, Match) {
	return t.For(r).Select(r)
}

// RouteTable is the compiled route list of one protocol. It is immutable
// and safe for concurrent use.
type RouteTable struct {
	grpc           bool
	routes         []compiledRoute
	failureAccrual *FailureAccrual
}

// FailureAccrual returns the circuit-breaker configuration of the
// protocol, nil for none.
func (t *RouteTable) FailureAccrual() *FailureAccrual { return t.failureAccrual }

// IsGRPC reports whether t holds gRPC routes (false for a nil t).
func (t *RouteTable) IsGRPC() bool { return t != nil && t.grpc }

// Routes returns every rule of the table as a [Route], in order.
func (t *RouteTable) Routes() []*Route {
	var out []*Route
	for i := range t.routes {
		for j := range t.routes[i].rules {
			out = append(out, t.routes[i].rules[j].route)
		}
	}
	return out
}

// Route is one rule of a compiled route, with what a router needs to
// serve its requests. It is shared by every request it is selected for and
// must not be modified.
type Route struct {
	// GRPC is set for the rules of gRPC routes.
	GRPC bool
	// Parent names the policy's parent (parent_* metric labels) and Meta
	// the route (route_* labels).
	Parent, Meta Metadata
	// RouteIndex and RuleIndex locate the rule in the policy.
	RouteIndex, RuleIndex int
	// Filters apply to the requests of the rule, in order.
	Filters []Filter
	// Backends say where the requests go.
	Backends Distribution
	// Timeouts of the rule's requests.
	Timeouts Timeouts
	// Retry is the counted retry policy; nil means none.
	Retry *Retry
	// AllowL5dRequestHeaders lets l5d-* request headers override Retry
	// and Timeouts.
	AllowL5dRequestHeaders bool
	// Hedge is the rule's hedging; nil means none.
	Hedge *hedge.Policy
	// Mirrors copy the rule's requests to other backends; see [Mirror].
	Mirrors []Mirror
}

type compiledRoute struct {
	hosts []hostMatcher
	rules []compiledRule
}

type compiledRule struct {
	route *Route
	http  []httpMatcher
	grpc  []grpcMatcher
}

// CompileHTTP compiles one list of HTTP routes; field prefixes the paths
// in errors.
func CompileHTTP(parent Metadata, p HTTPProtocol, opts Options, field string) (*RouteTable, error) {
	opts = opts.withDefaults()
	if len(p.Routes) > opts.MaxRoutes {
		return nil, fmt.Errorf("%s.routes: %d routes is more than the limit of %d", field, len(p.Routes), opts.MaxRoutes)
	}
	if err := CheckFailureAccrual(p.FailureAccrual, field+".failureAccrual"); err != nil {
		return nil, err
	}
	t := &RouteTable{failureAccrual: p.FailureAccrual, routes: make([]compiledRoute, len(p.Routes))}
	for i, r := range p.Routes {
		path := fmt.Sprintf("%s.routes[%d]", field, i)
		hosts, err := compileHosts(r.Hosts, path, opts)
		if err != nil {
			return nil, err
		}
		if len(r.Rules) > opts.MaxRules {
			return nil, fmt.Errorf("%s.rules: %d rules is more than the limit of %d", path, len(r.Rules), opts.MaxRules)
		}
		cr := compiledRoute{hosts: hosts, rules: make([]compiledRule, len(r.Rules))}
		for j, rule := range r.Rules {
			rpath := fmt.Sprintf("%s.rules[%d]", path, j)
			if len(rule.Matches) > opts.MaxMatches {
				return nil, fmt.Errorf("%s.matches: %d matches is more than the limit of %d", rpath, len(rule.Matches), opts.MaxMatches)
			}
			ms := make([]httpMatcher, len(rule.Matches))
			for k, m := range rule.Matches {
				if ms[k], err = compileHTTPMatch(m, fmt.Sprintf("%s.matches[%d]", rpath, k), opts); err != nil {
					return nil, err
				}
			}
			route := &Route{
				Parent: parent, Meta: r.Meta, RouteIndex: i, RuleIndex: j,
				Filters: rule.Filters, Backends: rule.Backends, Timeouts: rule.Timeouts,
				Retry: rule.Retry, AllowL5dRequestHeaders: rule.AllowL5dRequestHeaders, Hedge: rule.Hedge,
			}
			route.Mirrors = rule.Mirrors
			if err := checkRule(route, rpath, opts); err != nil {
				return nil, err
			}
			cr.rules[j] = compiledRule{route: route, http: ms}
		}
		t.routes[i] = cr
	}
	return t, nil
}

// CompileGRPC compiles one list of gRPC routes; field prefixes the paths
// in errors.
func CompileGRPC(parent Metadata, p GRPCProtocol, opts Options, field string) (*RouteTable, error) {
	opts = opts.withDefaults()
	if len(p.Routes) > opts.MaxRoutes {
		return nil, fmt.Errorf("%s.routes: %d routes is more than the limit of %d", field, len(p.Routes), opts.MaxRoutes)
	}
	if err := CheckFailureAccrual(p.FailureAccrual, field+".failureAccrual"); err != nil {
		return nil, err
	}
	t := &RouteTable{grpc: true, failureAccrual: p.FailureAccrual, routes: make([]compiledRoute, len(p.Routes))}
	for i, r := range p.Routes {
		path := fmt.Sprintf("%s.routes[%d]", field, i)
		hosts, err := compileHosts(r.Hosts, path, opts)
		if err != nil {
			return nil, err
		}
		if len(r.Rules) > opts.MaxRules {
			return nil, fmt.Errorf("%s.rules: %d rules is more than the limit of %d", path, len(r.Rules), opts.MaxRules)
		}
		cr := compiledRoute{hosts: hosts, rules: make([]compiledRule, len(r.Rules))}
		for j, rule := range r.Rules {
			rpath := fmt.Sprintf("%s.rules[%d]", path, j)
			if len(rule.Matches) > opts.MaxMatches {
				return nil, fmt.Errorf("%s.matches: %d matches is more than the limit of %d", rpath, len(rule.Matches), opts.MaxMatches)
			}
			ms := make([]grpcMatcher, len(rule.Matches))
			for k, m := range rule.Matches {
				mpath := fmt.Sprintf("%s.matches[%d]", rpath, k)
				ms[k] = grpcMatcher{service: m.Service, method: m.Method}
				if ms[k].headers, err = compileHeaders(m.Headers, mpath, opts); err != nil {
					return nil, err
				}
			}
			route := &Route{
				GRPC: true, Parent: parent, Meta: r.Meta, RouteIndex: i, RuleIndex: j,
				Filters: rule.Filters, Backends: rule.Backends, Timeouts: rule.Timeouts,
				Retry: rule.Retry, AllowL5dRequestHeaders: rule.AllowL5dRequestHeaders, Hedge: rule.Hedge,
			}
			route.Mirrors = rule.Mirrors
			if err := checkRule(route, rpath, opts); err != nil {
				return nil, err
			}
			cr.rules[j] = compiledRule{route: route, grpc: ms}
		}
		t.routes[i] = cr
	}
	return t, nil
}

func compileHosts(hosts []HostMatch, path string, opts Options) ([]hostMatcher, error) {
	if len(hosts) > opts.MaxMatches {
		return nil, fmt.Errorf("%s.hosts: %d hosts is more than the limit of %d", path, len(hosts), opts.MaxMatches)
	}
	out := make([]hostMatcher, len(hosts))
	for i, h := range hosts {
		out[i] = hostMatcher{exact: h.Exact, suffix: h.Suffix, labels: h.ReverseLabels}
		if h.Suffix {
			out[i].exact = ""
			for _, l := range h.ReverseLabels {
				out[i].suffixLen += len(l) + 1
			}
		}
	}
	return out, nil
}

func compileHTTPMatch(m HTTPRouteMatch, path string, opts Options) (httpMatcher, error) {
	out := httpMatcher{method: m.Method}
	if m.Method != "" && !httpguts.ValidHeaderFieldName(m.Method) {
		return out, fmt.Errorf("%s.method: %q is not an HTTP method", path, m.Method)
	}
	if p := m.Path; p != nil {
		out.hasPath = true
		out.pathKind = p.Kind
		switch p.Kind {
		// Requests are matched on their decoded path (see request), so a
		// value written percent-encoded is decoded too.
		case PathExact:
			out.path = unescapePath(p.Value)
		case PathPrefix:
			// As Linkerd: "/" matches every path, and a trailing "/" is
			// ignored on both sides.
			out.prefixAll = p.Value == "/"
			out.path = strings.TrimRight(unescapePath(p.Value), "/")
		case PathRegex:
			re, err := compileRegex(p.Value, path+".path", opts)
			if err != nil {
				return out, err
			}
			out.re = &re
		default:
			return out, fmt.Errorf("%s.path: unknown path match kind %d", path, p.Kind)
		}
	}
	var err error
	if out.headers, err = compileHeaders(m.Headers, path, opts); err != nil {
		return out, err
	}
	if len(m.QueryParams) > opts.MaxMatches {
		return out, fmt.Errorf("%s.queryParams: %d matches is more than the limit of %d", path, len(m.QueryParams), opts.MaxMatches)
	}
	out.query = make([]valueMatcher, len(m.QueryParams))
	for i, q := range m.QueryParams {
		qpath := fmt.Sprintf("%s.queryParams[%d]", path, i)
		if q.Name == "" {
			return out, fmt.Errorf("%s.name: required", qpath)
		}
		if out.query[i], err = compileValue(q.Name, q.Value, q.Regex, qpath, opts); err != nil {
			return out, err
		}
	}
	return out, nil
}

func compileHeaders(hs []HeaderMatch, path string, opts Options) ([]valueMatcher, error) {
	if len(hs) > opts.MaxMatches {
		return nil, fmt.Errorf("%s.headers: %d matches is more than the limit of %d", path, len(hs), opts.MaxMatches)
	}
	out := make([]valueMatcher, len(hs))
	for i, h := range hs {
		hpath := fmt.Sprintf("%s.headers[%d]", path, i)
		if !httpguts.ValidHeaderFieldName(h.Name) {
			return nil, fmt.Errorf("%s.name: %q is not a header name", hpath, h.Name)
		}
		if !h.Regex && !httpguts.ValidHeaderFieldValue(h.Value) {
			return nil, fmt.Errorf("%s.value: %q is not a header value", hpath, h.Value)
		}
		var err error
		if out[i], err = compileValue(textproto.CanonicalMIMEHeaderKey(h.Name), h.Value, h.Regex, hpath, opts); err != nil {
			return nil, err
		}
		out[i].host = out[i].name == "Host"
	}
	return out, nil
}

func compileValue(name, value string, regex bool, path string, opts Options) (valueMatcher, error) {
	v := valueMatcher{name: name, value: value}
	if regex {
		re, err := compileRegex(value, path, opts)
		if err != nil {
			return v, err
		}
		v.re = &re
	}
	return v, nil
}

func compileRegex(pattern, path string, opts Options) (wholeRegex, error) {
	if len(pattern) > opts.MaxRegexLen {
		return wholeRegex{}, fmt.Errorf("%s.regex: regex of %d bytes is longer than the limit of %d", path, len(pattern), opts.MaxRegexLen)
	}
	re, err := compileWholeRegex(pattern)
	if err != nil {
		return wholeRegex{}, fmt.Errorf("%s.regex: bad regex: %v", path, err)
	}
	return re, nil
}

// checkRule validates what a router will read from a rule.
func checkRule(r *Route, path string, opts Options) error {
	if err := checkFilters(r.Filters, r.GRPC, path+".filters", opts); err != nil {
		return err
	}
	if err := checkDistribution(r.Backends, r.GRPC, path+".backends", opts); err != nil {
		return err
	}
	if err := checkMirrors(r.Mirrors, path+".mirrors", opts); err != nil {
		return err
	}
	for _, d := range []struct {
		name string
		v    int64
	}{{"request", int64(r.Timeouts.Request)}, {"response", int64(r.Timeouts.Response)}, {"idle", int64(r.Timeouts.Idle)}} {
		if d.v < 0 {
			return fmt.Errorf("%s.timeouts.%s: negative duration", path, d.name)
		}
	}
	if h := r.Hedge; h != nil {
		if err := h.Validate(); err != nil {
			return fmt.Errorf("%s.hedge.%w", path, err)
		}
	}
	if rt := r.Retry; rt != nil {
		rpath := path + ".retry"
		if rt.MaxRetries > math.MaxUint16 {
			return fmt.Errorf("%s.maxRetries: %d is more than %d", rpath, rt.MaxRetries, math.MaxUint16)
		}
		if rt.Timeout < 0 {
			return fmt.Errorf("%s.timeout: negative duration %v", rpath, rt.Timeout)
		}
		for i, s := range rt.StatusRanges {
			if s.Start == 0 || s.End == 0 || s.End > 599 || s.Start > s.End {
				return fmt.Errorf("%s.statusRanges[%d]: %d-%d is not a range of status codes up to 599", rpath, i, s.Start, s.End)
			}
		}
		if r.GRPC && len(rt.StatusRanges) > 0 {
			return fmt.Errorf("%s.statusRanges: not allowed on a gRPC route", rpath)
		}
		if !r.GRPC && len(rt.GRPCCodes) > 0 {
			return fmt.Errorf("%s.grpcCodes: not allowed on an HTTP route", rpath)
		}
		if rt.Backoff != nil {
			if err := rt.Backoff.Validate(); err != nil {
				return fmt.Errorf("%s.backoff: %v", rpath, err)
			}
		}
	}
	return nil
}

func checkFilters(fs []Filter, grpc bool, path string, opts Options) error {
	if len(fs) > opts.MaxMatches {
		return fmt.Errorf("%s: %d filters is more than the limit of %d", path, len(fs), opts.MaxMatches)
	}
	for i, f := range fs {
		fpath := fmt.Sprintf("%s[%d]", path, i)
		n := 0
		for _, set := range []bool{f.RequestHeaders != nil, f.ResponseHeaders != nil, f.Redirect != nil, f.FailureInjector != nil, f.GRPCFailureInjector != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			return fmt.Errorf("%s: %d filter kinds set, want exactly 1", fpath, n)
		}
		switch {
		case f.RequestHeaders != nil:
			if err := checkModifier(f.RequestHeaders, fpath+".requestHeaderModifier"); err != nil {
				return err
			}
		case f.ResponseHeaders != nil:
			if grpc {
				return fmt.Errorf("%s.responseHeaderModifier: not allowed on a gRPC route", fpath)
			}
			if err := checkModifier(f.ResponseHeaders, fpath+".responseHeaderModifier"); err != nil {
				return err
			}
		case f.Redirect != nil:
			if grpc {
				return fmt.Errorf("%s.redirect: not allowed on a gRPC route", fpath)
			}
			if err := checkRedirect(f.Redirect, fpath+".redirect"); err != nil {
				return err
			}
		case f.FailureInjector != nil:
			if grpc {
				return fmt.Errorf("%s.failureInjector: an HTTP failure injector is not allowed on a gRPC route", fpath)
			}
			if s := f.FailureInjector.Status; s < 100 || s > 999 {
				return fmt.Errorf("%s.failureInjector.status: %d is not an HTTP status code", fpath, s)
			}
			if err := checkRatio(f.FailureInjector.Ratio, fpath+".failureInjector.ratio"); err != nil {
				return err
			}
		case f.GRPCFailureInjector != nil:
			if !grpc {
				return fmt.Errorf("%s.grpcFailureInjector: not allowed on an HTTP route", fpath)
			}
			if c := f.GRPCFailureInjector.Code; c > math.MaxUint16 {
				return fmt.Errorf("%s.grpcFailureInjector.code: %d is out of range", fpath, c)
			}
			if err := checkRatio(f.GRPCFailureInjector.Ratio, fpath+".grpcFailureInjector.ratio"); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkModifier(m *HeaderModifier, path string) error {
	for _, l := range []struct {
		name string
		hs   []Header
	}{{"add", m.Add}, {"set", m.Set}} {
		for i, h := range l.hs {
			if !httpguts.ValidHeaderFieldName(h.Name) {
				return fmt.Errorf("%s.%s[%d].name: %q is not a header name", path, l.name, i, h.Name)
			}
			if !httpguts.ValidHeaderFieldValue(h.Value) {
				return fmt.Errorf("%s.%s[%d].value: %q is not a header value", path, l.name, i, h.Value)
			}
		}
	}
	for i, name := range m.Remove {
		if !httpguts.ValidHeaderFieldName(name) {
			return fmt.Errorf("%s.remove[%d]: %q is not a header name", path, i, name)
		}
	}
	return nil
}

func checkRedirect(r *Redirect, path string) error {
	if r.Scheme != "" && !validScheme(r.Scheme) {
		return fmt.Errorf("%s.scheme: %q is not a URL scheme", path, r.Scheme)
	}
	if strings.ContainsAny(r.Host, "/?#@ \t\r\n") {
		return fmt.Errorf("%s.host: %q is not a host", path, r.Host)
	}
	if r.Status != 0 && (r.Status < 100 || r.Status > 999) {
		return fmt.Errorf("%s.status: %d is not an HTTP status code", path, r.Status)
	}
	if p := r.Path; p != nil && !strings.HasPrefix(p.Full, "/") {
		return fmt.Errorf("%s.path: %q is not an absolute path", path, p.Full)
	}
	return nil
}

func validScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

func checkRatio(r Ratio, path string) error {
	if r == (Ratio{}) {
		return nil
	}
	if r.Denominator == 0 {
		return fmt.Errorf("%s.denominator: must be positive", path)
	}
	if r.Numerator > r.Denominator {
		return fmt.Errorf("%s: %d/%d is more than 1", path, r.Numerator, r.Denominator)
	}
	return nil
}

func checkDistribution(d Distribution, grpc bool, path string, opts Options) error {
	switch d.Kind {
	case DistributionEmpty:
		if len(d.Backends) > 0 {
			return fmt.Errorf("%s: an empty distribution has %d backends", path, len(d.Backends))
		}
	case DistributionFirstAvailable, DistributionRandomAvailable:
		if len(d.Backends) == 0 {
			return fmt.Errorf("%s: a %s distribution may not be empty", path, d.Kind)
		}
	default:
		return fmt.Errorf("%s: unknown distribution kind %d", path, d.Kind)
	}
	for i, b := range d.Backends {
		bpath := fmt.Sprintf("%s.backends[%d]", path, i)
		if b.Backend.Balancer != nil && b.Backend.Forward != nil {
			return fmt.Errorf("%s.backend: both balancer and forward set", bpath)
		}
		if bl := b.Backend.Balancer; bl != nil && (bl.DefaultRTT < 0 || bl.Decay < 0) {
			return fmt.Errorf("%s.backend.balancer: negative duration", bpath)
		}
		if b.Backend.Queue.FailFastTimeout < 0 {
			return fmt.Errorf("%s.backend.queue.failfastTimeout: negative duration", bpath)
		}
		if err := checkFilters(b.Filters, grpc, bpath+".filters", opts); err != nil {
			return err
		}
	}
	return nil
}

// The smallest success-rate window a breaker can honour (as Linkerd's
// proxy), and the largest request floor that still lets it trip.
const (
	minSuccessRateWindow  = 10_000_000 // 10 ms
	maxSuccessRateMinReqs = 1_000_000
)

var errOneAccrualKind = errors.New("exactly one of consecutive and unified must be set")

// CheckFailureAccrual checks a failure accrual as [Compile] does: exactly
// one kind, a valid backoff, a success-rate threshold in [0, 1] over a
// window of at least 10ms and a request floor that lets it trip. A nil one
// is valid. path prefixes the field names in errors.
func CheckFailureAccrual(fa *FailureAccrual, path string) error {
	if fa == nil {
		return nil
	}
	if (fa.Consecutive == nil) == (fa.Unified == nil) {
		return fmt.Errorf("%s: %w", path, errOneAccrualKind)
	}
	if c := fa.Consecutive; c != nil {
		if err := c.Backoff.Validate(); err != nil {
			return fmt.Errorf("%s.consecutive.backoff: %v", path, err)
		}
	}
	if u := fa.Unified; u != nil {
		if !(u.SuccessRateThreshold >= 0 && u.SuccessRateThreshold <= 1) {
			return fmt.Errorf("%s.unified.successRateThreshold: %v is outside [0, 1]", path, u.SuccessRateThreshold)
		}
		if u.SuccessRateThreshold > 0 && u.Window < minSuccessRateWindow {
			return fmt.Errorf("%s.unified.window: %v is shorter than 10ms", path, u.Window)
		}
		if u.MinRequests > maxSuccessRateMinReqs {
			return fmt.Errorf("%s.unified.minRequests: %d is more than %d", path, u.MinRequests, maxSuccessRateMinReqs)
		}
		if err := u.Backoff.Validate(); err != nil {
			return fmt.Errorf("%s.unified.backoff: %v", path, err)
		}
	}
	return nil
}

// unescapePath decodes a route's path value as net/http decodes a
// request's; a value that is not valid percent-encoding is kept as
// written.
func unescapePath(v string) string {
	if !strings.Contains(v, "%") {
		return v
	}
	if d, err := url.PathUnescape(v); err == nil {
		return d
	}
	return v
}
