package profiles

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/recache"
	"golang.org/x/net/http/httpguts"
)

// Table is a compiled profile: the routes with their matches compiled,
// ready to select a route per request without allocating. A Table is
// immutable and safe for concurrent use.
type Table struct {
	profile *Profile
	routes  []*CompiledRoute
	budget  *RetryBudget // nil: retries disabled
	// BudgetErr says why a profile's retry budget was refused.
	budgetErr error
	dropped   []Dropped
}

// Dropped is a part of a profile that [Compile] left out because it does
// not compile, as Linkerd's proxy leaves out what it cannot convert; the
// rest of the profile applies.
type Dropped struct {
	// Route is the name of the route the part belongs to (its "route"
	// label), "" when the route has none.
	Route string
	// Field is the part left out: a route (routes[2]), a condition of an
	// all or an any (routes[2].condition.all[1]), a response class
	// (routes[2].responseClasses[0]) or a condition of its all or any, a
	// route's timeout or hedge.
	Field string
	// Err says why, naming the field at fault.
	Err error
}

// String names the part, its route and why it was left out.
func (d Dropped) String() string {
	if d.Route == "" {
		return d.Field + ": " + d.Err.Error()
	}
	return d.Field + " (route " + strconv.Quote(d.Route) + "): " + d.Err.Error()
}

// CompiledRoute is one route of a Table, or the default route. It is
// immutable. The router puts it into the request context
// (router.ProfileRouteFromContext), where classify finds its response
// classes.
type CompiledRoute struct {
	// Route is the route as the profile gave it, without the timeout or
	// hedge that Compile dropped; the zero Route for the default route.
	Route
	// Index is the route's position in the profile, -1 for the default
	// route.
	Index      int
	match      matcher
	classifier *classify.Classifier
	// method and prefix are necessary conditions of match, checked inline
	// before it: the method the route requires and a literal prefix of the
	// paths it accepts ("" when none).
	method, prefix string
}

// ResponseClassifier implements [classify.Provider].
func (r *CompiledRoute) ResponseClassifier() *classify.Classifier { return r.classifier }

// IsDefault reports whether r is the default route.
func (r *CompiledRoute) IsDefault() bool { return r.Index < 0 }

// DefaultRoute returns the route of requests that match no route, and of
// every request before a profile is known: no labels, the default
// classifier, no retries, no timeout. It is one shared, immutable value.
func DefaultRoute() *CompiledRoute { return defaultRoute }

var defaultRoute = &CompiledRoute{Index: -1, classifier: classify.Default()}

// Options bound what [Compile] accepts; zero fields mean the package
// limits [MaxRoutes], [MaxPathRegexLen] and [MaxMatchDepth].
type Options struct {
	MaxRoutes       int
	MaxPathRegexLen int
	MaxMatchDepth   int
}

func (o Options) withDefaults() Options {
	if o.MaxRoutes <= 0 {
		o.MaxRoutes = MaxRoutes
	}
	if o.MaxPathRegexLen <= 0 {
		o.MaxPathRegexLen = MaxPathRegexLen
	}
	if o.MaxMatchDepth <= 0 {
		o.MaxMatchDepth = MaxMatchDepth
	}
	return o
}

