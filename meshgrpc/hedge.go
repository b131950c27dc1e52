package meshgrpc

import (
	"context"
	"errors"
	"io"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/policy"
)

// hedger hedges the calls of one GRPCRoute rule, as the router hedges
// HTTP requests, with gRFC A6's hedging rules for what a gRPC attempt
// answers: after the route's delay, a second attempt of a call that has
// not been answered goes to an endpoint the first did not go to (the
// picker excludes the endpoints the call tried); the first attempt that
// answers with response headers, or ends with a fatal status, is the
// call's, and the other is cancelled. A non-fatal status (UNAVAILABLE, or
// one of the route's retry codes) leaves the other attempt running, and a
// first attempt that ends with one before the delay sends the hedge at
// once. gRPC has no idempotent methods: only a rule marked idempotent
// (hedge.inmesh.io/idempotent) is hedged, and only a call whose request
// messages fit the retry's body limit.
type hedger struct {
	state   *hedge.State
	metrics *metrics.HedgeTarget
	retry   *policy.Retry // the route's retry codes are non-fatal too
	limit   int64         // the largest request sent twice
}

// newHedger returns the hedging of route, nil when it hedges nothing.
func (m *mesh) newHedger(route *policy.Route, rt *metrics.RouteTarget) *hedger {
	p := route.Hedge
	if !p.Enabled() || !p.Idempotent || p.Validate() != nil {
		return nil
	}
	limit := int64(policy.DefaultMaxRequestBytes)
	if route.Retry != nil {
		limit = route.Retry.BodyLimit()
	}
	return &hedger{state: hedge.NewState(*p), metrics: m.hedges.Target(rt), retry: route.Retry, limit: limit}
}

// nonFatal reports whether an attempt that ended with err leaves the
// call's other attempt running (gRFC A6's nonFatalStatusCodes):
// UNAVAILABLE, what an endpoint that cannot take the call answers (a
// refused connection, a GOAWAY, no other endpoint), and the route's retry
// codes. Any other status, and OK, ends the call.
func (h *hedger) nonFatal(err error) bool {
	if err == nil {
		return false
	}
	c := status.Code(err)
	return c == codes.Unavailable || h.retry != nil && h.retry.RetryableCode(c)
}

// mayHedge reports whether a hedge may go now: the call is still wanted,
// its first attempt picked an endpoint (that the hedge avoids), and the
// route's share of extra load allows it.
func (h *hedger) mayHedge(ctx context.Context, tried *balancer.Tried) bool {
	if ctx.Err() != nil || tried.Len() == 0 {
		return false
	}
	if !h.state.Spend() {
		h.metrics.Overflow(ctx)
		return false
	}
	return true
}

func (h *hedger) sent(ctx context.Context) {
	h.state.Sent()
	h.metrics.Sent(ctx)
}

func (h *hedger) won(ctx context.Context) {
	h.state.Won()
	h.metrics.Won(ctx)
}

// errNoOtherEndpoint is the picker's answer to a hedge when no endpoint
// other than those the call tried is in rotation: the hedge is not sent.
var errNoOtherEndpoint = status.Error(codes.Unavailable, noOtherMsg)

var noOtherMsg = "meshgrpc: " + balancer.ErrNoOtherEndpoint.Error()

// notSent reports whether err is the picker's errNoOtherEndpoint.
func notSent(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable && s.Message() == noOtherMsg
}

// hedgeContext is the context of a hedge: it avoids the tried endpoints
// and its attempt span says it is a hedge.
func hedgeContext(ctx context.Context, tried *balancer.Tried) (context.Context, context.CancelFunc) {
	return context.WithCancel(meshtrace.WithAttemptKind(balancer.WithTried(ctx, tried, true), meshtrace.AttemptHedge))
}

// unaryResult is the end of one attempt of a hedged unary call.
type unaryResult struct {
	err     error
	hedge   bool
	elapsed time.Duration
	// own is the attempt's header, trailer and peer; nil when the caller
	// asked for none.
	own *attemptHooks
}

