package router

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/registry"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router/internal/profileroute"
	"go.opentelemetry.io/otel/attribute"
)

// Router routes requests by the route tables of both of Linkerd's models:
// ServiceProfiles and outbound policies (HTTPRoute and GRPCRoute).
//
// For each request it finds the authority (the Host, with its port), and
// then, as Linkerd's proxy does: the ServiceProfile's table when the
// profile has routes or destination overrides; else the outbound policy's
// table; else the default route, which sends the request on unchanged.
// Either source may be left out. Both tables run through one exchange loop
// (timeouts, retries with streaming-safe body replay, metrics): budgeted
// retries and the route_* families for profiles, counted retries and the
// outbound_{http,grpc}_route_* families for policies.
//
// The first request to an authority starts its watches in the background
// and takes the default route: discovery never holds a request back
// (unless [WithDiscoveryWait] allows a wait). Each profile or policy
// update is compiled and swapped in with one atomic store; requests in
// flight keep the route they started with; an update that fails to
// compile is logged and the last good table stays. The inbound side
// ([Router.Handler]) routes by profile only the server's own authorities
// ([WithLocalAuthorities]) and never watches the Host a client chose.
//
// The router holds at most [WithMaxAuthorities] authorities, evicting the
// least recently used past that, and releases an authority unused for
// [WithIdleTimeout], which stops its watches. The dst label of the route_*
// metrics is the authority for at most as many authorities over the
// router's life (and for every authority whose profile has routes or
// traffic splits, which the control plane bounds); every other request is
// labelled dst="other" ([OtherAuthority]).
//
// A Router is safe for concurrent use. Close stops its watches; requests
// after Close take the default route.
type Router struct {
	cfg config
	// prof routes by ServiceProfile: both directions with a profile
	// source; without one, only the inbound side, every request by the
	// default route.
	prof    *profileroute.Router
	outProf bool // the outbound side routes by prof

	ctx    context.Context
	cancel context.CancelFunc

	reg *registry.Registry[policyState] // the policy of each authority in use

	httpFam, grpcFam       *metrics.Outbound
	tcpRoutes              *metrics.TCPRoutes
	httpHedges, grpcHedges *metrics.Hedges
	profHedges             *metrics.Hedges // route_hedge_*, of ServiceProfile routes

	trace *meshtrace.Tracer // nil: tracing is off
}

// policyState is a compiled policy with the metric targets and retry
// budgets of its routes, built once per table.
type policyState struct {
	table   *policy.Table
	targets routeTargets
	// h2 are the targets of HTTP/2 requests when the table shares one
	// route table between the versions (nil otherwise: targets holds
	// both): each version keeps its own budgets, hedger and mirrors.
	h2 *routeTargets
	// first is closed by the authority's first answer from the policy
	// source; every state of the authority shares it.
	first *registry.First
	// forbidden counts the requests refused when the table forbids its
	// target's connections (nil otherwise).
	forbidden *metrics.ForbiddenConns
}

// routeTarget is what requests of one policy route need beside the route.
type routeTarget struct {
	route *policy.Route
	// fam is the family of the route's series, and series the series,
	// built on the route's first request: a table holds a route per
	// protocol (HTTP/1 and HTTP/2 for one name), of which requests use
	// one at most, and a proxy holds a table for each of thousands of
	// names.
	fam    *metrics.Outbound
	series atomic.Pointer[routeSeries]
	// trace are the span attributes of the route and its backends, built
	// on the first traced request.
	trace  atomic.Pointer[routeTrace]
	budget *profiles.Budget // nil: the count alone limits retries
	// balancing is the balancer configuration of each backend (by
	// position; nil: the balancer's own), from the policy's failure
	// accrual and the backend's queue.
	balancing []*balancer.BackendConfig
	// total is the sum of the random-available weights.
	total uint64
	// hedge hedges the route's requests; nil when it does not hedge.
	hedge *hedger
	// mirror sends the copies of the route's requests; nil without
	// mirrors.
	mirror *mirrorer
}