// Compile turns p into a route table. A nil p compiles to the empty table,
// where every request takes the default route. Only a profile of more
// than [Options.MaxRoutes] routes is an error.
//
// A part that does not compile is left out and the rest applies, as
// Linkerd's proxy converts a profile (linkerd2-proxy
// linkerd/service-profiles/src/proto.rs): a route whose condition does not
// compile (a bad pathRegex or method, a missing condition), a condition of
// an all or an any (the all then matches by its other conditions), a
// response class whose condition does not compile (a status of 0 or out of
// 100-999, an empty all or any), a negative timeout (the route has none)
// and an invalid hedge (the route does not hedge). A not whose condition
// does not compile does not compile either. [Table.Dropped] names what was
// left out. An invalid retry budget disables retries, and
// [Table.BudgetErr] says why.
func Compile(p *Profile, opts Options) (*Table, error) {
	opts = opts.withDefaults()
	t := &Table{profile: p}
	if p == nil {
		return t, nil
	}
	if len(p.Routes) > opts.MaxRoutes {
		return nil, fmt.Errorf("routes: %d routes is more than the limit of %d", len(p.Routes), opts.MaxRoutes)
	}
	for i, r := range p.Routes {
		c := compiler{opts: opts, route: r.Labels["route"], dropped: &t.dropped}
		path := &field{name: "routes", index: i}
		if r.Condition == nil {
			c.drop(path, fmt.Errorf("%s.condition: required", path))
			continue
		}
		m, err := c.requestMatch(r.Condition, path.at("condition", -1), 0)
		if err != nil {
			c.drop(path, err)
			continue
		}
		if r.Timeout < 0 {
			// As set_route_timeout: a warning, and no timeout.
			c.drop(path.at("timeout", -1), fmt.Errorf("%s.timeout: negative duration %v", path, r.Timeout))
			r.Timeout = 0
		}
		if r.Hedge != nil {
			if err := r.Hedge.Validate(); err != nil {
				c.drop(path.at("hedge", -1), fmt.Errorf("%s.hedge.%w", path, err))
				r.Hedge = nil
			}
		}
		cl := &classify.Classifier{}
		for j, rc := range r.ResponseClasses {
			cp := path.at("responseClasses", j)
			cpath := cp.at("condition", -1)
			if rc.Condition == nil {
				c.drop(cp, fmt.Errorf("%s: required", cpath))
				continue
			}
			sm, err := c.responseMatch(rc.Condition, cpath, 0)
			if err != nil {
				c.drop(cp, err)
				continue
			}
			cl.Classes = append(cl.Classes, classify.ResponseClass{Match: sm, Failure: rc.IsFailure})
		}
		cr := &CompiledRoute{Route: r, Index: i, match: m, classifier: cl}
		cr.method, cr.prefix = necessary(m)
		t.routes = append(t.routes, cr)
	}
	if b := p.RetryBudget; b != nil {
		if err := b.Validate(); err != nil {
			t.budgetErr = err
		} else {
			budget := *b
			t.budget = &budget
		}
	}
	return t, nil
}

// compiler compiles the conditions of one route, recording what it drops.
type compiler struct {
	opts    Options
	route   string
	dropped *[]Dropped
}

func (c compiler) drop(f *field, err error) {
	*c.dropped = append(*c.dropped, Dropped{Route: c.route, Field: f.String(), Err: err})
}

// Profile returns the profile the table was compiled from (nil for the
// empty table).
func (t *Table) Profile() *Profile { return t.profile }

// Routes returns the compiled routes in order: those of the profile that
// compiled.
func (t *Table) Routes() []*CompiledRoute { return t.routes }

// Dropped returns the parts of the profile that [Compile] left out, in the
// order of the profile; nil when everything compiled.
func (t *Table) Dropped() []Dropped { return t.dropped }

// RetryBudget returns the valid retry budget of the profile, or nil when
// retries are disabled.
func (t *Table) RetryBudget() *RetryBudget { return t.budget }

// BudgetErr returns why the profile's retry budget was refused, if it was.
func (t *Table) BudgetErr() error { return t.budgetErr }

// Select returns the first route whose condition matches the request's
// method and path, or [DefaultRoute]'s. It does not allocate.
func (t *Table) Select(r *http.Request) *CompiledRoute {
	return t.SelectPath(r.Method, r.URL.EscapedPath())
}

// SelectPath is [Table.Select] for a method and an escaped path (without
// the query). They are matched as a client sends them, as Linkerd matches
// the request on the wire: an empty method is GET, and an empty path is
// "/" (except for CONNECT, whose target is an authority).
func (t *Table) SelectPath(method, path string) *CompiledRoute {
	if method == "" {
		method = http.MethodGet // net/http: "an empty string means GET"
	}
	if path == "" && method != http.MethodConnect {
		path = "/" // net/http sends "http://svc" as "GET /"
	}
	if t != nil {
		for _, r := range t.routes {
			if r.method != "" && r.method != method || !strings.HasPrefix(path, r.prefix) {
				continue
			}
			if r.match.match(method, path) {
				return r
			}
		}
	}
	return defaultRoute
}

