package profiles

import (
	"context"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/inmesh/inmesh/classify"
	authpkg "github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/metrics"
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
// The first request to an authority starts a watch on the [Source] in the
// background and takes the default route: discovery never holds a request
// back. Each profile update is compiled and swapped in with one atomic
// store; requests in flight keep the route they started with; an update that
// fails to compile is logged and the last good table stays.
//
// A Router is safe for concurrent use. Close stops its watches.
type Router struct {
	src Source
	cfg routerConfig

	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.RWMutex
	hosts map[string]*dest // by the key the request gave
	dests map[string]*dest // by normalized authority

	other *dest // the destination of every authority past the bound

	fams families
}

type families struct {
	route, actual *metrics.Family
	retryable     *metrics.Counter
}

// dest is one authority: its watch and its current table.
type dest struct {
	authority string
	state     atomic.Pointer[tableState]
	stop      func()
}

// tableState is a compiled table with what requests need next to it: the
// budget state and the metric targets of each route.
type tableState struct {
	table   *Table
	budget  *Budget
	targets map[*CompiledRoute]*routeTargets
	def     *routeTargets
}

type routeTargets struct {
	in, out dirTargets
}

type dirTargets struct {
	route     *metrics.Target
	actual    *metrics.Target
	retryable []metric.AddOption
	noBudget  []metric.AddOption
}

func (ts *tableState) targetsOf(r *CompiledRoute) *routeTargets {
	if t := ts.targets[r]; t != nil {
		return t
	}
	return ts.def
}

// NewRouter returns a Router that watches src.
func NewRouter(src Source, opts ...RouterOption) *Router {
	cfg := newRouterConfig(opts)
	r := &Router{src: src, cfg: cfg, hosts: make(map[string]*dest), dests: make(map[string]*dest)}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	meter := metrics.Meter(cfg.mp, ScopeName)
	r.fams = families{
		route:  metrics.NewFamily(meter, "route_", true),
		actual: metrics.NewFamily(meter, "route_actual_", false),
		retryable: metrics.NewCounter(meter, "route_retryable_total",
			"Total count of retryable HTTP responses, and of those not retried for want of budget."),
	}
	r.other = r.newDest("other")
	return r
}

// Close stops every watch; the router keeps routing with the tables it has.
func (r *Router) Close() {
	r.cancel()
	r.mu.Lock()
	dests := make([]*dest, 0, len(r.dests))
	for _, d := range r.dests {
		dests = append(dests, d)
	}
	r.mu.Unlock()
	for _, d := range dests {
		if d.stop != nil {
			d.stop()
		}
	}
}

func (r *Router) newDest(authority string) *dest {
	d := &dest{authority: authority}
	d.state.Store(r.build(authority, nil))
	return d
}

// build compiles the state of a table for authority (nil: the empty table).
func (r *Router) build(authority string, t *Table) *tableState {
	if t == nil {
		t, _ = Compile(nil, Options{})
	}
	ts := &tableState{table: t, targets: make(map[*CompiledRoute]*routeTargets, len(t.routes))}
	if b := t.RetryBudget(); b != nil {
		ts.budget = NewBudget(*b)
	}
	dst := attribute.String("dst", authority)
	for _, cr := range t.routes {
		ts.targets[cr] = r.routeTargets(dst, cr.Labels)
	}
	ts.def = r.routeTargets(dst, nil)
	return ts
}

func (r *Router) routeTargets(dst attribute.KeyValue, labels map[string]string) *routeTargets {
	mk := func(direction string) dirTargets {
		kvs := []attribute.KeyValue{attribute.String("direction", direction), dst}
		for _, k := range slices.Sorted(maps.Keys(labels)) {
			kvs = append(kvs, attribute.String("rt_"+k, labels[k]))
		}
		return dirTargets{
			route:     metrics.NewTarget(r.fams.route, kvs...),
			actual:    metrics.NewTarget(r.fams.actual, kvs...),
			retryable: metrics.Opts(kvs...),
			noBudget:  metrics.Opts(append(kvs[:len(kvs):len(kvs)], attribute.String("skipped", "no_budget"))...),
		}
	}
	return &routeTargets{in: mk("inbound"), out: mk("outbound")}
}

// destFor returns the destination of a request's authority key, starting
// its watch on first use.
func (r *Router) destFor(key string) *dest {
	r.mu.RLock()
	d := r.hosts[key]
	r.mu.RUnlock()
	if d != nil {
		return d
	}
	authority, err := r.normalize(key)
	if err != nil {
		return r.other
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if d = r.hosts[key]; d != nil {
		return d
	}
	if d = r.dests[authority]; d == nil {
		if len(r.dests) >= r.cfg.maxAuthorities || r.ctx.Err() != nil {
			return r.other
		}
		d = r.newDest(authority)
		r.dests[authority] = d
		var err error
		if d.stop, err = r.src.Watch(r.ctx, authority, func(u Update) { r.apply(d, u) }); err != nil {
			r.cfg.logger.Warn("cannot watch the profile; using the default route", "authority", authority, "error", err)
		}
	}
	if len(r.hosts) < 2*r.cfg.maxAuthorities {
		r.hosts[key] = d
	}
	return d
}

func (r *Router) normalize(key string) (string, error) {
	if _, _, err := net.SplitHostPort(key); err != nil {
		key = net.JoinHostPort(strings.Trim(key, "[]"), r.cfg.defaultPort)
	}
	return authpkg.Normalize(key)
}

// apply compiles a profile update for d and swaps it in.
func (r *Router) apply(d *dest, u Update) {
	if u.Profile == nil {
		d.state.Store(r.build(d.authority, nil))
		return
	}
	t, err := Compile(u.Profile, r.cfg.compile)
	if err != nil {
		r.cfg.logger.Warn("rejected profile; keeping the last good one", "authority", d.authority, "error", err)
		return
	}
	if err := t.BudgetErr(); err != nil {
		r.cfg.logger.Warn("invalid retry budget; retries disabled", "authority", d.authority, "error", err)
	}
	next := r.build(d.authority, t)
	keepBudget(d.state.Load(), next)
	d.state.Store(next)
}

// Table returns the route table in force for authority (host:port), or
// nil when the router has not seen the authority.
func (r *Router) Table(authority string) *Table {
	a, err := authpkg.Normalize(authority)
	if err != nil {
		return nil
	}
	r.mu.RLock()
	d := r.dests[a]
	r.mu.RUnlock()
	if d == nil {
		return nil
	}
	return d.state.Load().table
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
func RouteFromContext(ctx context.Context) *CompiledRoute {
	r, _ := classify.ProviderFromContext(ctx).(*CompiledRoute)
	return r
}

func response(status int, c classify.Class) metrics.Response {
	return metrics.Response{Status: status, Failure: c.Failure, GRPC: c.GRPCStatus, Err: c.Error}
}
