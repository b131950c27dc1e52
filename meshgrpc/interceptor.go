package meshgrpc

import (
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/proxyerr"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/router"
)

// routeTarget is what the calls of one GRPCRoute rule need beside the
// rule: its series (the router's metric code, labels as the router sets
// them) and one per backend.
type routeTarget struct {
	route     *policy.Route
	metrics   *metrics.RouteTarget
	backends  []*metrics.BackendTarget
	noBackend *metrics.BackendTarget
	total     uint64
	// mirror copies the rule's unary calls (mirror.go); nil without
	// mirrors.
	mirror *mirrorer
	// hedge hedges the rule's calls; nil when it does not hedge.
	hedge *hedger
}

func (m *mesh) newRouteTarget(route *policy.Route, _ *policy.FailureAccrual) *routeTarget {
	fam := m.fam
	if !route.GRPC {
		fam = m.httpFam
	}
	rt := &routeTarget{route: route, metrics: metrics.NewRouteTarget(fam, "", router.RouteLabels(route)...)}
	for _, b := range route.Backends.Backends {
		rt.backends = append(rt.backends, rt.metrics.NewBackendTarget(router.BackendLabels(b.Backend.Meta)...))
		rt.total += uint64(b.Weight)
	}
	rt.noBackend = rt.metrics.NewBackendTarget(router.BackendLabels(policy.Metadata{})...)
	rt.hedge = m.newHedger(route, rt.metrics)
	return rt
}

// targetAuthority is the host:port of a channel target inmesh:///host:port.
func targetAuthority(target string) (authority string, inmesh bool) {
	// The common spelling, read without parsing (which allocates on
	// every call): nothing to unescape, no query or fragment.
	const prefix = Scheme + ":///"
	if rest, ok := strings.CutPrefix(target, prefix); ok && !strings.ContainsAny(rest, "%?#") {
		return rest, validAuthority(rest)
	}
	if u, err := url.Parse(target); err == nil && u.Scheme == Scheme {
		a := strings.TrimPrefix(u.Path, "/")
		return a, validAuthority(a)
	}
	return target, false
}

// validAuthority reports whether the resolver can be built for authority
// (host:port): a target it refuses has no resolver, so no answers to wait
// for.
func validAuthority(a string) bool { return a != "" && strings.Contains(a, ":") }

// call is one logical call on a policy route.
type call struct {
	m      *mesh
	rt     *routeTarget
	method string
	// target is the authority of the call's channel.
	target string
	start  time.Time
	// timeout is the route's; routeDeadline is when it ends the call,
	// zero when the caller's own deadline comes first.
	timeout       time.Duration
	routeDeadline time.Time
}

// errForbiddenRoute fails the calls of a target whose policy refuses
// every connection (policy.Table.Forbidden): Unavailable, as a gRPC
// client sees the connection that Linkerd's proxy closes for it, with the
// router's word for it.
var errForbiddenRoute = status.Error(codes.Unavailable, router.ErrForbiddenRoute.Error())

// route selects the call's route by the router's best-match rules
// (policy.Table.Select, over the call as the HTTP/2 request it is: POST
// to /pkg.Service/Method with the outgoing metadata as headers); nil
// without a policy. A policy that forbids its target fails the call
// (errForbiddenRoute), never sent.
func (m *mesh) route(ctx context.Context, st *channelState, authority, method string) (*routeTarget, error) {
	if st != nil && st.table.Forbidden() {
		st.forbidden.Refused()
		return nil, errForbiddenRoute
	}
	if st == nil || st.routes == nil {
		return nil, nil
	}
	v := getRequest(method, authority, nil)
	v.r.Header["Content-Type"] = grpcContentType
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		for k, vs := range md {
			v.r.Header[http.CanonicalHeaderKey(k)] = vs
		}
	}
	route, _ := st.routes.Select(&v.r)
	putRequest(v)
	if route == nil {
		return nil, status.Error(codes.NotFound, "no route found for request")
	}
	if meshtrace.Enabled(ctx) {
		meshtrace.Route(ctx, route.Meta.Kind, route.Meta.Name)
	}
	return st.targets[route], nil
}

