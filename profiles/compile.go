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
}

// CompiledRoute is one route of a Table, or the default route. It is
// immutable. The router puts it into the request context
// (router.ProfileRouteFromContext), where classify finds its response
// classes.
type CompiledRoute struct {
	// Route is the route as the profile gave it; the zero Route for the
	// default route.
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

// Compile turns p into a route table, or returns an error naming the field
// at fault (routes[2].condition.all[0].pathRegex: ...). A nil p compiles to
// the empty table, where every request takes the default route. An invalid
// retry budget is not an error: the table then has retries disabled, as
// Linkerd's proxy does, and [Table.BudgetErr] says why.
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
		path := &field{name: "routes", index: i}
		if r.Condition == nil {
			return nil, fmt.Errorf("%s.condition: required", path)
		}
		m, err := compileRequestMatch(r.Condition, path.at("condition", -1), 0, opts)
		if err != nil {
			return nil, err
		}
		if r.Timeout < 0 {
			return nil, fmt.Errorf("%s.timeout: negative duration %v", path, r.Timeout)
		}
		if r.Hedge != nil {
			if err := r.Hedge.Validate(); err != nil {
				return nil, fmt.Errorf("%s.hedge.%w", path, err)
			}
		}
		cl := &classify.Classifier{}
		for j, rc := range r.ResponseClasses {
			cpath := path.at("responseClasses", j).at("condition", -1)
			if rc.Condition == nil {
				return nil, fmt.Errorf("%s: required", cpath)
			}
			sm, err := compileResponseMatch(rc.Condition, cpath, 0, opts)
			if err != nil {
				return nil, err
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

// Profile returns the profile the table was compiled from (nil for the
// empty table).
func (t *Table) Profile() *Profile { return t.profile }

// Routes returns the compiled routes in order.
func (t *Table) Routes() []*CompiledRoute { return t.routes }

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
// the query).
func (t *Table) SelectPath(method, path string) *CompiledRoute {
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

func compileRequestMatch(m RequestMatch, path *field, depth int, opts Options) (matcher, error) {
	if depth > opts.MaxMatchDepth {
		return nil, fmt.Errorf("%s: nested deeper than %d", path, opts.MaxMatchDepth)
	}
	switch m := m.(type) {
	case MatchAll:
		out := make(allMatcher, len(m))
		for i, c := range m {
			var err error
			if out[i], err = compileRequestMatch(c, path.at("all", i), depth+1, opts); err != nil {
				return nil, err
			}
		}
		return out, nil
	case MatchAny:
		out := make(anyMatcher, len(m))
		for i, c := range m {
			var err error
			if out[i], err = compileRequestMatch(c, path.at("any", i), depth+1, opts); err != nil {
				return nil, err
			}
		}
		return out, nil
	case MatchNot:
		inner, err := compileRequestMatch(m.Match, path.at("not", -1), depth+1, opts)
		if err != nil {
			return nil, err
		}
		return notMatcher{inner}, nil
	case PathRegex:
		if len(m) > opts.MaxPathRegexLen {
			return nil, fmt.Errorf("%s.pathRegex: regex of %d bytes is longer than the limit of %d", path, len(m), opts.MaxPathRegexLen)
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

func compileResponseMatch(m ResponseMatch, path *field, depth int, opts Options) (classify.StatusMatcher, error) {
	if depth > opts.MaxMatchDepth {
		return nil, fmt.Errorf("%s: nested deeper than %d", path, opts.MaxMatchDepth)
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
		if len(seq) == 0 {
			// As in Linkerd's proxy: an empty sequence makes the class invalid.
			return nil, fmt.Errorf("%s.%s: empty", path, name)
		}
		out := make([]classify.StatusMatcher, len(seq))
		for i, c := range seq {
			var err error
			if out[i], err = compileResponseMatch(c, path.at(name, i), depth+1, opts); err != nil {
				return nil, err
			}
		}
		if name == "all" {
			return statusAll(out), nil
		}
		return statusAny(out), nil
	case ResponseNot:
		inner, err := compileResponseMatch(m.Match, path.at("not", -1), depth+1, opts)
		if err != nil {
			return nil, err
		}
		return statusNot{inner}, nil
	case StatusRange:
		if err := m.check(); err != nil {
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