// invoker returns the invoker of a unary call on the route: hedged when
// the call may be.
func (h *hedger) invoker(invoker grpc.UnaryInvoker) grpc.UnaryInvoker {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		return h.invoke(ctx, method, req, reply, cc, invoker, opts)
	}
}

// invoke runs one attempt of a unary call, hedged when the request fits
// the limit and a second reply can be made for the hedge (the first
// attempt fills reply; the hedge a reply of its own, copied into reply
// when it wins, once the first attempt has returned). Each attempt has
// its own header, trailer and peer too (see [callHooks]): the caller gets
// those of the attempt whose answer it gets, and a loser, which may end
// after the call returned, never writes the caller's.
func (h *hedger) invoke(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	rv := reflect.ValueOf(reply)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || codecOf(opts).size(req) > h.limit {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	delay, ok := h.state.Request()
	start := time.Now()
	if !ok {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil {
			h.state.Observe(time.Since(start))
		}
		return err
	}
	opts, hooks := takeHooks(opts)
	var own [2]*attemptHooks // the first attempt's, the hedge's
	firstOpts, hedgeOpts := opts, opts
	if hooks.meta() {
		own[0], own[1] = new(attemptHooks), new(attemptHooks)
		firstOpts, hedgeOpts = hooks.attempt(opts, own[0]), hooks.attempt(opts, own[1])
	}
	tried := new(balancer.Tried)
	results := make(chan unaryResult, 2)
	send := func(ctx context.Context, reply any, isHedge bool) {
		aopts, a := firstOpts, own[0]
		if isHedge {
			aopts, a = hedgeOpts, own[1]
		}
		err := invoker(ctx, method, req, reply, cc, aopts...)
		results <- unaryResult{err: err, hedge: isHedge, elapsed: time.Since(start), own: a}
	}
	// end is the call's end with the answer of r: the caller's hooks get
	// r's attempt (received from results: its hooks have run).
	end := func(r *unaryResult, err error) error {
		hooks.end(r.own, err)
		return err
	}
	pctx, pcancel := context.WithCancel(balancer.WithTried(ctx, tried, false))
	defer pcancel()
	go send(pctx, reply, false)

	// Before the delay, the first attempt's answer is the call's, unless
	// it is a non-fatal failure: then the hedge goes at once (gRFC A6).
	var first *unaryResult
	timer := time.NewTimer(delay)
	select {
	case r := <-results:
		timer.Stop()
		if r.err == nil {
			h.state.Observe(r.elapsed)
		}
		if !h.nonFatal(r.err) || !h.mayHedge(ctx, tried) {
			return end(&r, r.err)
		}
		first = &r
	case <-timer.C:
		if !h.mayHedge(ctx, tried) {
			r := <-results
			if r.err == nil {
				h.state.Observe(r.elapsed)
			}
			return end(&r, r.err)
		}
	}
	hreply := reflect.New(rv.Type().Elem()).Interface()
	hctx, hcancel := hedgeContext(ctx, tried)
	defer hcancel()
	go send(hctx, hreply, true)

	pending := 2
	if first != nil {
		pending = 1
	}
	for ; pending > 0; pending-- {
		r := <-results
		if r.hedge {
			if notSent(r.err) {
				h.state.Refund()
			} else {
				h.sent(ctx)
			}
		}
		if r.err != nil && (h.nonFatal(r.err) || notSent(r.err)) {
			if first == nil && !r.hedge {
				first = &r
			}
			if pending > 1 {
				continue // the other attempt may still answer
			}
			if first != nil {
				return end(first, first.err)
			}
			return end(&r, r.err)
		}
		if r.err == nil {
			h.state.Observe(r.elapsed)
		}
		if !r.hedge {
			if pending > 1 {
				hcancel()
				go h.drain(ctx, results)
			}
			return end(&r, r.err)
		}
		// The hedge answered: the first attempt is cancelled, and its
		// reply is the caller's once it has returned.
		if pending > 1 {
			pcancel()
			<-results
		}
		if r.err == nil {
			h.won(ctx)
			if err := copyReply(reply, hreply); err != nil {
				return end(&r, err)
			}
		}
		return end(&r, r.err)
	}
	panic("unreachable")
}

// drain waits for a cancelled hedge and counts it.
func (h *hedger) drain(ctx context.Context, results <-chan unaryResult) {
	if r := <-results; !notSent(r.err) {
		h.sent(ctx)
	} else {
		h.state.Refund()
	}
}

// copyReply makes reply the hedge's reply from.
func copyReply(reply, from any) error {
	if m, ok := reply.(proto.Message); ok {
		if f, ok := from.(proto.Message); ok {
			proto.Reset(m)
			proto.Merge(m, f)
			return nil
		}
	}
	dst, src := reflect.ValueOf(reply).Elem(), reflect.ValueOf(from).Elem()
	if !dst.CanSet() {
		return status.Error(codes.Internal, "meshgrpc: cannot copy the hedge's reply")
	}
	dst.Set(src)
	return nil
}

// streamer returns the streamer of a call on the route: server-streaming
// and bidi calls are hedged before their response headers. Its caller
// (the route's stream) keeps the caller's hooks ([callHooks]) to itself:
// none reach the attempts.
func (h *hedger) streamer(streamer grpc.Streamer) grpc.Streamer {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if !desc.ServerStreams {
			return streamer(ctx, desc, cc, method, opts...)
		}
		return h.newStream(ctx, desc, cc, method, streamer, opts)
	}
}