// prepare applies the route's filters and picks its backend for one
// attempt: the context to send it with, the backend's series, or the
// status a filter or the distribution answers with.
func (c *call) prepare(ctx context.Context) (context.Context, *metrics.BackendTarget, error) {
	route := c.rt.route
	ctx, err := filters(ctx, route.Filters)
	if err != nil {
		return ctx, nil, err
	}
	i := c.pick()
	if i < 0 {
		msg := "no backends for this route"
		if len(route.Backends.Backends) > 0 {
			msg = "every backend of this route has weight 0"
		}
		return ctx, c.rt.noBackend, status.Error(codes.Internal, msg)
	}
	rb := &route.Backends.Backends[i]
	if ctx, err = filters(ctx, rb.Filters); err != nil {
		return ctx, c.rt.backends[i], err
	}
	switch b := rb.Backend; {
	case b.Balancer != nil:
		ctx = withBackend(ctx, c.target, b.Balancer.Authority)
	case b.Forward != nil:
		ctx = withBackend(ctx, c.target, forwardKey(b.Forward))
	default:
		return ctx, c.rt.backends[i], status.Error(codes.Unavailable, "backend has no destination the client can balance")
	}
	return ctx, c.rt.backends[i], nil
}

// filters applies gRPC filters: request header modifiers edit the
// outgoing metadata; a failure injector that fires fails the call with
// its code and message (an HTTPRoute's, with the code of its HTTP status,
// as the HTTP router answers a gRPC request).
func filters(ctx context.Context, fs []policy.Filter) (context.Context, error) {
	for _, f := range fs {
		switch {
		case f.GRPCFailureInjector != nil:
			fi := f.GRPCFailureInjector
			if p := fi.Ratio.Probability(); p >= 1 || rand.Float64() < p {
				return ctx, status.Error(fi.Code, fi.Message)
			}
		case f.FailureInjector != nil:
			// An HTTPRoute's: the status the HTTP router answers a gRPC
			// request with.
			fi := f.FailureInjector
			if p := fi.Ratio.Probability(); p >= 1 || rand.Float64() < p {
				return ctx, status.Error(codes.Code(proxyerr.GRPCCode(fi.Status)), fi.Message)
			}
		case f.RequestHeaders != nil:
			md, _ := metadata.FromOutgoingContext(ctx)
			h := http.Header{}
			for k, vs := range md {
				h[http.CanonicalHeaderKey(k)] = vs
			}
			f.RequestHeaders.Apply(h)
			out := metadata.MD{}
			for k, vs := range h {
				out[strings.ToLower(k)] = vs
			}
			ctx = metadata.NewOutgoingContext(ctx, out)
		}
	}
	return ctx, nil
}

// pick chooses the backend of an attempt: the first of a first-available
// distribution, one at random by weight of a random-available one, -1
// when there is none.
func (c *call) pick() int {
	d := &c.rt.route.Backends
	switch d.Kind {
	case policy.DistributionFirstAvailable:
		if len(d.Backends) > 0 {
			return 0
		}
	case policy.DistributionRandomAvailable:
		if c.rt.total == 0 {
			return -1
		}
		n := rand.Uint64N(c.rt.total)
		for i, b := range d.Backends {
			if n < uint64(b.Weight) {
				return i
			}
			n -= uint64(b.Weight)
		}
	}
	return -1
}

// deadline bounds ctx by the route's request timeout (the whole call,
// every retry included); a unary call's request ends as it starts, so its
// response timeout bounds it the same, the earlier of the two winning (a
// stream's response and idle timeouts are its [streamTimers]). The call
// remembers when the route, not the caller's own deadline, ends it.
func (c *call) deadline(ctx context.Context, unary bool) (context.Context, context.CancelFunc) {
	t := c.rt.route.Timeouts.Request
	if r := c.rt.route.Timeouts.Response; r > 0 && unary && (t <= 0 || r < t) {
		t = r
	}
	if t <= 0 {
		return ctx, func() {}
	}
	c.timeout = t
	d := time.Now().Add(t)
	if pd, ok := ctx.Deadline(); !ok || d.Before(pd) {
		c.routeDeadline = d
	}
	return context.WithDeadlineCause(ctx, d, errRequestTimeout)
}

// timedOut reports whether err is the end the route timeout made: a
// DEADLINE_EXCEEDED at or past the route's deadline (the server's answer
// to the grpc-timeout may come before the client's own timer fires).
func (c *call) timedOut(err error) bool {
	return err != nil && !c.routeDeadline.IsZero() && status.Code(err) == codes.DeadlineExceeded &&
		!time.Now().Before(c.routeDeadline)
}