type matcher interface {
	match(method, path string) bool
}

// necessary returns a method and a path prefix that every request matching
// m has: from m itself or from the direct children of an all.
func necessary(m matcher) (method, prefix string) {
	visit := func(m matcher) {
		switch m := m.(type) {
		case methodMatcher:
			if method == "" {
				method = string(m)
			}
		case pathMatcher:
			if len(m.prefix) > len(prefix) {
				prefix = m.prefix
			}
		}
	}
	if all, ok := m.(allMatcher); ok {
		for _, c := range all {
			visit(c)
		}
	} else {
		visit(m)
	}
	return method, prefix
}

type allMatcher []matcher

func (m allMatcher) match(method, path string) bool {
	for _, c := range m {
		if !c.match(method, path) {
			return false
		}
	}
	return true
}

type anyMatcher []matcher

func (m anyMatcher) match(method, path string) bool {
	for _, c := range m {
		if c.match(method, path) {
			return true
		}
	}
	return false
}

type notMatcher struct{ m matcher }

func (m notMatcher) match(method, path string) bool { return !m.m.match(method, path) }

// pathMatcher runs a regex, after a cheap check of its literal prefix, or
// a hand-written matcher for the common shapes of [fastPath].
type pathMatcher struct {
	re     *regexp.Regexp
	prefix string
	fast   func(string) bool
}

func (m pathMatcher) match(_, path string) bool {
	if m.fast != nil {
		return m.fast(path)
	}
	return strings.HasPrefix(path, m.prefix) && m.re.MatchString(path)
}

// pathMatchers keeps the matcher of every pattern compiled: a profile
// update mostly repeats the patterns of the one before.
var pathMatchers recache.Memo[pathMatcher]

func newPathMatcher(pattern string) (pathMatcher, error) {
	re, err := recache.CompileAnchored(pattern)
	if err != nil {
		return pathMatcher{}, err
	}
	prefix, _ := re.LiteralPrefix()
	return pathMatcher{re: re, prefix: prefix, fast: fastPath(recache.Anchored(pattern))}, nil
}

type methodMatcher string

func (m methodMatcher) match(method, _ string) bool { return string(m) == method }

var errNilMatch = errors.New("null condition")

// requestMatch compiles m. A condition of an all or an any that does not
// compile is dropped, as linkerd2-proxy's convert_req_match filters them
// out; any other part that does not compile is an error, which drops the
// part that holds it.
func (c compiler) requestMatch(m RequestMatch, path *field, depth int) (matcher, error) {
	if depth > c.opts.MaxMatchDepth {
		return nil, fmt.Errorf("%s: nested deeper than %d", path, c.opts.MaxMatchDepth)
	}
	switch m := m.(type) {
	case MatchAll:
		out := make(allMatcher, 0, len(m))
		for i, child := range m {
			cp := path.at("all", i)
			cm, err := c.requestMatch(child, cp, depth+1)
			if err != nil {
				c.drop(cp, err)
				continue
			}
			out = append(out, cm)
		}
		return out, nil
	case MatchAny:
		out := make(anyMatcher, 0, len(m))
		for i, child := range m {
			cp := path.at("any", i)
			cm, err := c.requestMatch(child, cp, depth+1)
			if err != nil {
				c.drop(cp, err)
				continue
			}
			out = append(out, cm)
		}
		return out, nil
	case MatchNot:
		inner, err := c.requestMatch(m.Match, path.at("not", -1), depth+1)
		if err != nil {
			return nil, err
		}
		return notMatcher{inner}, nil
	case PathRegex:
		if len(m) > c.opts.MaxPathRegexLen {
			return nil, fmt.Errorf("%s.pathRegex: regex of %d bytes is longer than the limit of %d", path, len(m), c.opts.MaxPathRegexLen)
		}
		pm, err := pathMatchers.Get(string(m), newPathMatcher)
		if err != nil {
			return nil, fmt.Errorf("%s.pathRegex: bad regex: %v", path, err)
		}
		return pm, nil
	case Method:
		if !httpguts.ValidHeaderFieldName(string(m)) {
			return nil, fmt.Errorf("%s.method: %q is not an HTTP method", path, string(m))
		}
		return methodMatcher(m), nil
	case nil:
		return nil, fmt.Errorf("%s: %w", path, errNilMatch)
	}
	return nil, fmt.Errorf("%s: unknown condition %T", path, m)
}