// routeTargets are the targets of a table's routes, each made on its
// route's first request: a table has a route per protocol at least
// (HTTP/1 and HTTP/2 for one name), of which requests use one at most, a
// profile with routes or destination overrides takes the requests of its
// name from the policy altogether, and a proxy holds a table for each of
// thousands of names. A table has few routes, nearly always one or two:
// up to fewRoutes they are a list, compared by pointer, and a map holds
// the rest.
type routeTargets struct {
	few  []routeSlot
	more map[*policy.Route]*routeSlot
}

// routeSlot is a route, the failure accrual of its protocol, and its
// target once made.
type routeSlot struct {
	route  *policy.Route
	fa     *balancer.FailureAccrual
	target atomic.Pointer[routeTarget]
}

// fewRoutes is how many targets routeTargets keeps in its list.
const fewRoutes = 8

// slot returns the slot of route, nil when it has none.
func (ts *routeTargets) slot(route *policy.Route) *routeSlot {
	for i := range ts.few {
		if ts.few[i].route == route {
			return &ts.few[i]
		}
	}
	return ts.more[route]
}

// routeOf is a route of a table and its protocol's failure accrual.
type routeOf struct {
	route *policy.Route
	fa    *balancer.FailureAccrual
}

// makeRouteTargets returns the slots of routes, none of them made yet.
func makeRouteTargets(routes []routeOf) routeTargets {
	ts := routeTargets{few: make([]routeSlot, min(len(routes), fewRoutes))}
	for i, ro := range routes {
		if i < fewRoutes {
			ts.few[i].route, ts.few[i].fa = ro.route, ro.fa
			continue
		}
		if ts.more == nil {
			ts.more = make(map[*policy.Route]*routeSlot, len(routes)-fewRoutes)
		}
		ts.more[ro.route] = &routeSlot{route: ro.route, fa: ro.fa}
	}
	return ts
}

// all returns every target made so far.
func (ts *routeTargets) all() []*routeTarget {
	var all []*routeTarget
	for i := range ts.few {
		if t := ts.few[i].target.Load(); t != nil {
			all = append(all, t)
		}
	}
	for _, s := range ts.more {
		if t := s.target.Load(); t != nil {
			all = append(all, t)
		}
	}
	return all
}

// New returns a Router over the sources its options give.
func New(opts ...Option) *Router {
	cfg := newConfig(opts)
	r := &Router{cfg: cfg, trace: meshtrace.New(cfg.tp, cfg.prop, "")}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	var start func(*registry.Entry[policyState]) (func(), error)
	if cfg.policies != nil {
		start = r.watch
	}
	r.reg = registry.New(func(string) *policyState { return &policyState{first: registry.NewFirst()} }, start,
		registry.WithMaxEntries(cfg.maxAuthorities), registry.WithIdleTimeout(cfg.idleTimeout),
		registry.WithDefaultPort(cfg.defaultPort))
	r.prof = profileroute.NewRouter(cfg.profiles, profileroute.WithMeterProvider(cfg.mp), profileroute.WithLogger(cfg.logger),
		profileroute.WithMaxAuthorities(cfg.maxAuthorities), profileroute.WithIdleTimeout(cfg.idleTimeout),
		profileroute.WithDstOverrideHeader(cfg.dstOverride), profileroute.WithCompileOptions(cfg.profileCompile),
		profileroute.WithLocalAuthorities(cfg.local...), profileroute.WithHedging(r.profileHedger))
	r.outProf = cfg.profiles != nil
	meter := metrics.Meter(cfg.mp, ScopeName)
	r.httpFam = metrics.NewOutbound(meter, false)
	r.grpcFam = metrics.NewOutbound(meter, true)
	r.httpHedges = metrics.NewHedges(meter, false)
	r.grpcHedges = metrics.NewHedges(meter, true)
	r.profHedges = metrics.NewProfileHedges(meter)
	r.tcpRoutes = metrics.NewTCPRoutes(meter)
	return r
}

// outProfiles returns the profile side of the outbound direction, nil
// without a profile source.
func (r *Router) outProfiles() *profileroute.Router {
	if r.outProf {
		return r.prof
	}
	return nil
}

// ProfileTable returns the ServiceProfile route table in force for
// authority (host:port, or a host with the default port), or nil when the
// router holds no profile state for it.
func (r *Router) ProfileTable(authority string) *profiles.Table { return r.prof.Table(authority) }