// status is the series labels of a call's end.
func (c *call) status(ctx context.Context, err error) metrics.Status {
	if c.timedOut(err) {
		return metrics.Status{GRPC: -1, Error: "REQUEST_TIMEOUT"}
	}
	if failedFast(err) {
		// No endpoint of the backend took the call within the failfast
		// timeout: Linkerd's FAIL_FAST error, no status from upstream.
		return metrics.Status{GRPC: -1, Error: "FAIL_FAST"}
	}
	if err != nil {
		switch context.Cause(ctx) {
		case errStreamResponseTimeout:
			return metrics.Status{GRPC: -1, Error: "RESPONSE_STREAM_TIMEOUT"}
		case errStreamIdleTimeout:
			return metrics.Status{GRPC: -1, Error: "IDLE_TIMEOUT"}
		}
	}
	if abandoned(ctx, err) {
		// Given up after its response headers (one given up before has
		// no series): Linkerd's proxy drops the response body, recorded
		// as the error UNKNOWN (linkerd2-proxy
		// linkerd/app/outbound/src/http/logical/policy/route/metrics/tests.rs,
		// grpc_response_body_drop_early); error="CANCEL" is a reset by
		// the server.
		return metrics.Status{GRPC: -1, Error: "UNKNOWN"}
	}
	st := metrics.Status{GRPC: int32(status.Code(err))}
	if err == nil && !c.rt.route.GRPC {
		// An HTTPRoute's series (outbound_http_route_*) carry the HTTP
		// status: a call that succeeded had a 200.
		st.HTTP = http.StatusOK
	}
	return st
}

// abandoned reports whether err ended a call that its caller, whose
// context is ctx, gave up: not a stream timeout of the route, which
// cancels ctx too.
func abandoned(ctx context.Context, err error) bool {
	if err == nil || status.Code(err) != codes.Canceled || !classify.Abandoned(ctx) {
		return false
	}
	// Only here: the target of errors.As escapes, and a call that was not
	// given up allocates nothing for the question.
	var st *streamTimeout
	return !errors.As(context.Cause(ctx), &st)
}

// retryable reports whether the route retries a call that ended with err.
func (c *call) retryable(err error) bool {
	r := c.rt.route.Retry
	return r != nil && err != nil && r.RetryableCode(status.Code(err))
}

