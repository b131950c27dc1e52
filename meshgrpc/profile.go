package meshgrpc

import (
	"cmp"
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
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

// callCtx is ctx for one attempt of a call the profile routes: to a
// backend its dst overrides draw anew, else to its logical authority,
// else to the target, authority.
func (ps *profileState) callCtx(ctx context.Context, authority string) context.Context {
	if b := ps.split.Pick(); b != "" {
		return withDrawnBackend(ctx, authority, b)
	}
	if ps.logical != "" {
		return withBackend(ctx, authority, ps.logical)
	}
	return ctx
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
	return profileClass(cr.ResponseClassifier().GRPCCall(int64(status.Code(err))))
}

// profileDropped is the route_* labels of a stream its caller gave up
// after its response headers: the response as it stood, ended without
// trailers, as Linkerd's proxy classifies a response body dropped
// (linkerd2-proxy linkerd/http/metrics/src/requests/service.rs,
// ResponseBody's drop; linkerd/app/core/src/classify.rs, Eos::eos without
// trailers). Without response classes that is a gRPC call without its
// status, a success labelled grpc_status="2"; with classes, the one that
// matched the status 200 stands, else a success without a grpc_status.
func profileDropped(cr *profiles.CompiledRoute) metrics.Response {
	resp, _ := profileClass(cr.ResponseClassifier().GRPCCall(-1))
	return resp
}

// profileClass is the route_* labels of a call that ended with class c.
func profileClass(c classify.Class) (metrics.Response, bool) {
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
		err := invoker(withoutMeshMetadata(ps.callCtx(ctx, authority)), method, req, reply, cc, opts...)
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
		if cr.Retryable && ps.budget != nil && ctx.Err() == nil {
			// The budget is asked as each answer comes, as Linkerd's
			// proxy does (linkerd/app/outbound/src/http/retry.rs,
			// RetryPolicy::retry): a failure withdraws its retry, and a
			// failure the budget refuses deposits nothing; an answer
			// that is not retried deposits. An attempt the route's
			// timeout or the caller's deadline ended is no answer: the
			// proxy's retry is dropped before it is asked.
			if !failed {
				ps.budget.Deposit()
			} else if ps.budget.Withdraw() {
				continue
			}
		}
		if timedOut(err) {
			err = status.Error(codes.DeadlineExceeded, "request timed out after "+cr.Timeout.String())
		}
		tg.route.Response(ctx, resp, start)
		hooks.end(own, err)
		return err
	}
}

// streamProfile runs a streaming call by a ServiceProfile route, as
// Linkerd's proxy routes every HTTP/2 request of a profile, streams
// included (linkerd/app/outbound/src/http/logical/profile.rs,
// RouteParams): the route is matched as for a unary call; route_* and
// route_actual_* count the stream once, at its end, classified by its
// grpc-status as a unary call is (one its caller gave up after its
// response headers as its response stood then, without a status; one
// given up before them not at all); the route's timeout bounds the wait
// for the response headers only, as the proxy's response timeout
// (linkerd/proxy/http/src/timeout.rs) bounds the response future and not
// its body, so a stream that answered may run on. The stream goes to a
// backend the dst overrides draw, else to the logical authority, else to
// the target. It is not retried, but on a retryable route its answer
// makes its deposit into the profile's retry budget, as an answer of a
// unary call that is not retried does.
func (m *mesh) streamProfile(ctx context.Context, ps *profileState, authority string, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cr, tg := profileRoute(ctx, ps, method)
	s := &profileStream{cr: cr, tg: tg, ctx: ctx, start: time.Now(), oneResponse: !desc.ServerStreams}
	if cr.Timeout > 0 {
		s.ctx, s.fire = context.WithCancelCause(ctx)
	}
	tg.route.Request(s.ctx)
	tg.actual.Request(s.ctx)
	if cr.Retryable {
		s.budget = ps.budget
	}
	cs, err := streamer(withoutMeshMetadata(ps.callCtx(s.ctx, authority)), desc, cc, method, opts...)
	if err != nil {
		return nil, s.end(err)
	}
	s.ClientStream = cs
	s.mu.Lock()
	// A caller may end a stream by its context alone, never reading again
	// (as may the route's timeout): the stream is counted then.
	s.stopWatch = context.AfterFunc(s.ctx, s.ctxDone)
	if cr.Timeout > 0 {
		s.timer = time.AfterFunc(cr.Timeout, s.timedOut)
	}
	s.mu.Unlock()
	if cr.Timeout > 0 {
		go s.awaitHeaders()
	}
	return s, nil
}

// errProfileTimeout is the cause of a stream that its ServiceProfile
// route's timeout ended: a [classify.ErrTimeout], so that it is a
// timeout and not a stream its caller gave up, but no
// [classify.ErrEndpointTimeout], as Linkerd's proxy enforces the timeout
// above its balancer.
var errProfileTimeout error = &streamTimeout{"meshgrpc: service profile route timeout", false}