// ProfileRouteFromContext returns the ServiceProfile route the router chose
// for the request with context ctx (the default route when no profile
// route matched), or nil when no router routed it by profile.
func ProfileRouteFromContext(ctx context.Context) *profiles.CompiledRoute {
	return profileroute.RouteFromContext(ctx)
}

// Close stops every watch; later requests take the default route.
func (r *Router) Close() {
	r.cancel()
	r.reg.Close()
	r.prof.Close()
}

// policyFor returns the policy state of a request's authority, starting its
// watch on first use; nil without a policy source or once closed. An
// authority no request used for the idle timeout is released (its watch
// stops); past the bound the least recently used one is.
func (r *Router) policyFor(req *http.Request) *policyState {
	if r.cfg.policies == nil {
		return nil
	}
	e := r.reg.Get(requestKey(req))
	if e == nil {
		return nil
	}
	return e.Load()
}

// watch starts the policy watch of a new entry.
func (r *Router) watch(e *registry.Entry[policyState]) (func(), error) {
	stop, err := r.cfg.policies.Watch(r.ctx, e.Authority(), func(u policy.Update) { r.apply(e, u) })
	if err != nil {
		e.Load().first.Answered() // no answer will come: nobody waits for one
	}
	if err != nil && r.ctx.Err() == nil {
		r.cfg.logger.Warn("cannot watch the outbound policy; using the default route", "authority", e.Authority(), "error", err)
	}
	return stop, err
}

func requestKey(req *http.Request) string {
	if req.Host != "" {
		return req.Host
	}
	if req.URL != nil {
		return req.URL.Host
	}
	return ""
}

// apply compiles a policy update for d and swaps it in.
func (r *Router) apply(e *registry.Entry[policyState], u policy.Update) {
	// The state made of an answer has no First (nil: answered), so that
	// no entry keeps a channel past its first answer; the requests that
	// wait on the state before it are woken by the deferred Answered.
	first := e.Load().first
	defer first.Answered()
	if u.Policy == nil {
		e.Store(&policyState{})
		return
	}
	t, err := policy.Compile(u.Policy, r.cfg.compile)
	if err != nil {
		r.cfg.logger.Warn("rejected outbound policy; keeping the last good one", "authority", e.Authority(), "error", err)
		return
	}
	ps := r.build(t)
	if t.Forbidden() {
		ps.forbidden = r.tcpRoutes.Forbidden(ForbiddenLabels(t, e.Authority())...)
	}
	e.Store(ps)
}

// build makes the state of a compiled policy: a slot for the target of
// each route, made on the route's first request (see routeTargets).
func (r *Router) build(t *policy.Table) *policyState {
	ps := &policyState{table: t}
	p := t.Policy()
	type protoTable struct {
		rt *policy.RouteTable
		fa *policy.FailureAccrual
	}
	var tables []protoTable
	switch p.Protocol {
	case policy.ProtocolGRPC:
		tables = append(tables, protoTable{t.For(&http.Request{ProtoMajor: 2}), p.GRPC.FailureAccrual})
	default:
		tables = append(tables, protoTable{t.For(&http.Request{ProtoMajor: 1}), p.HTTP1.FailureAccrual},
			protoTable{t.For(&http.Request{ProtoMajor: 2}), p.HTTP2.FailureAccrual})
	}
	var routes, h2 []routeOf
	for i, pt := range tables {
		if pt.rt == nil {
			continue
		}
		list := &routes
		if i == 1 && t.SharesHTTPTables() {
			list = &h2
		}
		fa := balancerAccrual(pt.fa)
		for _, route := range pt.rt.Routes() {
			if !slices.ContainsFunc(*list, func(ro routeOf) bool { return ro.route == route }) {
				*list = append(*list, routeOf{route, fa})
			}
		}
	}
	ps.targets = makeRouteTargets(routes)
	if t.SharesHTTPTables() {
		h2 := makeRouteTargets(h2)
		ps.h2 = &h2
	}
	return ps
}