// allow says whether retry number n (0: the first) may go, counting it,
// and waits the retry backoff.
func (c *call) allow(ctx context.Context, n int) bool {
	r := c.rt.route.Retry
	if n >= r.Limit() {
		c.rt.metrics.LimitExceeded(ctx)
		return false
	}
	c.rt.metrics.Retry(ctx)
	t := time.NewTimer(r.BackoffPolicy().Delay(n))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// unary runs a unary call by its route: the deadline, then attempts:
// filters, backend, the call; a failure with one of the route's retry
// codes is retried while the count allows (counted retries, as Linkerd's
// GRPCRoute retry.linkerd.io/grpc and retry.linkerd.io/limit).
func (m *mesh) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	authority, inmesh := targetAuthority(cc.Target())
	st, ps, waits := m.lookup(authority, inmesh)
	if waits {
		if err := m.await(ctx, cc, authority); err != nil {
			return err
		}
		st, ps, _ = m.lookup(authority, inmesh)
	}
	if ps.applies() {
		return m.unaryProfile(ctx, ps, authority, method, req, reply, cc, invoker, opts...)
	}
	rt, err := m.route(ctx, st, authority, method)
	if err != nil || rt == nil {
		if err != nil {
			return err
		}
		return invoker(withoutMeshMetadata(ctx), method, req, reply, cc, opts...)
	}
	c := &call{m: m, rt: rt, method: method, target: authority, start: time.Now()}
	ctx, cancel := c.deadline(ctx, true)
	defer cancel()
	// A mirror's copy is sent once, never hedged: it gets the invoker as
	// it came (and none of the caller's options but the codec's).
	plain := invoker
	if rt.hedge != nil {
		invoker = rt.hedge.invoker(invoker)
	}
	// The caller's header, trailer, peer and OnFinish are the last
	// attempt's, handed over once (see [callHooks]).
	opts, hooks := takeHooks(opts)
	aopts := opts
	var own *attemptHooks
	if hooks.meta() {
		own = new(attemptHooks)
		aopts = hooks.attempt(opts, own)
	}
	var retries int
	for {
		actx, bt, err := c.prepare(ctx)
		actx = withoutMeshMetadata(actx) // for the mirror's copy too
		if bt != nil {
			bt.Request(ctx)
		}
		if retries == 0 && err == nil && rt.mirror != nil {
			rt.mirror.start(actx, method, req, cc, plain, opts) // once per call, never per retry
		}
		if own != nil {
			*own = attemptHooks{} // an attempt that opens no stream leaves it so
		}
		start := time.Now()
		tryTimedOut := false
		if err == nil {
			// The retry's timeout bounds each attempt but the last; an
			// attempt that runs out is retried whatever its code.
			if r := rt.route.Retry; r != nil && r.Timeout > 0 && retries < r.Limit() {
				tctx, tcancel := context.WithTimeoutCause(actx, r.Timeout, errTryTimeout)
				err = invoker(tctx, method, req, reply, cc, aopts...)
				tryTimedOut = err != nil && ctx.Err() == nil &&
					(errors.Is(context.Cause(tctx), errTryTimeout) || serverTimedOut(ctx, tctx, err))
				tcancel()
			} else {
				err = invoker(actx, method, req, reply, cc, aopts...)
			}
		}
		err = c.timeoutErr(ctx, err)
		// A unary call's response headers are not seen: one its caller
		// gave up is taken as given up before them (a server rarely
		// sends its headers before its answer).
		if bt != nil && !abandoned(ctx, err) {
			st := c.status(ctx, err)
			if tryTimedOut {
				st = metrics.Status{GRPC: -1, Error: "RESPONSE_HEADERS_TIMEOUT"}
			}
			bt.Done(ctx, st, start)
		}
		if (tryTimedOut || c.retryable(err)) && ctx.Err() == nil {
			if c.allow(ctx, retries) {
				retries++
				continue
			}
		}
		c.done(ctx, err, retries, false)
		hooks.end(own, err)
		return err
	}
}

// serverTimedOut reports whether err is the server's answer to the
// grpc-timeout of an attempt bounded by tctx, its own deadline (not
// ctx's): DEADLINE_EXCEEDED at or past that deadline. The server's timer
// may fire before the client's own (grpc-timeout is rounded up, and the
// server starts it later, so never before the client's deadline).
func serverTimedOut(ctx, tctx context.Context, err error) bool {
	td, ok := tctx.Deadline()
	if !ok || status.Code(err) != codes.DeadlineExceeded || time.Now().Before(td) {
		return false
	}
	d, ok := ctx.Deadline()
	return !ok || td.Before(d)
}

// timeoutErr is err with the route timeout's message when a route
// timeout ended the call: its request timeout, or a stream's response or
// idle timeout (ctx is the stream's).
func (c *call) timeoutErr(ctx context.Context, err error) error {
	if c.timedOut(err) {
		return status.Error(codes.DeadlineExceeded, "request timed out after "+c.timeout.String())
	}
	if err != nil && !errors.Is(err, io.EOF) {
		switch context.Cause(ctx) {
		case errStreamResponseTimeout:
			return status.Error(codes.DeadlineExceeded, "response timed out after "+c.rt.route.Timeouts.Response.String())
		case errStreamIdleTimeout:
			return status.Error(codes.DeadlineExceeded, "stream idle for "+c.rt.route.Timeouts.Idle.String())
		}
	}
	return err
}

// The causes of a call's end by its policy route's timeouts: the request
// timeout, the retry's timeout of an attempt, a stream's response and
// idle timeouts. Each is a [classify.ErrTimeout], so that an attempt they
// end is a timeout, not a call its application gave up
// ([classify.Abandoned]), and a [classify.ErrEndpointTimeout]: Linkerd's
// proxy enforces them under the endpoint's breaker, so that a call they
// end is a failure of its endpoint ([givenUp]).
var (
	errRequestTimeout        error = &streamTimeout{"meshgrpc: request timeout", true}
	errTryTimeout            error = &streamTimeout{"meshgrpc: retry timeout", true}
	errStreamResponseTimeout error = &streamTimeout{"meshgrpc: response timeout", true}
	errStreamIdleTimeout     error = &streamTimeout{"meshgrpc: idle timeout", true}
)