// hedgedStream is a stream with up to two attempts until it is committed
// (gRFC A6): to the first attempt that gets response headers or ends with
// a fatal status (a Trailers-Only answer is a status, not headers), or,
// when both fail with non-fatal ones, to the first.
// Until then each message goes to every attempt, and the messages of the
// first are kept (within the body limit) to be replayed to the hedge; a
// message past the limit means no hedge. The receiving side waits for the
// commit and then reads the attempt committed to.
type hedgedStream struct {
	h        *hedger
	ctx      context.Context
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	method   string
	streamer grpc.Streamer
	opts     []grpc.CallOption
	tried    *balancer.Tried
	start    time.Time
	sizer    sizer
	first    *streamAttempt

	// events has room for every attempt's end of waiting for headers,
	// opened for the hedge's opening (never read once committed).
	events chan streamEvent
	opened chan hedgeOpened
	// opening cancels the hedge while it opens; run goroutine only.
	opening context.CancelFunc
	won     atomic.Pointer[streamAttempt]
	done    chan struct{} // closed once won is set

	mu sync.Mutex
	// attempts are the attempts messages go to: appended by the run
	// goroutine only (under mu), so it reads them without mu.
	attempts  []*streamAttempt
	sent      []any
	sentBytes int64
	// buffering: the messages are kept for a hedge (no hedge sent yet,
	// none past the limit).
	buffering bool
	closeSent bool
}

type streamAttempt struct {
	cs     grpc.ClientStream
	ctx    context.Context
	cancel context.CancelFunc
	hedge  bool
	end    *attemptEnd
}

// attemptEnd is the status an attempt ended with, as grpc-go hands it to
// the OnFinish callback the attempt is opened with ([attemptEnd.option]).
type attemptEnd struct {
	once sync.Once
	err  error
	done chan struct{} // closed once err is set
}

func newAttemptEnd() *attemptEnd { return &attemptEnd{done: make(chan struct{})} }

// option is opts with the OnFinish callback that sets e.
func (e *attemptEnd) option(opts []grpc.CallOption) []grpc.CallOption {
	return append(opts[:len(opts):len(opts)], grpc.OnFinish(e.set))
}