// target returns the target of route, selected for req, making it on
// first use; nil when route is not the table's.
func (ps *policyState) target(r *Router, req *http.Request, route *policy.Route) *routeTarget {
	ts := &ps.targets
	if ps.h2 != nil && req.ProtoMajor >= 2 {
		ts = ps.h2
	}
	s := ts.slot(route)
	if s == nil {
		return nil
	}
	if t := s.target.Load(); t != nil {
		return t
	}
	// A racing first request may make one too: the first stored wins,
	// and the other, holding nothing to release, is dropped.
	s.target.CompareAndSwap(nil, r.routeTarget(s.route, s.fa))
	return s.target.Load()
}

func metaLabels(prefix string, m policy.Metadata, withPort bool) []attribute.KeyValue {
	kvs := []attribute.KeyValue{
		attribute.String(prefix+"_group", m.Group),
		attribute.String(prefix+"_kind", m.Kind),
		attribute.String(prefix+"_namespace", m.Namespace),
		attribute.String(prefix+"_name", m.Name),
	}
	if withPort {
		port := ""
		if m.Port != 0 {
			port = strconv.Itoa(int(m.Port))
		}
		kvs = append(kvs, attribute.String(prefix+"_port", port), attribute.String(prefix+"_section_name", m.Section))
	}
	return kvs
}

func (r *Router) routeTarget(route *policy.Route, fa *balancer.FailureAccrual) *routeTarget {
	fam := r.httpFam
	if route.GRPC {
		fam = r.grpcFam
	}
	rt := &routeTarget{route: route, fam: fam}
	for _, b := range route.Backends.Backends {
		rt.balancing = append(rt.balancing, backendConfig(b.Backend, fa))
		rt.total += uint64(b.Weight)
	}
	if r.cfg.budget != nil {
		rt.budget = profiles.NewBudget(*r.cfg.budget)
	}
	rt.hedge = r.hedger(route, rt)
	rt.mirror = r.mirrorer(route, rt, fa)
	return rt
}

// routeTrace are the span attributes of a policy route.
type routeTrace struct {
	route    []attribute.KeyValue
	backends [][]attribute.KeyValue // by position in route.Backends
}

// traced returns the span attributes of the route, building them on
// first use: most processes trace nothing, or few of their routes.
func (rt *routeTarget) traced() *routeTrace {
	if t := rt.trace.Load(); t != nil {
		return t
	}
	t := &routeTrace{route: meshtrace.RouteAttrs(rt.route.Meta.Kind, rt.route.Meta.Name)}
	for _, b := range rt.route.Backends.Backends {
		t.backends = append(t.backends, meshtrace.BackendAttrs(b.Backend.Meta.Name))
	}
	rt.trace.CompareAndSwap(nil, t)
	return rt.trace.Load()
}

// routeSeries are the metric series of a policy route.
type routeSeries struct {
	route    *metrics.RouteTarget
	backends []*metrics.BackendTarget // by position in route.Backends
	// none is the series of a request no backend took, built on first
	// use: most routes never need it.
	none atomic.Pointer[metrics.BackendTarget]
}

// metrics returns the series of the route, building them on first use.
func (rt *routeTarget) metrics() *routeSeries {
	if s := rt.series.Load(); s != nil {
		return s
	}
	s := &routeSeries{route: metrics.NewRouteTarget(rt.fam, "", RouteLabels(rt.route)...)}
	for _, b := range rt.route.Backends.Backends {
		s.backends = append(s.backends, s.route.NewBackendTarget(BackendLabels(b.Backend.Meta)...))
	}
	rt.series.CompareAndSwap(nil, s) // a racing first request may have won
	return rt.series.Load()
}

// noBackend returns the series of a request of the route no backend took.
func (rt *routeTarget) noBackend() *metrics.BackendTarget {
	s := rt.metrics()
	if b := s.none.Load(); b != nil {
		return b
	}
	s.none.CompareAndSwap(nil, s.route.NewBackendTarget(BackendLabels(policy.Metadata{})...))
	return s.none.Load()
}

func (r *Router) normalize(key string) (string, error) { return r.reg.Normalize(key) }