// streamTimeout is the cause of a call's end by a timeout of its route;
// endpoint: one enforced at the endpoint, under its breaker.
type streamTimeout struct {
	what     string
	endpoint bool
}

func (e *streamTimeout) Error() string { return e.what }
func (e *streamTimeout) Is(target error) bool {
	return target == classify.ErrTimeout || e.endpoint && target == classify.ErrEndpointTimeout
}

// streamTimers are a routed stream's response and idle timeouts, as
// Linkerd's proxy enforces them on a stream
// (linkerd/http/stream-timeouts): the response timeout bounds the time
// from the end of the request (CloseSend), or the response's start if it
// comes first, to the end of the stream, so that a slow upload does not
// count; the idle timeout the time in which no message moves either way
// (a wait for the response included). Either ends the stream's context
// with its cause. Nil when the route sets neither.
type streamTimers struct {
	response, idle time.Duration
	fire           context.CancelCauseFunc

	mu        sync.Mutex
	respTimer *time.Timer
	idleTimer *time.Timer
	stopped   bool
}

func newStreamTimers(response, idle time.Duration, fire context.CancelCauseFunc) *streamTimers {
	t := &streamTimers{response: response, idle: idle, fire: fire}
	if idle > 0 {
		t.idleTimer = time.AfterFunc(idle, func() { fire(errStreamIdleTimeout) })
	}
	return t
}

// responseStarts starts the response timeout, once: the request ended or
// the response began.
func (t *streamTimers) responseStarts() {
	if t == nil || t.response <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.respTimer == nil && !t.stopped {
		t.respTimer = time.AfterFunc(t.response, func() { t.fire(errStreamResponseTimeout) })
	}
}

// moved restarts the idle timeout: a message went or came.
func (t *streamTimers) moved() {
	if t == nil || t.idleTimer == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.idleTimer.Reset(t.idle)
	}
}

// stop ends both timeouts: the stream ended.
func (t *streamTimers) stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	if t.respTimer != nil {
		t.respTimer.Stop()
	}
	if t.idleTimer != nil {
		t.idleTimer.Stop()
	}
}

// done records the end of the call, which had response headers when
// headed. A call its caller gave up before its response headers has no
// status and no duration, as Linkerd's proxy records none for a response
// future dropped with its client (linkerd/http/prom src/status.rs and
// src/record_response.rs).
func (c *call) done(ctx context.Context, err error, retries int, headed bool) {
	if abandoned(ctx, err) && !headed {
		return
	}
	st := c.status(ctx, err)
	c.rt.metrics.Done(ctx, st, c.start)
	if retries > 0 && st.Error == "" && !c.retryable(err) {
		c.rt.metrics.RetrySuccess(ctx)
	}
}

// stream runs a streaming call by its route: the deadline, filters,
// backend and metrics as unary calls; a retry happens only before the
// stream is committed (gRFC A6: before response headers, so only an
// attempt that failed Trailers-Only is retried; see [retryStream]), the
// messages sent so far replayed to the new attempt, and only while the
// count allows. The replay buffer is
// bounded by the retry's body limit (policy.Retry.BodyLimit, 64 KiB by
// default), each message counted at the size the call's codec encodes it
// (unknown: past the limit): once the messages sent pass it, the buffer
// is dropped and the stream is no longer retried.
func (m *mesh) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	authority, inmesh := targetAuthority(cc.Target())
	st, ps, waits := m.lookup(authority, inmesh)
	if waits {
		if err := m.await(ctx, cc, authority); err != nil {
			return nil, err
		}
		st, ps, _ = m.lookup(authority, inmesh)
	}
	if ps.applies() {
		// A profile with routes or dst overrides wins over the outbound
		// policy, for a stream as for every HTTP/2 request of Linkerd's
		// proxy.
		return m.streamProfile(ctx, ps, authority, desc, cc, method, streamer, opts...)
	}
	rt, err := m.route(ctx, st, authority, method)
	if err != nil || rt == nil {
		if err != nil {
			return nil, err
		}
		return streamer(withoutMeshMetadata(ctx), desc, cc, method, opts...)
	}
	c := &call{m: m, rt: rt, method: method, target: authority, start: time.Now()}
	ctx, cancel := c.deadline(ctx, false)
	var timers *streamTimers
	if to := rt.route.Timeouts; to.Response > 0 || to.Idle > 0 {
		var fire context.CancelCauseFunc
		ctx, fire = context.WithCancelCause(ctx)
		end := cancel
		cancel = func() { fire(nil); end() }
		timers = newStreamTimers(to.Response, to.Idle, fire)
	}
	if rt.hedge != nil {
		streamer = rt.hedge.streamer(streamer)
	}
	// The caller's header, trailer, peer and OnFinish are those of the
	// attempt the stream ends on, handed over once as it ends (see
	// [callHooks]); its attempts get none.
	opts, hooks := takeHooks(opts)
	s := &retryStream{c: c, ctx: ctx, cancel: cancel, desc: desc, cc: cc, streamer: streamer, opts: opts, hooks: hooks, timers: timers}
	if rt.route.Retry != nil {
		s.sizer = codecOf(opts)
	}
	if err := s.attempt(); err != nil {
		for s.retryOnErr(err, nil) {
			if err = s.attempt(); err == nil {
				break
			}
		}
		if err != nil {
			s.finish(err)
			return nil, err
		}
	}
	// A caller may end a stream by cancelling its context alone, never
	// reading again (as may the route's timeout): the call is counted
	// then, unless a RecvMsg under way counts it as it returns.
	stop := context.AfterFunc(s.ctx, func() {
		if s.recv.TryLock() {
			s.finish(status.FromContextError(s.ctx.Err()).Err())
			s.recv.Unlock()
		}
	})
	s.stopEnd.Store(&stop)
	return s, nil
}