func (e *attemptEnd) set(err error) {
	e.once.Do(func() {
		e.err = err
		close(e.done)
	})
}

// streamEvent is an attempt's response headers (err nil) or its end
// without them.
type streamEvent struct {
	a       *streamAttempt
	err     error
	elapsed time.Duration
}

func (h *hedger) newStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts []grpc.CallOption) (grpc.ClientStream, error) {
	delay, canHedge := h.state.Request()
	s := &hedgedStream{h: h, ctx: ctx, desc: desc, cc: cc, method: method, streamer: streamer, opts: opts,
		tried: new(balancer.Tried), start: time.Now(), sizer: codecOf(opts),
		events: make(chan streamEvent, 2), opened: make(chan hedgeOpened, 1), done: make(chan struct{}), buffering: canHedge}
	actx, cancel := context.WithCancel(balancer.WithTried(ctx, s.tried, false))
	end := newAttemptEnd()
	cs, err := streamer(actx, desc, cc, method, end.option(opts)...)
	if err != nil {
		cancel()
		return nil, err
	}
	s.first = &streamAttempt{cs: cs, ctx: actx, cancel: cancel, end: end}
	s.attempts = []*streamAttempt{s.first}
	go s.watch(s.first)
	go s.run(delay-time.Since(s.start), canHedge)
	return s, nil
}

// watch waits for the response headers of a, or its end without them:
// then grpc-go's Header returns neither headers nor an error (as for a
// Trailers-Only answer, which is no answer in gRFC A6), and the status
// comes to the attempt's OnFinish, which the end calls. An attempt
// cancelled meanwhile ends with its context's error.
func (s *hedgedStream) watch(a *streamAttempt) {
	md, err := a.cs.Header()
	if err == nil && md == nil {
		select {
		case <-a.end.done:
			err = a.end.err
		case <-a.ctx.Done():
			err = status.FromContextError(a.ctx.Err()).Err()
		}
	}
	s.events <- streamEvent{a: a, err: err, elapsed: time.Since(s.start)}
}

// run decides the attempt the stream commits to, sending the hedge after
// the delay (or at once when the first attempt fails non-fatally). The
// hedge opens on a goroutine of its own (its pick may wait for an
// endpoint still connecting), so that the first attempt's headers commit
// the stream meanwhile.
func (s *hedgedStream) run(delay time.Duration, canHedge bool) {
	var fire <-chan time.Time
	if canHedge {
		t := time.NewTimer(max(delay, 0))
		defer t.Stop()
		fire = t.C
	}
	pending := 1 // attempts that may still answer, the hedge opening included
	var failed *streamEvent
	for {
		select {
		case ev := <-s.events:
			pending--
			if !s.h.nonFatal(ev.err) {
				s.commit(ev)
				return
			}
			if failed == nil || !ev.a.hedge {
				failed = &ev
			}
			if fire != nil {
				fire = nil
				if s.hedge() {
					pending++
				}
			}
			if pending == 0 {
				s.commit(*failed)
				return
			}
		case <-fire:
			fire = nil
			if s.hedge() {
				pending++
			}
		case o := <-s.opened:
			s.opening = nil
			if !s.join(o) {
				if pending--; pending == 0 {
					s.commit(*failed)
					return
				}
			}
		}
	}
}

// hedgeOpened is the end of a hedge's NewStream.
type hedgeOpened struct {
	cs     grpc.ClientStream
	ctx    context.Context
	cancel context.CancelFunc
	end    *attemptEnd
	err    error
}

// hedge starts opening the hedge; false when none may go.
func (s *hedgedStream) hedge() bool {
	s.mu.Lock()
	buffering := s.buffering
	s.mu.Unlock()
	if !buffering || !s.h.mayHedge(s.ctx, s.tried) {
		s.stopBuffering()
		return false
	}
	hctx, cancel := hedgeContext(s.ctx, s.tried)
	s.opening = cancel
	go s.open(hctx, cancel)
	return true
}

