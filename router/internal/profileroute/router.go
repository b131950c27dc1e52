package profileroute

import (
	"cmp"
	"context"
	"maps"
	"net/http"
	"slices"
	"sync/atomic"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/exchange"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/internal/registry"
	"github.com/inmesh/inmesh/profiles"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Router routes requests by the service profiles of their authorities.
//
// For each request it finds the authority (the Host, with its port; the
// l5d-dst-override header instead when [WithDstOverrideHeader] allows it),
// the current route table of that authority, and the first route that
// matches. The route goes into the request context ([RouteFromContext]),
// where classify finds its response classes, and names the route metrics.
// On the outbound side ([Router.Transport]) the first request to an
// authority starts a watch on the [profiles.Source] and takes the default route:
// discovery never holds a request back. The inbound side
// ([Router.Handler]) never starts a watch for the Host a client chose: it
// routes only the server's own authorities ([WithLocalAuthorities]).
//
// Each profile update is compiled and swapped in with one atomic store;
// requests in flight keep the route they started with; an update that fails
// to compile is logged and the last good table stays.
//
// The router holds at most [WithMaxAuthorities] authorities, evicting the
// least recently used past that, and releases an authority unused for
// [WithIdleTimeout], which stops its watch. The dst label of the route
// metrics is the authority for at most as many authorities over the
// router's life (and for every authority whose profile has routes or
// traffic splits, which the control plane bounds); every other request is
// labelled dst="other".
//
// A Router is safe for concurrent use. Close stops its watches; requests
// after Close take the default route.
type Router struct {
	src profiles.Source
	cfg routerConfig
	log *ratelog.Logger

	ctx    context.Context
	cancel context.CancelFunc

	reg    *registry.Registry[tableState]
	labels *registry.Names     // authorities admitted as dst label values
	local  map[string]struct{} // normalised authorities routed inbound

	other     *tableState // the default route with dst="other"
	otherDest dest

	fams families
}

type families struct {
	route, actual *metrics.Family
	retryable     *metrics.Counter
}

// OtherAuthority is the dst label value of requests whose authority has no
// label of its own: past the label bound, not a valid authority, or, on
// the inbound side, not one of the server's own authorities.
const OtherAuthority = "other"

// dest is what a request reads its authority's state through.
type dest struct{ state stateLoader }

type stateLoader interface{ Load() *tableState }

// fixedState is the state of requests routed by no entry.
type fixedState struct{ ts *tableState }

func (f *fixedState) Load() *tableState { return f.ts }

// tableState is a compiled table with what requests need next to it: the
// budget state and the metric targets of each route.
type tableState struct {
	table   *profiles.Table
	budget  *budgetCell // nil: the profile has no retry budget
	targets map[*profiles.CompiledRoute]*routeTargets
	def     *routeTargets
	// first is closed by the authority's first answer from the source;
	// every state of the authority shares it.
	first *registry.First
	// logical is where the authority's outbound requests go when it is
	// not the authority itself: an IP's profile's logical address (see
	// [profiles.Profile.LogicalAuthority]); "" for the authority.
	logical string
	// split is the profile's dst overrides that take traffic (a weight
	// above 0), nil without them. The router draws from it for the
	// requests it sends to logical; those to the authority itself are
	// split by the balancer.
	split *balancer.Split
}

// routeTargets are a route's metric targets, each direction's made on its
// first request: a router serves one direction in practice, and the
// targets of an authority that sees no traffic cost nothing. What makes
// them is kept as fields, not a closure: a closure would hold a copy of
// the dst label for each of thousands of names.
type routeTargets struct {
	r       *Router
	dst     string            // the dst label
	labels  map[string]string // the route's labels (rt_*), nil for the default route
	hedging func([]metric.AddOption) Hedger
	in, out atomic.Pointer[dirTargets]
}

func (rt *routeTargets) inbound() *dirTargets  { return rt.get(&rt.in, "inbound") }
func (rt *routeTargets) outbound() *dirTargets { return rt.get(&rt.out, "outbound") }

func (rt *routeTargets) get(p *atomic.Pointer[dirTargets], direction string) *dirTargets {
	if t := p.Load(); t != nil {
		return t
	}
	p.CompareAndSwap(nil, rt.build(direction)) // a racing first request may have won
	return p.Load()
}

type dirTargets struct {
	name      string               // the route's name label, for tap
	trace     []attribute.KeyValue // the route's span attributes
	route     *metrics.Target
	actual    *metrics.Target
	retryable []metric.AddOption
	// noBudget is the series of retries refused for want of budget,
	// built on the first refusal.
	noBudget atomic.Pointer[[]metric.AddOption]
	// plan is the outbound exchange plan of the route, built on its first
	// request (see newPlan).
	plan atomic.Pointer[exchange.Plan]
	// hedge hedges the attempts of an outbound route that hedges; nil
	// otherwise.
	hedge Hedger
}

// noBudgetOpts returns the series of a retry refused for want of budget.
func (tg *dirTargets) noBudgetOpts() []metric.AddOption {
	if o := tg.noBudget.Load(); o != nil {
		return *o
	}
	o := tg.route.AddOptions(attribute.String("skipped", "no_budget"))
	tg.noBudget.CompareAndSwap(nil, &o)
	return *tg.noBudget.Load()
}

func (ts *tableState) targetsOf(r *profiles.CompiledRoute) *routeTargets {
	if t := ts.targets[r]; t != nil {
		return t
	}
	return ts.def
}

// NewRouter returns a Router that watches src (nil: no source, every
// request takes the default route).
func NewRouter(src profiles.Source, opts ...RouterOption) *Router {
	cfg := newRouterConfig(opts)
	r := &Router{src: src, cfg: cfg, log: ratelog.New(cfg.logger, 0)}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	meter := metrics.Meter(cfg.mp, ScopeName)
	r.fams = families{
		route:  metrics.NewFamily(meter, "route_", true),
		actual: metrics.NewFamily(meter, "route_actual_", false),
		retryable: metrics.NewCounter(meter, "route_retryable_total",
			"Total count of retryable HTTP responses, and of those not retried for want of budget."),
	}
	r.other = r.build(OtherAuthority, nil)
	r.otherDest = dest{state: &fixedState{r.other}}
	r.labels = registry.NewNames(cfg.maxAuthorities)
	var start func(*registry.Entry[tableState]) (func(), error)
	if src != nil {
		start = r.watch
	}
	r.reg = registry.New(r.newState, start, registry.WithMaxEntries(cfg.maxAuthorities),
		registry.WithIdleTimeout(cfg.idleTimeout), registry.WithDefaultPort(cfg.defaultPort))
	r.local = make(map[string]struct{}, len(cfg.local))
	for _, a := range cfg.local {
		if n, err := r.reg.Normalize(a); err == nil {
			r.local[n] = struct{}{}
		} else {
			r.log.Slog().Warn("ignored a local authority that is not host:port", "authority", a, "error", err)
		}
	}
	for _, a := range cfg.local {
		r.reg.Get(a) // start watching the server's own profiles now
	}
	return r
}

// Close stops every watch and releases every authority; later requests
// take the default route. It is safe to call more than once.
func (r *Router) Close() {
	r.cancel()
	r.reg.Close()
}

// newState is the first state of an authority: the default route.
func (r *Router) newState(authority string) *tableState {
	if !r.labels.Admit(authority) {
		return r.other
	}
	ts := r.build(authority, nil)
	ts.first = registry.NewFirst()
	return ts
}

// watch starts the profile watch of a new entry.
func (r *Router) watch(e *registry.Entry[tableState]) (func(), error) {
	stop, err := r.src.Watch(r.ctx, e.Authority(), func(u profiles.Update) { r.apply(e, u) })
	if err != nil {
		e.Load().first.Answered() // no answer will come: nobody waits for one
	}
	if err != nil && r.ctx.Err() == nil {
		r.log.Warn("watch", "cannot watch a profile; using the default route", "authority", e.Authority(), "error", err)
	}
	return stop, err
}

// emptyTable is the table of every authority without a profile (yet): it
// is immutable, so they share it.
var emptyTable, _ = profiles.Compile(nil, profiles.Options{})

// build compiles the state of a table for authority (nil: the empty table).
func (r *Router) build(authority string, t *profiles.Table) *tableState {
	if t == nil {
		t = emptyTable
	}
	// A table without routes, as most are, needs no map.
	ts := &tableState{table: t}
	if n := len(t.Routes()); n > 0 {
		ts.targets = make(map[*profiles.CompiledRoute]*routeTargets, n)
	}
	if b := t.RetryBudget(); b != nil {
		ts.budget = &budgetCell{conf: *b}
	}
	for _, cr := range t.Routes() {
		ts.targets[cr] = &routeTargets{r: r, dst: authority, labels: cr.Labels, hedging: r.hedging(cr, ts)}
	}
	ts.def = &routeTargets{r: r, dst: authority}
	return ts
}

// hedging returns what builds the hedger of route cr of ts on its first
// outbound request (when ts's budget is final: [keepBudget] runs before
// ts serves); nil when the route does not hedge.
func (r *Router) hedging(cr *profiles.CompiledRoute, ts *tableState) func([]metric.AddOption) Hedger {
	if r.cfg.hedging == nil || !cr.Hedge.Enabled() {
		return nil
	}
	p := *cr.Hedge
	return func(opts []metric.AddOption) Hedger { return r.cfg.hedging(p, opts, ts.budget.get()) }
}

// defaultRouteAttrs are the span attributes of every default route,
// shared: most names have no profile routes, and a client keeps a default
// route for each of thousands of names.
var defaultRouteAttrs = meshtrace.RouteAttrs("ServiceProfile", "default")

// build makes the targets of one direction.
func (rt *routeTargets) build(direction string) *dirTargets {
	kvs := []attribute.KeyValue{attribute.String("direction", direction), attribute.String("dst", rt.dst)}
	for _, k := range slices.Sorted(maps.Keys(rt.labels)) {
		kvs = append(kvs, attribute.String("rt_"+k, rt.labels[k]))
	}
	trace := defaultRouteAttrs
	if name := rt.labels["route"]; name != "" {
		trace = meshtrace.RouteAttrs("ServiceProfile", name)
	}
	ts := metrics.NewTargets(kvs, rt.r.fams.route, rt.r.fams.actual)
	tg := &dirTargets{
		name:      rt.labels["route"],
		trace:     trace,
		route:     ts[0],
		actual:    ts[1],
		retryable: ts[0].AddOptions(),
	}
	if rt.hedging != nil && direction == "outbound" {
		tg.hedge = rt.hedging(tg.retryable)
	}
	return tg
}

// destFor returns the state of a request's authority key on the outbound
// side, starting its watch on first use.
func (r *Router) destFor(key string) dest {
	if e := r.reg.Get(key); e != nil {
		return dest{state: e}
	}
	return r.otherDest
}

// localDestFor returns the state of a request's authority key on the
// inbound side: one of the server's own authorities, or the default route.
func (r *Router) localDestFor(key string) dest {
	if len(r.local) > 0 {
		if e := r.reg.Cached(key); e != nil {
			if _, ok := r.local[e.Authority()]; ok {
				return dest{state: e}
			}
		}
		if a, err := r.reg.Normalize(key); err == nil {
			if _, ok := r.local[a]; ok {
				if e := r.reg.Get(key); e != nil {
					return dest{state: e}
				}
			}
		}
	}
	return r.otherDest
}

// label returns the dst label value of authority, whose profile has
// routes or dst overrides that take traffic when routed is set.
func (r *Router) label(authority string, routed bool) string {
	if routed {
		return authority
	}
	if r.labels.Admit(authority) {
		return authority
	}
	return OtherAuthority
}

// apply compiles a profile update for e and swaps it in.
func (r *Router) apply(e *registry.Entry[tableState], u profiles.Update) {
	authority := e.Authority()
	// The state made of an answer has no First (nil: answered), so that
	// no entry keeps a channel past its first answer; the requests that
	// wait on the state before it are woken by the deferred Answered.
	first := e.Load().first
	defer first.Answered()
	if u.Profile == nil {
		if r.labels.Admit(authority) {
			e.Store(r.build(authority, nil))
		} else {
			e.Store(r.other)
		}
		return
	}
	t, err := profiles.Compile(u.Profile, r.cfg.compile)
	if err != nil {
		r.log.WarnErr("reject:"+authority, "rejected profile; keeping the last good one", err, "authority", authority)
		return
	}
	for _, d := range t.Dropped() {
		r.log.WarnErr("dropped:"+authority, "dropped a part of the profile that does not compile; the rest applies", d.Err, "authority", authority, "route", d.Route, "dropped", d.Field)
	}
	if err := t.BudgetErr(); err != nil {
		r.log.WarnErr("budget:"+authority, "invalid retry budget; retries disabled", err, "authority", authority)
	}
	logical := u.Profile.LogicalAuthority(authority)
	split := balancer.NewSplit(u.Profile.DstOverrides)
	next := r.build(r.label(cmp.Or(logical, authority), len(t.Routes()) > 0 || split != nil), t)
	next.logical, next.split = logical, split
	keepBudget(e.Load(), next)
	e.Store(next)
}

// Table returns the route table in force for authority (host:port, or a
// host with the default port), or nil when the router holds no state for
// it.
func (r *Router) Table(authority string) *profiles.Table {
	e := r.reg.Lookup(authority)
	if e == nil {
		return nil
	}
	return e.Load().table
}

// requestKey returns the authority a request is routed by.
func (r *Router) requestKey(req *http.Request) string {
	if r.cfg.dstOverride {
		if v := req.Header.Get("L5d-Dst-Override"); v != "" {
			return v
		}
	}
	if req.Host != "" {
		return req.Host
	}
	if req.URL != nil {
		return req.URL.Host
	}
	return ""
}

// RouteFromContext returns the route the router chose for the request with
// context ctx, or nil when no router saw it.
func RouteFromContext(ctx context.Context) *profiles.CompiledRoute {
	r, _ := classify.ProviderFromContext(ctx).(*profiles.CompiledRoute)
	return r
}

func response(status int, c classify.Class) metrics.Response {
	return metrics.Response{Status: status, Failure: c.Failure, GRPC: c.GRPCStatusLabel(), Err: c.Error}
}

// keepBudget carries prev's budget state into next when both tables run
// the same retry budget, so that a profile delivered again (a reconnect,
// an unrelated edit) neither refills nor forgets the budget.
func keepBudget(prev, next *tableState) {
	if prev != nil && prev.budget != nil && next.budget != nil && prev.budget.conf == next.budget.conf {
		next.budget = prev.budget
	}
}

// budgetCell is a profile's retry budget, its running state made on first
// use: only a route that retries or hedges spends or earns it, most
// profiles have none such, and a proxy holds a profile for each of
// thousands of names. The states of a table that keep the budget share
// the cell (see keepBudget), so that a state made meanwhile is theirs.
type budgetCell struct {
	conf profiles.RetryBudget
	b    atomic.Pointer[profiles.Budget]
}

// get returns the running state, nil for a nil cell.
func (c *budgetCell) get() *profiles.Budget {
	if c == nil {
		return nil
	}
	if b := c.b.Load(); b != nil {
		return b
	}
	c.b.CompareAndSwap(nil, profiles.NewBudget(c.conf)) // a racing first use may have won
	return c.b.Load()
}