// retryStream is a client stream that may start again on another attempt
// until it is committed: as gRFC A6 commits a call (and grpc-go's own
// retry), once it has response headers, that is once Header gives them to
// the caller, or the attempt that failed had them (only a Trailers-Only
// answer is retried), or a response message came. grpc-go lets one
// goroutine send while another receives. SendMsg, CloseSend and the
// switch to a new attempt hold mu throughout, so a message goes either
// into the replay or to the new attempt, never to an attempt already
// replaced. The receiving path reads the attempt and marks the commit
// without mu: a SendMsg blocked by flow control must not keep RecvMsg
// from reading.
type retryStream struct {
	c        *call
	ctx      context.Context
	cancel   context.CancelFunc
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	streamer grpc.Streamer
	opts     []grpc.CallOption
	// hooks are the caller's (nil: none), taken out of opts.
	hooks *callHooks
	// timers are the route's response and idle timeouts (nil: none).
	timers *streamTimers

	cur atomic.Pointer[grpc.ClientStream]
	// committed: no retry from now on (response headers or a message).
	committed atomic.Bool

	mu    sync.Mutex
	sent  []any
	sizer sizer
	// sentBytes is the encoded size of the messages sent so far, up to
	// one past the body limit.
	sentBytes int64
	// noReplay: the messages sent passed the body limit; no retry.
	noReplay  bool
	closeSent bool

	// recv is held by RecvMsg throughout, and by the end of a stream its
	// caller stopped reading (its context ended): the fields below are
	// the receiving path's.
	recv sync.Mutex
	// stopEnd takes off the watch of the stream's context.
	stopEnd atomic.Pointer[func() bool]

	bt      *metrics.BackendTarget
	btStart time.Time
	retries int
	ended   bool
	// attemptCancel ends the current attempt's context.
	attemptCancel context.CancelFunc
	// unopened: the last attempt opened no stream (cur is the one before).
	unopened bool
}

func (s *retryStream) attempt() error {
	actx, bt, err := s.c.prepare(s.ctx)
	s.bt, s.btStart = bt, time.Now()
	if bt != nil {
		bt.Request(s.ctx)
	}
	s.unopened = true
	if err != nil {
		return s.attemptDone(err)
	}
	actx, acancel := context.WithCancel(withoutMeshMetadata(actx))
	cs, err := s.streamer(actx, s.desc, s.cc, s.c.method, s.opts...)
	if err != nil {
		acancel()
		return s.attemptDone(err)
	}
	s.unopened = false
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.noReplay {
		// A send passed the body limit while this attempt started:
		// the messages to replay are gone.
		acancel()
		s.attemptDone(status.Error(codes.Canceled, "retry abandoned: request messages past the body limit"))
		return errNoReplay
	}
	if s.attemptCancel != nil {
		s.attemptCancel() // the replaced attempt has ended
	}
	s.attemptCancel = acancel
	for _, msg := range s.sent {
		if err := cs.SendMsg(msg); err != nil {
			break // the error comes with RecvMsg
		}
	}
	if s.closeSent {
		cs.CloseSend()
	}
	s.cur.Store(&cs)
	return nil
}

