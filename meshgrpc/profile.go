package meshgrpc

import (
	"cmp"
	"context"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/profiles"
)

// profileState is a target's compiled ServiceProfile: its route table
// (package profiles' matching: routes in order, first match), its retry
// budget, and the route_* series of each route, labelled as the router
// labels them (direction, dst, rt_<label>).
type profileState struct {
	owner   *meshResolver
	table   *profiles.Table
	budget  *profiles.Budget
	targets map[*profiles.CompiledRoute]*profTarget
	def     *profTarget
	// logical is the backend of the profile's calls when it is not the
	// target: an IP's logical authority (see
	// [profiles.Profile.LogicalAuthority]), "" for the target.
	logical string
	// split is the profile's dst overrides, the backends its calls go
	// to by weight instead (nil: none, or every weight 0).
	split *balancer.Split
	// splitBackends are split's backends.
	splitBackends []string
}

type profTarget struct{ route, actual *metrics.Target }

// applies reports whether the profile routes calls: as Linkerd's proxy, a
// profile wins over the outbound policy only when it has routes or dst
// overrides of a weight above 0 (linkerd2-proxy
// linkerd/app/outbound/src/http/logical/profile.rs,
// should_override_policy).
func (ps *profileState) applies() bool {
	return ps != nil && (len(ps.table.Routes()) > 0 || ps.split != nil)
}

// backend returns the backend of a call the profile routes: one of its
// dst overrides, at random by weight, else its logical authority, else ""
// (the target itself).
func (ps *profileState) backend() string {
	if b := ps.split.Pick(); b != "" {
		return b
	}
	return ps.logical
}

// setProfile compiles a profile update of authority and returns its
// state: the parts that do not compile are left out and logged (see
// [profiles.Compile]); a profile that does not compile at all is logged
// and the last good one stays (nil is returned).
func (m *mesh) setProfile(authority string, owner *meshResolver, u profiles.Update) *profileState {
	t, err := profiles.Compile(u.Profile, profiles.Options{})
	if err != nil {
		m.plog.WarnErr("reject:"+authority, "meshgrpc: rejected service profile; keeping the last good one", err, "authority", authority)
		return nil
	}
	for _, d := range t.Dropped() {
		m.plog.WarnErr("dropped:"+authority, "meshgrpc: dropped a part of the service profile that does not compile; the rest applies", d.Err, "authority", authority, "route", d.Route, "dropped", d.Field)
	}
	ps := &profileState{owner: owner, table: t, targets: make(map[*profiles.CompiledRoute]*profTarget),
		logical: u.Profile.LogicalAuthority(authority)}
	if u.Profile != nil {
		// The backends of the targets of the profile, by weight, as the
		// HTTP stack splits a profile's traffic (balancer.Split).
		ps.split = balancer.NewSplit(u.Profile.DstOverrides)
		ps.splitBackends = ps.split.Backends()
	}
	if b := t.RetryBudget(); b != nil {
		ps.budget = profiles.NewBudget(*b)
	}
	dst := attribute.String("dst", cmp.Or(ps.logical, authority))
	mk := func(labels map[string]string) *profTarget {
		kvs := []attribute.KeyValue{attribute.String("direction", "outbound"), dst}
		for _, k := range slices.Sorted(maps.Keys(labels)) {
			kvs = append(kvs, attribute.String("rt_"+k, labels[k]))
		}
		ts := metrics.NewTargets(kvs, m.routeFam, m.actualFam)
		return &profTarget{route: ts[0], actual: ts[1]}
	}
	for _, cr := range t.Routes() {
		ps.targets[cr] = mk(cr.Labels)
	}
	ps.def = mk(nil)
	m.mu.Lock()
	m.profiles[authority] = ps
	m.mu.Unlock()
	return ps
}