// profileStream is a client stream on a ServiceProfile route: it records
// the route's series once as the stream ends, and ends the stream when
// the route's timeout passes before its response headers.
type profileStream struct {
	grpc.ClientStream
	cr  *profiles.CompiledRoute
	tg  *profTarget
	ctx context.Context
	// fire ends ctx with the route's timeout (nil: the route has none).
	fire  context.CancelCauseFunc
	start time.Time
	// oneResponse: the call ends with its one response message.
	oneResponse bool
	// budget is the retry budget the stream's answer deposits into (nil:
	// none, the route is not retryable); paid: it has.
	budget *profiles.Budget
	paid   atomic.Bool

	mu    sync.Mutex
	timer *time.Timer
	// stopWatch takes off the watch of ctx.
	stopWatch func() bool
	ended     bool
}

// awaitHeaders stops the route's timeout once the stream has its
// response headers, or ended without them.
func (s *profileStream) awaitHeaders() {
	if md, err := s.ClientStream.Header(); err == nil && md != nil {
		s.answered()
	}
	s.mu.Lock()
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
}

// answered makes the stream's deposit into the retry budget, once, as
// its answer comes: its response headers, or its end with a status.
// Linkerd's proxy takes a stream on a retryable route into its retry
// policy too (its request body is not known to pass the 64 KiB it
// buffers), which deposits for each answer it does not retry, as the
// answer comes (linkerd/app/outbound/src/http/retry.rs,
// RetryPolicy::retry; linkerd/retry/src/lib.rs, Retry::call); a stream
// given up before its answer deposits nothing.
func (s *profileStream) answered() {
	if s.budget != nil && !s.paid.Swap(true) {
		s.budget.Deposit()
	}
}

// Header returns the stream's response headers; headers that come are
// its answer for the retry budget.
func (s *profileStream) Header() (metadata.MD, error) {
	md, err := s.ClientStream.Header()
	if err == nil && md != nil {
		s.answered()
	}
	return md, err
}

// timedOut ends the stream by the route's timeout.
func (s *profileStream) timedOut() { s.fire(errProfileTimeout) }

// ctxDone counts the end of a stream whose context ended, whether or not
// its caller reads again.
func (s *profileStream) ctxDone() { s.end(status.FromContextError(s.ctx.Err()).Err()) }

// end counts the stream's end with err (nil: OK) once, and returns err
// as the caller sees it: the route timeout's status when it ended the
// stream. A stream its caller gave up before its response headers is
// counted nowhere, as a unary call given up is not; one given up after
// them counts as its response stood then (see [profileDropped]).
func (s *profileStream) end(err error) error {
	timedOut := err != nil && s.fire != nil && context.Cause(s.ctx) == errProfileTimeout
	if timedOut {
		err = status.Error(codes.DeadlineExceeded, "request timed out after "+s.cr.Timeout.String())
	}
	// A stream its caller gave up after its response headers counts as
	// its response body dropped; one given up before them has no
	// response. grpc-go's Header is asked outside mu: it may finish the
	// stream, and so run the caller's hooks.
	givenUp := err != nil && classify.Abandoned(s.ctx)
	ctxEnded := err != nil && s.ctx.Err() != nil // given up, its deadline, the route's timeout
	headed := ctxEnded && s.ClientStream != nil && hadHeaders(s.ClientStream)
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return err
	}
	s.ended = true
	if !timedOut && (!ctxEnded || headed) {
		// Its end with a status, or with its response headers had.
		s.answered()
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	if s.stopWatch != nil {
		s.stopWatch()
	}
	// Counted before any end returns: a caller that saw its stream end
	// sees it counted.
	switch {
	case !givenUp:
		resp, _ := profileResponse(s.cr, err, timedOut)
		s.tg.actual.Response(s.ctx, resp, s.start)
		s.tg.route.Response(s.ctx, resp, s.start)
	case headed: // given up after its response headers
		resp := profileDropped(s.cr)
		s.tg.actual.Response(s.ctx, resp, s.start)
		s.tg.route.Response(s.ctx, resp, s.start)
	}
	s.mu.Unlock()
	if s.fire != nil {
		s.fire(nil)
	}
	return err
}

func (s *profileStream) RecvMsg(msg any) error {
	err := s.ClientStream.RecvMsg(msg)
	switch {
	case err == nil:
		s.answered() // a message comes after the response headers
		if s.oneResponse {
			s.end(nil)
		}
		return nil
	case errors.Is(err, io.EOF):
		s.end(nil)
		return err
	}
	return s.end(err)
}

func (s *profileStream) SendMsg(msg any) error {
	err := s.ClientStream.SendMsg(msg)
	if err != nil && !errors.Is(err, io.EOF) {
		// grpc-go ended the stream; its caller need not read again.
		return s.end(err)
	}
	return err
}