func (s *retryStream) attemptDone(err error) error {
	err = s.c.timeoutErr(s.ctx, err)
	if s.bt != nil {
		if !abandoned(s.ctx, err) || s.headed() {
			s.bt.Done(s.ctx, s.c.status(s.ctx, err), s.btStart)
		}
		s.bt = nil
	}
	return err
}

// headed reports whether the current attempt, which ended, had response
// headers.
func (s *retryStream) headed() bool {
	if s.committed.Load() {
		return true
	}
	p := s.cur.Load()
	return p != nil && !s.unopened && hadHeaders(*p)
}

// retryOnErr reports whether the stream starts again after err, the end
// of the attempt failed (nil: it opened no stream). A stream is committed
// once it has response headers: failed's too, which the caller may not
// have read.
func (s *retryStream) retryOnErr(err error, failed grpc.ClientStream) bool {
	s.mu.Lock()
	replayable := !s.noReplay
	s.mu.Unlock()
	if !replayable || s.committed.Load() || !s.c.retryable(err) || s.ctx.Err() != nil {
		return false
	}
	if failed != nil && hadHeaders(failed) {
		s.committed.Store(true)
		return false
	}
	if !s.c.allow(s.ctx, s.retries) {
		return false
	}
	s.retries++
	return true
}

// hadHeaders reports whether the attempt cs, which ended, had response
// headers. grpc-go's Header of a stream that ended returns the headers it
// received (a copy, never nil) or, when it ended Trailers-Only (the
// transport stream's TrailersOnly, which grpc-go's own retry reads), no
// headers and no error.
func hadHeaders(cs grpc.ClientStream) bool {
	md, err := cs.Header()
	return err == nil && md != nil
}

func (s *retryStream) finish(err error) {
	if s.ended {
		return
	}
	s.ended = true
	s.timers.stop()
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if s.bt != nil {
		s.attemptDone(err)
	}
	err = s.c.timeoutErr(s.ctx, err)
	s.c.done(s.ctx, err, s.retries, abandoned(s.ctx, err) && s.headed())
	if s.attemptCancel != nil {
		s.attemptCancel()
	}
	if stop := s.stopEnd.Load(); stop != nil {
		(*stop)()
	}
	s.cancel()
	if s.hooks != nil {
		// Once the attempt's context ended: a stream whose caller
		// cancelled it may still be ending, and its header is read.
		var cs grpc.ClientStream
		if p := s.cur.Load(); p != nil && !s.unopened {
			cs = *p
		}
		s.hooks.endStream(cs, err)
	}
}

func (s *retryStream) current() grpc.ClientStream {
	return *s.cur.Load()
}

// Header returns the current attempt's response headers; once it has
// given them, the stream is committed to that attempt. An attempt that
// ended Trailers-Only has none, and may still be retried.
func (s *retryStream) Header() (metadata.MD, error) {
	md, err := s.current().Header()
	if md != nil {
		s.committed.Store(true)
		s.timers.responseStarts()
	}
	return md, err
}

func (s *retryStream) Trailer() metadata.MD     { return s.current().Trailer() }
func (s *retryStream) Context() context.Context { return s.current().Context() }

func (s *retryStream) CloseSend() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeSent = true
	s.timers.responseStarts()
	return s.current().CloseSend()
}

func (s *retryStream) SendMsg(msg any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := false
	if s.committed.Load() {
		s.sent = nil
	} else if r := s.c.rt.route.Retry; r != nil && !s.noReplay {
		if n := s.sizer.size(msg); n > r.BodyLimit()-s.sentBytes {
			s.sentBytes = r.BodyLimit() + 1
		} else {
			s.sentBytes += n
		}
		if s.sentBytes > r.BodyLimit() {
			s.sent, s.noReplay = nil, true
		} else {
			s.sent, kept = append(s.sent, msg), true
		}
	}
	err := s.current().SendMsg(msg)
	if err == nil {
		s.timers.moved()
	}
	if err != nil && kept {
		// The attempt failed; the message is kept for the next one,
		// and the attempt's status comes with RecvMsg.
		return nil
	}
	if err != nil && !errors.Is(err, io.EOF) && s.recv.TryLock() {
		// grpc-go ended the stream, and its caller need not read again:
		// it is counted now, unless a RecvMsg under way counts it.
		s.finish(err)
		s.recv.Unlock()
	}
	return err
}