// open opens the hedge's stream.
func (s *hedgedStream) open(ctx context.Context, cancel context.CancelFunc) {
	end := newAttemptEnd()
	cs, err := s.streamer(ctx, s.desc, s.cc, s.method, end.option(s.opts)...)
	s.opened <- hedgeOpened{cs: cs, ctx: ctx, cancel: cancel, end: end, err: err}
}

// join makes the opened hedge an attempt, replaying the messages sent so
// far (those sent while it opened included); false when it did not open,
// or a message passed the limit meanwhile (nothing left to replay).
func (s *hedgedStream) join(o hedgeOpened) bool {
	if o.err != nil {
		o.cancel()
		if notSent(o.err) {
			s.h.state.Refund()
		} else {
			s.h.sent(s.ctx)
		}
		s.stopBuffering()
		return false
	}
	s.h.sent(s.ctx)
	a := &streamAttempt{cs: o.cs, ctx: o.ctx, cancel: o.cancel, hedge: true, end: o.end}
	s.mu.Lock()
	if !s.buffering {
		s.mu.Unlock()
		o.cancel()
		return false
	}
	for _, m := range s.sent {
		if o.cs.SendMsg(m) != nil {
			break // its status comes with its headers' wait
		}
	}
	if s.closeSent {
		_ = o.cs.CloseSend()
	}
	s.sent, s.buffering = nil, false
	s.attempts = append(s.attempts, a)
	s.mu.Unlock()
	go s.watch(a)
	return true
}

// stopBuffering drops the kept messages: no hedge will need them.
func (s *hedgedStream) stopBuffering() {
	s.mu.Lock()
	s.sent, s.buffering = nil, false
	s.mu.Unlock()
}

// commit makes ev's attempt the stream's and cancels the others, and the
// hedge still opening.
func (s *hedgedStream) commit(ev streamEvent) {
	s.won.Store(ev.a)
	close(s.done)
	for _, a := range s.attempts {
		if a != ev.a {
			a.cancel()
		}
	}
	if s.opening != nil {
		s.opening()
	}
	if ev.err == nil {
		s.h.state.Observe(ev.elapsed)
		if ev.a.hedge {
			s.h.won(s.ctx)
		}
	}
	s.mu.Lock()
	s.attempts = []*streamAttempt{ev.a}
	s.sent, s.buffering = nil, false
	s.mu.Unlock()
}

func (s *hedgedStream) SendMsg(m any) error {
	if w := s.won.Load(); w != nil {
		return w.cs.SendMsg(m)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.won.Load(); w != nil {
		return w.cs.SendMsg(m)
	}
	if s.buffering {
		if n := s.sizer.size(m); n > s.h.limit-s.sentBytes {
			// Past the limit: no replay, so no hedge (gRFC A6 commits).
			s.sent, s.buffering = nil, false
		} else {
			s.sentBytes += n
			s.sent = append(s.sent, m)
		}
	}
	for _, a := range s.attempts {
		if err := a.cs.SendMsg(m); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}
	return nil
}

func (s *hedgedStream) CloseSend() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.won.Load(); w != nil {
		return w.cs.CloseSend()
	}
	s.closeSent = true
	for _, a := range s.attempts {
		_ = a.cs.CloseSend()
	}
	return nil
}

func (s *hedgedStream) RecvMsg(m any) error {
	<-s.done
	return s.won.Load().cs.RecvMsg(m)
}

func (s *hedgedStream) Header() (metadata.MD, error) {
	<-s.done
	return s.won.Load().cs.Header()
}

func (s *hedgedStream) Trailer() metadata.MD {
	if w := s.won.Load(); w != nil {
		return w.cs.Trailer()
	}
	return nil
}

func (s *hedgedStream) Context() context.Context {
	if w := s.won.Load(); w != nil {
		return w.cs.Context()
	}
	return s.first.cs.Context()
}