type statusAll []classify.StatusMatcher

func (m statusAll) MatchStatus(code int) bool {
	for _, c := range m {
		if !c.MatchStatus(code) {
			return false
		}
	}
	return true
}

type statusAny []classify.StatusMatcher

func (m statusAny) MatchStatus(code int) bool {
	for _, c := range m {
		if c.MatchStatus(code) {
			return true
		}
	}
	return false
}

type statusNot struct{ m classify.StatusMatcher }

func (m statusNot) MatchStatus(code int) bool { return !m.m.MatchStatus(code) }

type statusRange struct{ lo, hi int }

func (m statusRange) MatchStatus(code int) bool { return code >= m.lo && code <= m.hi }

// responseMatch compiles m as linkerd2-proxy's convert_rsp_match converts
// it: a condition of an all or an any that does not compile is dropped,
// and an all or an any left empty does not compile; a status range
// compiles when both bounds are status codes (100-999), a zero bound
// standing for the other, and a reversed range matches nothing.
func (c compiler) responseMatch(m ResponseMatch, path *field, depth int) (classify.StatusMatcher, error) {
	if depth > c.opts.MaxMatchDepth {
		return nil, fmt.Errorf("%s: nested deeper than %d", path, c.opts.MaxMatchDepth)
	}
	switch m := m.(type) {
	case ResponseAll, ResponseAny:
		var seq []ResponseMatch
		name := "all"
		if all, ok := m.(ResponseAll); ok {
			seq = all
		} else {
			seq, name = m.(ResponseAny), "any"
		}
		out := make([]classify.StatusMatcher, 0, len(seq))
		for i, child := range seq {
			cp := path.at(name, i)
			sm, err := c.responseMatch(child, cp, depth+1)
			if err != nil {
				c.drop(cp, err)
				continue
			}
			out = append(out, sm)
		}
		if len(out) == 0 {
			// As in Linkerd's proxy: an empty sequence makes the class invalid.
			return nil, fmt.Errorf("%s.%s: empty", path, name)
		}
		if name == "all" {
			return statusAll(out), nil
		}
		return statusAny(out), nil
	case ResponseNot:
		inner, err := c.responseMatch(m.Match, path.at("not", -1), depth+1)
		if err != nil {
			return nil, err
		}
		return statusNot{inner}, nil
	case StatusRange:
		if err := m.convertible(); err != nil {
			return nil, fmt.Errorf("%s.status: %v", path, err)
		}
		lo, hi := m.bounds()
		return statusRange{int(lo), int(hi)}, nil
	case nil:
		return nil, fmt.Errorf("%s: %w", path, errNilMatch)
	}
	return nil, fmt.Errorf("%s: unknown condition %T", path, m)
}

// field names the place in a profile that an error is about
// (routes[2].condition.all[0]); it is formatted only when an error is,
// so that compiling a valid profile builds no names.
type field struct {
	up    *field
	name  string
	index int // -1: not an element of a list
}

// at returns the child name, or its element index when index >= 0.
func (f *field) at(name string, index int) *field { return &field{up: f, name: name, index: index} }

func (f *field) String() string {
	var b []byte
	var walk func(f *field)
	walk = func(f *field) {
		if f.up != nil {
			walk(f.up)
			b = append(b, '.')
		}
		b = append(b, f.name...)
		if f.index >= 0 {
			b = append(append(append(b, '['), strconv.Itoa(f.index)...), ']')
		}
	}
	walk(f)
	return string(b)
}