// balancerAccrual is the balancer's form of a policy's failure accrual.
func balancerAccrual(fa *policy.FailureAccrual) *balancer.FailureAccrual {
	if fa == nil || fa.Consecutive == nil && fa.Unified == nil {
		return nil
	}
	bo := func(p backoff.Policy) balancer.Backoff {
		b := balancer.Backoff{MinBackoff: p.Min, MaxBackoff: p.Max, JitterRatio: p.Jitter}
		if p.Min > 0 && p.Jitter == 0 {
			b.JitterRatio = -1 // a policy's zero jitter is none, not the default
		}
		return b
	}
	out := &balancer.FailureAccrual{Ejection: balancer.Ejection{MinReadyEndpoints: fa.MinReadyEndpoints}}
	if c := fa.Consecutive; c != nil {
		out.ConsecutiveFailures = &balancer.ConsecutiveFailures{MaxFailures: c.MaxFailures, Backoff: bo(c.Backoff)}
	}
	if u := fa.Unified; u != nil {
		out.Unified = &balancer.Unified{SuccessRateThreshold: u.SuccessRateThreshold, Decay: u.Window,
			MinRequests: u.MinRequests, MaxConsecutiveFailures: u.MaxConsecutiveFailures, Backoff: bo(u.Backoff)}
	}
	return out
}

// backendConfig is the balancer configuration of a balancer backend: the
// policy's failure accrual, the backend's queue, load penalties and
// outlier detection; nil
// when none says anything or the backend is not a balancer.
func backendConfig(b policy.Backend, fa *balancer.FailureAccrual) *balancer.BackendConfig {
	if b.Balancer == nil {
		return nil
	}
	od := balancerOutlier(b.Balancer.Outlier)
	if fa == nil && b.Queue.Capacity == 0 && b.Queue.FailFastTimeout == 0 && b.Balancer.Penalty == nil && od == nil {
		return nil
	}
	bc := &balancer.BackendConfig{FailureAccrual: fa, QueueCapacity: int(b.Queue.Capacity), FailFast: b.Queue.FailFastTimeout, OutlierDetection: od}
	if p := b.Balancer.Penalty; p != nil {
		// The policy's penalty decay is ignored, as Linkerd's proxy
		// ignores it: a penalty fades with the RTT estimate.
		bc.PenaltyPeakEWMA = &balancer.PenaltyPeakEWMA{Penalty: p.Penalty, MaxRetryAfter: p.MaxRetryAfter}
	}
	return bc
}

// BackendConfig returns the balancer configuration of backend b of a
// route under the failure accrual fa of its protocol (nil when neither
// says anything or b is not a balancer backend): what the router gives
// the balancer for b, for other transports that balance policy backends.
func BackendConfig(b policy.Backend, fa *policy.FailureAccrual) *balancer.BackendConfig {
	return backendConfig(b, balancerAccrual(fa))
}

// RouteLabels returns the parent and route label groups of route's
// outbound_*_route_* series, and BackendLabels the backend group of a
// backend: the labels the router records, for other transports that
// record the same families.
func RouteLabels(route *policy.Route) []attribute.KeyValue {
	return append(metaLabels("parent", route.Parent, true), metaLabels("route", route.Meta, false)...)
}

// BackendLabels: see [RouteLabels].
func BackendLabels(m policy.Metadata) []attribute.KeyValue { return metaLabels("backend", m, true) }

// ForbiddenLabels returns the labels of the outbound_tcp_route_* series of
// a table that forbids its target's connections ([policy.Table.Forbidden]),
// for the target authority (host:port): the policy's parent, the opaque
// route, target_ip (empty for a name) and target_port, as Linkerd's proxy
// labels an opaque route's connections
// (linkerd/app/outbound/src/opaq/logical/route.rs, RouteLabels). The
// router records them; other transports that refuse the same requests
// record them too.
func ForbiddenLabels(t *policy.Table, authority string) []attribute.KeyValue {
	p := t.Policy()
	var route policy.Metadata
	if len(p.Opaque.Routes) > 0 {
		route = p.Opaque.Routes[0].Meta
	}
	host, port, err := net.SplitHostPort(authority)
	if err != nil {
		host, port = authority, ""
	}
	ip := ""
	if a, err := netip.ParseAddr(host); err == nil {
		ip = a.Unmap().String()
	}
	return append(append(metaLabels("parent", p.Parent, true), metaLabels("route", route, false)...),
		attribute.String("target_ip", ip), attribute.String("target_port", port))
}