// profileRoute returns the route of a call under ps, the route that
// matches the call as the HTTP/2 request it is (POST /pkg.Service/Method),
// or the default route.
func profileRoute(ctx context.Context, ps *profileState, method string) (*profiles.CompiledRoute, *profTarget) {
	v := getRequest(method, "", nil)
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		for k, vs := range md {
			v.r.Header[http.CanonicalHeaderKey(k)] = vs
		}
	}
	cr := ps.table.Select(&v.r)
	putRequest(v)
	if t := ps.targets[cr]; t != nil {
		return cr, t
	}
	return cr, ps.def
}

// profileResponse is the route_* labels of a call's end. The call is the
// HTTP/2 response it is (status 200, its code as grpc-status), classified
// as the router classifies one: the route's response classes match the
// status 200 first, as in Linkerd's proxy, then the code decides.
func profileResponse(cr *profiles.CompiledRoute, err error, timedOut bool) (metrics.Response, bool) {
	if timedOut {
		return metrics.Response{Failure: true, GRPC: -1, Err: "timeout"}, true
	}
	cl := cr.ResponseClassifier()
	c, final := cl.Head(true, http.StatusOK, nil)
	if !final {
		code := int32(status.Code(err))
		c = cl.EndStatus(c, true, strconv.Itoa(int(code)), true)
	}
	return metrics.Response{Status: http.StatusOK, Failure: c.Failure, GRPC: c.GRPCStatusLabel()}, c.Failure
}

// unaryProfile runs a unary call by a ServiceProfile route: its timeout
// bounds every attempt; a failure (the route's response classes, else
// the default gRPC rules) of a retryable route is retried while the
// profile's retry budget allows; route_* records the call,
// route_actual_* each attempt. Each attempt goes to a backend the
// profile's dst overrides draw anew, as Linkerd's proxy retries a profile
// route above its distribution
// (linkerd/app/outbound/src/http/logical/profile.rs, RouteParams), else
// to its logical authority, else to the target, authority.
func (m *mesh) unaryProfile(ctx context.Context, ps *profileState, authority, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	cr, tg := profileRoute(ctx, ps, method)
	start := time.Now()
	var deadline time.Time
	if cr.Timeout > 0 {
		deadline = start.Add(cr.Timeout)
		if pd, ok := ctx.Deadline(); ok && pd.Before(deadline) {
			deadline = time.Time{}
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cr.Timeout)
		defer cancel()
	}
	timedOut := func(err error) bool {
		return err != nil && !deadline.IsZero() && status.Code(err) == codes.DeadlineExceeded && !time.Now().Before(deadline)
	}
	tg.route.Request(ctx)
	if cr.Retryable && ps.budget != nil {
		ps.budget.Deposit()
	}
	// The caller's header, trailer, peer and OnFinish are the last
	// attempt's, handed over once (see [callHooks]).
	opts, hooks := takeHooks(opts)
	var own *attemptHooks
	if hooks.meta() {
		own = new(attemptHooks)
		opts = hooks.attempt(opts, own)
	}
	for {
		astart := time.Now()
		tg.actual.Request(ctx)
		if own != nil {
			*own = attemptHooks{}
		}
		actx := ctx
		if b := ps.split.Pick(); b != "" {
			actx = withDrawnBackend(ctx, authority, b)
		} else if ps.logical != "" {
			actx = withBackend(ctx, authority, ps.logical)
		}
		err := invoker(withoutRequireID(actx), method, req, reply, cc, opts...)
		if err != nil && classify.Abandoned(ctx) {
			// The application gave the call up: no response, in route_*
			// as in route_actual_*, as Linkerd's proxy records none for a
			// response future dropped with its client. A unary call
			// shows no response head before its end: it is taken to have
			// had none.
			hooks.end(own, err)
			return err
		}
		resp, failed := profileResponse(cr, err, timedOut(err))
		tg.actual.Response(ctx, resp, astart)
		if failed && cr.Retryable && ps.budget != nil && ctx.Err() == nil && ps.budget.Withdraw() {
			continue
		}
		if timedOut(err) {
			err = status.Error(codes.DeadlineExceeded, "request timed out after "+cr.Timeout.String())
		}
		tg.route.Response(ctx, resp, start)
		hooks.end(own, err)
		return err
	}
}