// sizer measures a message as the call's codec puts it on the wire.
type sizer struct {
	// codec is the call's codec: an encoding.CodecV2, or a codec whose
	// Marshal returns bytes (encoding.Codec, grpc.Codec); nil when no
	// codec is registered for the call's content-subtype.
	codec any
	// proto: the codec is the one named "proto", which encodes a
	// protobuf message as protobuf: its size is proto.Size, without
	// encoding it.
	proto bool
}

// sizeUnknown is the size of a message the call's codec cannot measure:
// past any body limit.
const sizeUnknown = math.MaxInt64

// codecOf finds the codec a call with opts is encoded with, as grpc-go
// chooses it (the last codec forced by an option; else the codec
// registered for the content-subtype, "proto" by default).
func codecOf(opts []grpc.CallOption) sizer {
	var codec any
	subtype := ""
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.ForceCodecV2CallOption:
			codec = o.CodecV2
		case grpc.ForceCodecCallOption:
			codec = o.Codec
		case grpc.CustomCodecCallOption:
			codec = o.Codec
		case grpc.ContentSubtypeCallOption:
			subtype = strings.ToLower(o.ContentSubtype)
		}
	}
	if codec == nil {
		if subtype == "" {
			subtype = protoCodecName
		}
		if c := encoding.GetCodec(subtype); c != nil {
			codec = c
		} else if c := encoding.GetCodecV2(subtype); c != nil {
			codec = c
		}
	}
	var name string
	switch c := codec.(type) {
	case encoding.CodecV2:
		name = c.Name()
	case encoding.Codec:
		name = c.Name()
	}
	return sizer{codec: codec, proto: name == protoCodecName}
}

// protoCodecName is the name of grpc-go's default codec.
const protoCodecName = "proto"

// size is the encoded size of msg: proto.Size for a protobuf message
// under the proto codec, else the length of what the codec encodes,
// sizeUnknown when it cannot encode it (or the call has no codec), so
// that a message of unknown size never fits a body limit.
func (z sizer) size(msg any) int64 {
	if z.proto {
		switch m := msg.(type) {
		case proto.Message:
			return int64(proto.Size(m))
		case protoadapt.MessageV1:
			return int64(proto.Size(protoadapt.MessageV2Of(m)))
		}
	}
	switch c := z.codec.(type) {
	case encoding.CodecV2:
		b, err := c.Marshal(msg)
		if err != nil {
			return sizeUnknown
		}
		n := b.Len()
		b.Free()
		return int64(n)
	case interface{ Marshal(any) ([]byte, error) }:
		b, err := c.Marshal(msg)
		if err != nil {
			return sizeUnknown
		}
		return int64(len(b))
	}
	return sizeUnknown
}

func (s *retryStream) RecvMsg(msg any) error {
	s.recv.Lock()
	defer func() {
		// The stream's context ended while this read was returning a
		// message, and its watch found the read under way: the caller
		// may never read again, so the call is counted now.
		if !s.ended && s.ctx.Err() != nil {
			s.finish(status.FromContextError(s.ctx.Err()).Err())
		}
		s.recv.Unlock()
	}()
	for {
		err := s.current().RecvMsg(msg)
		if err == nil {
			s.timers.moved()
			s.timers.responseStarts()
			s.committed.Store(true) // SendMsg drops the replay
			if !s.desc.ServerStreams {
				s.finish(nil)
			}
			return nil
		}
		if !errors.Is(err, io.EOF) {
			err = s.c.timeoutErr(s.ctx, err)
			if s.retryOnErr(err, s.current()) {
				s.attemptDone(err)
				if aerr := s.attempt(); aerr == nil {
					continue
				} else if aerr != errNoReplay {
					err = aerr
				}
			}
		}
		s.finish(err)
		return err
	}
}

// grpcContentType is the content-type header of every call, as the
// policy reads it; shared, never changed.
var grpcContentType = []string{"application/grpc"}

// errNoReplay: a stream retry found its replay dropped by the body limit.
var errNoReplay = errors.New("meshgrpc: replay past the body limit")
