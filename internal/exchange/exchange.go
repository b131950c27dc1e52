// Package exchange runs one logical request through a round tripper: the
// attempts, the timeouts and the retries, with the streaming-safe body
// replay. The router of each routing model describes a request with a
// [Plan] (its classifier, timeouts, a retry strategy and a recorder of its
// metrics); the loop is the same for every model.
package exchange

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/tap"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/proxyerr"
)

// MaxRetryBodyBytes is the default largest request body kept for retries
// (64 KiB, as in Linkerd).
const MaxRetryBodyBytes = 64 << 10

// The causes of the timeouts a plan sets for a policy route. Each is a
// classify.ErrTimeout, so that the route_* classification calls them all
// "timeout", and a classify.ErrEndpointTimeout: Linkerd's proxy enforces
// a policy route's timeouts under the endpoint's breaker, so that a
// balancer counts a request they end as a failure of its endpoint.
var (
	// ErrRequestTimeout: the route's request timeout (the head, or with
	// [Timeout.Stream] the whole exchange) ran out.
	ErrRequestTimeout = &timeoutError{"request timeout"}
	// ErrResponseTimeout: the response timeout ran out.
	ErrResponseTimeout = &timeoutError{"response timeout"}
	// ErrIdleTimeout: neither stream moved for the idle timeout.
	ErrIdleTimeout = &timeoutError{"idle timeout"}
	// ErrTryTimeout: one attempt's response headers did not arrive within
	// the per-attempt timeout. It fails the attempt, not the request.
	ErrTryTimeout = &timeoutError{"response headers timeout"}
)

type timeoutError struct{ what string }

func (e *timeoutError) Error() string { return e.what }
func (e *timeoutError) Is(target error) bool {
	return target == classify.ErrTimeout || target == classify.ErrEndpointTimeout
}

// Timeout is one timer of a plan.
type Timeout struct {
	// After is the duration; zero means no timer.
	After time.Duration
	// Cause is what the exchange's context is cancelled with when it fires.
	Cause error
	// Stream keeps the timer running until the response stream ends;
	// otherwise it stops when a response goes to the caller.
	Stream bool
	// FromRequestEnd starts the timer when the request body ends (read to
	// its end, or closed), at once for a request without a body: Linkerd's
	// response timeout, which does not count a slow upload.
	FromRequestEnd bool
	// Message is the l5d-proxy-error of the 504 answered when it fires
	// before a response went to the caller.
	Message string
}

// Outcome is how an attempt or a logical request ended.
type Outcome struct {
	// Status is the response status, 0 when no response head arrived.
	Status int
	// Class is the classification.
	Class classify.Class
	// Err is the error that ended it: that of the round trip or the
	// response stream, or the cause of the timeout that fired; nil when it
	// ended well.
	Err error
	// Retries is the number of retries made (logical requests only).
	Retries int
}

// Unanswered reports whether o is a request, or an attempt, that the
// caller, whose context is ctx, gave up before any response head arrived.
// Linkerd's proxy records no response for it in any family: its metric
// layers record a response when its future resolves, and one dropped with
// its client records nothing (linkerd/http/metrics
// src/requests/service.rs; linkerd/http/prom src/record_response.rs and
// src/status.rs).
func (o Outcome) Unanswered(ctx context.Context) bool {
	return o.Status == 0 && o.Err != nil && classify.Abandoned(ctx)
}

// GaveUp reports whether o is a response whose stream the caller, whose
// context is ctx, gave up after its head: Linkerd's proxy drops the
// response body, which its outbound route families record as the error
// UNKNOWN (the drop's RequestCancelled is none of the errors they name),
// beside the status of the head.
func (o Outcome) GaveUp(ctx context.Context) bool {
	return o.Status != 0 && o.Err != nil && classify.Abandoned(ctx)
}

// Recorder records the metrics of an exchange.
type Recorder interface {
	// Attempt is called as each attempt is sent.
	Attempt(ctx context.Context)
	// AttemptDone records the end of one attempt.
	AttemptDone(ctx context.Context, o Outcome, start time.Time)
	// Done records the end of the logical request.
	Done(ctx context.Context, o Outcome, start time.Time)
}

// Retry decides whether a failed attempt is retried.
type Retry interface {
	// Retryable reports whether an attempt's outcome is one this policy
	// retries: a response with its final class (resp set), or a round-trip
	// error (err set, resp nil).
	Retryable(resp *http.Response, class classify.Class, err error) bool
	// Allow is called for a retryable failure after retries retries; it
	// reports whether another attempt follows (the limit, the budget),
	// after waiting any backoff under ctx.
	Allow(ctx context.Context, retries int) bool
}

// Budget is a retry budget, as [Plan.Budget] deposits into it. Linkerd's
// proxy asks its budget as each answer comes
// (linkerd/app/outbound/src/http/retry.rs, RetryPolicy::retry, which
// tower's Retry calls with each attempt's result,
// linkerd/retry/src/lib.rs): an answer it does not retry deposits, so
// that a request's own answer does not pay for its own retry.
type Budget interface {
	Deposit()
}

// Plan is how one logical request is run.
type Plan struct {
	// Provider goes into the request context (classify finds the response
	// classes there); Classifier classifies responses.
	Provider   classify.Provider
	Classifier *classify.Classifier
	// Timeouts of the whole exchange.
	Timeouts []Timeout
	// TryTimeout bounds each attempt but the last from the end of its
	// request body (at once without a body) until its response headers,
	// as the response timeout does not count a slow upload; it fails the
	// attempt with [ErrTryTimeout].
	TryTimeout time.Duration
	// Retry is the retry policy; nil means no retries.
	Retry Retry
	// Budget is the retry budget the request's answers deposit into; nil
	// means none. Each attempt whose answer is not retried deposits: a
	// response that goes to the caller (an HTTP/2 one once its first body
	// frame or its end comes, unless its caller gives it up first), an
	// error that ends the request. A
	// retry withdraws in Retry.Allow, and a failure it refuses deposits
	// nothing; an attempt its caller gave up, or a timeout of the plan
	// ended, is no answer and deposits nothing; nor does a request whose
	// body is known to pass BodyLimit, which is never retried.
	Budget Budget
	// MaxRetries bounds the retries, to say which attempt is the last; <= 0
	// means unknown (a budget decides).
	MaxRetries int
	// BodyLimit is the largest request body kept for retries; zero means
	// [MaxRetryBodyBytes].
	BodyLimit int64
	// Recorder records the metrics.
	Recorder Recorder
}

// RoundTrip runs req through base by plan p.
//
// Each timer of p bounds the exchange; one that fires before a response
// went to the caller answers a 504 with an l5d-proxy-error header. A
// caller that cancels its request gets its context's error.
//
// A retryable failure is retried while the plan's Retry allows. The
// request body is forwarded as it arrives, never waited for, while a copy
// of up to BodyLimit bytes is kept: a retry happens only when the earlier
// attempt read the whole body within that cap (or the caller can give it
// again with GetBody), and sends the copy. An HTTP/2 response whose class
// waits on its trailers is held until its first body chunk, and retried
// only when its stream ends before any data; an HTTP/1 response is never
// held, and its head decides.
func RoundTrip(base http.RoundTripper, req *http.Request, p *Plan) (*http.Response, error) {
	start := time.Now()
	parent := req.Context()
	x := &exchange{p: p, start: start, parent: parent, grpc: classify.IsGRPC(req.Header)}
	ctx := parent
	if p.Provider != nil {
		x.pctx = classify.ProviderContext{Context: parent, Provider: p.Provider}
		ctx = &x.pctx
	}
	for i := range p.Timeouts {
		t := &p.Timeouts[i]
		if t.After <= 0 {
			continue
		}
		if x.cancel == nil {
			var cancel context.CancelCauseFunc
			ctx, cancel = context.WithCancelCause(ctx)
			x.cancel = func() { cancel(context.Canceled) }
			x.cancelCause = cancel
		}
		cancel := x.cancelCause
		tm := time.AfterFunc(t.After, func() { cancel(t.Cause) })
		x.timers = append(x.timers, timer{t: t, timer: tm})
		if t.FromRequestEnd && req.Body != nil && req.Body != http.NoBody {
			tm.Stop()
			x.afterBody = append(x.afterBody, timer{t: t, timer: tm})
		}
		if t.Cause == ErrIdleTimeout {
			// Idle: every read of either body starts it again.
			x.idle, x.idleFor = tm, t.After
		}
	}
	x.ctx = ctx

	limit := p.BodyLimit
	if limit <= 0 {
		limit = MaxRetryBodyBytes
	}
	retryable := p.Retry != nil
	x.deposits = p.Budget != nil && req.ContentLength <= limit
	body := req.Body // what the first attempt reads
	if body != nil && body != http.NoBody {
		if len(x.afterBody) > 0 {
			body = &endBody{ReadCloser: body, end: x}
		}
		if len(x.timers) > 0 {
			body = newAbortBody(ctx, body)
		}
		if x.idle != nil {
			body = &activityBody{ReadCloser: body, x: x}
		}
		switch {
		case !retryable:
		case req.ContentLength > limit:
			retryable = false
		case req.GetBody != nil && req.ContentLength > 0:
			// The caller can give the body again (http.NewRequest does
			// for bytes and strings): each retry gets a fresh copy, however
			// far the first attempt read.
			x.getBody = req.GetBody
		default:
			x.body = newReplayBodyLimit(body, req.ContentLength, int(limit))
			body = x.body
		}
	}

	for attempt := 0; ; attempt++ {
		actx := ctx
		var tt *tryTimer
		var tryCancel context.CancelCauseFunc
		last := !retryable || p.MaxRetries > 0 && attempt >= p.MaxRetries
		if p.TryTimeout > 0 && !last {
			actx, tryCancel = context.WithCancelCause(ctx)
			tt = &tryTimer{after: p.TryTimeout, cancel: tryCancel}
		}
		areq := req.WithContext(actx)
		switch {
		case attempt == 0:
			areq.Body = body
		case x.getBody != nil || x.body != nil:
			b, err := x.nextBody()
			if err != nil {
				x.fail(err)
				return nil, err
			}
			areq.Body, areq.GetBody = b, x.nextBody
		}
		if tt != nil {
			if areq.Body == nil || areq.Body == http.NoBody {
				tt.requestEnded()
			} else {
				// As the response timeout, from the end of the upload.
				areq.Body = &endBody{ReadCloser: areq.Body, end: tt}
			}
		}
		p.Recorder.Attempt(parent)
		resp, err := meshtrace.RoundTripAttempt(base, areq, attemptKind(retryable, attempt), attempt)
		tryExpired := false
		if tt != nil {
			tryExpired = tt.stop()
			if tryExpired && err == nil {
				// The head came as the attempt timed out: its stream is
				// cancelled already.
				closeBody(resp)
				resp, err = nil, ErrTryTimeout
			}
		}
		if err != nil {
			if tryExpired && errors.Is(context.Cause(actx), ErrTryTimeout) {
				err = ErrTryTimeout
			}
			if tryCancel != nil {
				tryCancel(context.Canceled)
			}
			class := classify.ErrorClass(actx, err)
			p.Recorder.AttemptDone(parent, Outcome{Class: class, Err: x.cause(err)}, start)
			if x.timedOut() {
				return x.gatewayTimeout(req), nil
			}
			if retryable && x.replayable() && p.Retry.Retryable(nil, class, err) && parent.Err() == nil {
				allowed := p.Retry.Allow(ctx, attempt)
				if allowed {
					x.retries++
					tap.NoteRetry(parent)
				}
				if x.timedOut() {
					return x.gatewayTimeout(req), nil
				}
				if allowed && parent.Err() == nil {
					continue
				}
				if allowed {
					err = context.Cause(parent)
				}
			} else if parent.Err() == nil {
				x.deposit() // an error that is not retried is an answer
			}
			x.fail(err)
			return nil, err
		}
		if tryCancel != nil {
			x.tryCancel = tryCancel
		}
		class, final := p.Classifier.Head(x.grpc, resp.StatusCode, resp.Header)
		canRetry := retryable && x.replayable()
		// retryClass is the class the retry decides on: the final class,
		// or for an HTTP/1 response the class of its head.
		retryClass, decided := class, final
		x.peeked = false
		if canRetry && !final {
			if resp.ProtoMajor >= 2 {
				x.peeked = true
				class, final = x.peek(resp, class)
				retryClass, decided = class, final
			} else {
				// HTTP/1 trailers are not waited for: the head is the
				// answer, classed as a stream that ends without them, as
				// Linkerd's proxy peeks for trailers on HTTP/2 only
				// (linkerd/http/retry/src/peek_trailers.rs,
				// PeekTrailersBody::map_response). The response keeps
				// its tentative class, which its trailers end.
				retryClass, decided = p.Classifier.End(class, x.grpc, nil), true
			}
		}
		if x.timedOut() {
			// A timeout fired as the head or the first chunk arrived.
			p.Recorder.AttemptDone(parent, Outcome{Status: resp.StatusCode, Class: classify.ErrorClass(ctx, classify.ErrTimeout), Err: context.Cause(ctx)}, start)
			closeBody(resp)
			return x.gatewayTimeout(req), nil
		}
		if !canRetry || !decided || !p.Retry.Retryable(resp, retryClass, nil) {
			return x.deliver(req, resp, class, final, true), nil
		}
		if !p.Retry.Allow(ctx, attempt) {
			if x.timedOut() {
				// A timeout fired during the backoff: the caller gets the
				// timeout, not the failure that was to be retried.
				p.Recorder.AttemptDone(parent, Outcome{Status: resp.StatusCode, Class: retryClass}, start)
				discard(resp)
				return x.gatewayTimeout(req), nil
			}
			// A failure the retry refused deposits nothing.
			return x.deliver(req, resp, class, final, false), nil
		}
		x.retries++
		tap.NoteRetry(parent)
		p.Recorder.AttemptDone(parent, Outcome{Status: resp.StatusCode, Class: retryClass}, start)
		discard(resp)
		x.releaseTry()
		switch {
		case parent.Err() != nil:
			// The caller gave up between attempts: a cancellation, not a
			// timeout of the route.
			err := context.Cause(parent)
			x.fail(err)
			return nil, err
		case x.timedOut():
			return x.gatewayTimeout(req), nil
		}
	}
}

type timer struct {
	t     *Timeout
	timer *time.Timer
}

// exchange is the state of one logical request across its attempts.
type exchange struct {
	p           *Plan
	start       time.Time
	parent      context.Context
	ctx         context.Context
	grpc        bool
	timers      []timer
	cancel      func()
	cancelCause context.CancelCauseFunc
	tryCancel   context.CancelCauseFunc // the delivered attempt's context
	retries     int
	deposits    bool        // the request's answers deposit into p.Budget
	peeked      bool        // the attempt's first body chunk was read
	idle        *time.Timer // the idle timer, reset on activity
	idleFor     time.Duration
	// afterBody are the timers that start when the request body ends;
	// bodyEnded starts them once, unless the exchange is over.
	afterBody []timer
	bodyEnded sync.Once
	over      atomic.Bool
	// The request body of a request that may be retried: the copy kept of
	// it, or the caller's way to get it again.
	body    *replayBody
	getBody func() (io.ReadCloser, error)
	// resp is the body of the response delivered to the caller, part of
	// the exchange so that a request costs one allocation less: an
	// exchange delivers at most one response.
	resp routeBody
	// pctx is the context that carries the plan's Provider, part of the
	// exchange for the same reason.
	pctx classify.ProviderContext
}

// cause returns the error an outcome reports: a timeout's cause in place
// of the cancellation it made.
func (x *exchange) cause(err error) error {
	if c := context.Cause(x.ctx); c != nil && errors.Is(c, classify.ErrTimeout) {
		return c
	}
	return err
}

// touch restarts the idle timer: a body moved.
func (x *exchange) touch() {
	if x.idle != nil {
		x.idle.Reset(x.idleFor)
	}
}

// requestEnded starts the timers that run from the end of the request.
func (x *exchange) requestEnded() {
	x.bodyEnded.Do(func() {
		if x.over.Load() {
			return
		}
		for _, t := range x.afterBody {
			t.timer.Reset(t.t.After)
		}
	})
}

// requestEnder is told when a request body ends; it may be told more than
// once, from the goroutine that sends the body.
type requestEnder interface {
	requestEnded()
}

// endBody is a request body that reports its end: its last read, or its
// closing, whichever comes first.
type endBody struct {
	io.ReadCloser
	end requestEnder
}

func (b *endBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.end.requestEnded()
	}
	return n, err
}

func (b *endBody) Close() error {
	b.end.requestEnded()
	return b.ReadCloser.Close()
}

// tryTimer is the per-attempt timeout of one attempt: it starts when the
// attempt's request body ends and stops when its response head arrives.
// The body may end on the transport's goroutine, so a mutex orders the
// start against the stop; once stopped it never starts.
type tryTimer struct {
	after  time.Duration
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	timer  *time.Timer // nil until the request body ends
	done   bool
}

func (t *tryTimer) requestEnded() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done || t.timer != nil {
		return
	}
	t.timer = time.AfterFunc(t.after, t.expire)
}

func (t *tryTimer) expire() { t.cancel(ErrTryTimeout) }

// stop stops the timer and reports whether it had fired.
func (t *tryTimer) stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	return t.timer != nil && !t.timer.Stop()
}

// activityBody is a request body whose reads count as activity.
type activityBody struct {
	io.ReadCloser
	x *exchange
}

func (b *activityBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.x.touch()
	}
	return n, err
}

// replayable reports whether a retry can send the request body.
func (x *exchange) replayable() bool {
	return x.getBody != nil || x.body.replayable()
}

// nextBody returns the request body of a retry.
func (x *exchange) nextBody() (io.ReadCloser, error) {
	if x.getBody != nil {
		return x.getBody()
	}
	return x.body.replay()
}

func (x *exchange) releaseTry() {
	if x.tryCancel != nil {
		x.tryCancel(context.Canceled)
		x.tryCancel = nil
	}
}

// deliver hands resp to the caller: no retry follows, the head timers
// stop. A timer that fired as it was stopped makes the answer a 504;
// otherwise resp deposits into the budget when deposit is set.
func (x *exchange) deliver(req *http.Request, resp *http.Response, class classify.Class, final, deposit bool) *http.Response {
	x.body.release()
	for _, t := range x.timers {
		if t.t.Stream {
			continue
		}
		if !t.timer.Stop() {
			x.p.Recorder.AttemptDone(x.parent, Outcome{Status: resp.StatusCode, Class: classify.ErrorClass(x.ctx, classify.ErrTimeout), Err: context.Cause(x.ctx)}, x.start)
			closeBody(resp)
			return x.gatewayTimeout(req)
		}
	}
	if deposit {
		if resp.ProtoMajor >= 2 && !x.peeked && resp.StatusCode != http.StatusSwitchingProtocols &&
			resp.Body != nil && resp.Body != http.NoBody {
			// An HTTP/2 answer comes with its first body frame, as
			// Linkerd's proxy peeks for trailers before it asks its
			// budget (linkerd/http/retry/src/peek_trailers.rs,
			// PeekTrailersBody::map_response): a response its caller
			// gives up before that deposits nothing.
			x.resp.deposit = true
		} else {
			x.deposit()
		}
	}
	return x.finish(resp, class, final)
}

// deposit makes an answer's deposit into the plan's budget.
func (x *exchange) deposit() {
	if x.deposits {
		x.p.Budget.Deposit()
	}
}

// fail records a logical request that ended in err.
func (x *exchange) fail(err error) {
	class := classify.ErrorClass(x.ctx, err)
	err = x.cause(err)
	x.done()
	x.p.Recorder.Done(x.parent, Outcome{Class: class, Err: err, Retries: x.retries}, x.start)
}

// done releases the exchange's contexts and timers.
func (x *exchange) done() {
	x.over.Store(true)
	for _, t := range x.timers {
		t.timer.Stop()
	}
	x.releaseTry()
	if x.cancel != nil {
		x.cancel()
	}
}

// timedOut reports whether one of the plan's timers fired.
func (x *exchange) timedOut() bool {
	return len(x.timers) > 0 && errors.Is(context.Cause(x.ctx), classify.ErrTimeout)
}

// gatewayTimeout is the response to a request whose timeout fired.
func (x *exchange) gatewayTimeout(req *http.Request) *http.Response {
	cause := context.Cause(x.ctx)
	x.done()
	class := classify.ErrorClass(x.ctx, classify.ErrTimeout)
	// No response head arrived: the 504 is the proxy's own answer, made
	// above the route's metrics, which record the error with no status.
	x.p.Recorder.Done(x.parent, Outcome{Class: class, Err: cause, Retries: x.retries}, x.start)
	msg := "request timed out"
	for _, t := range x.timers {
		if t.t.Cause == cause {
			msg = t.t.Message
		}
	}
	return proxyerr.Response(req, http.StatusGatewayTimeout, msg)
}

// finish hands resp to the caller, recording the logical request and the
// last attempt when its stream ends.
func (x *exchange) finish(resp *http.Response, class classify.Class, final bool) *http.Response {
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil || resp.Body == http.NoBody {
		x.record(resp, class, final, nil)
		if resp.StatusCode != http.StatusSwitchingProtocols {
			x.done()
		}
		return resp
	}
	x.resp.ReadCloser, x.resp.x, x.resp.resp, x.resp.class, x.resp.final = resp.Body, x, resp, class, final
	resp.Body = &x.resp
	return resp
}

func (x *exchange) record(resp *http.Response, class classify.Class, final bool, err error) {
	switch {
	case err != nil && !classify.Abandoned(x.parent):
		class = classify.ErrorClass(x.ctx, err)
		err = x.cause(err)
	case !final:
		// The end of the stream, or a body the caller gave up on (err
		// set): Linkerd's proxy classifies a response body dropped with
		// its client as one that ended there, without trailers.
		class = x.p.Classifier.End(class, x.grpc, resp.Trailer)
	}
	o := Outcome{Status: resp.StatusCode, Class: class, Err: err}
	x.p.Recorder.AttemptDone(x.parent, o, x.start)
	o.Retries = x.retries
	x.p.Recorder.Done(x.parent, o, x.start)
}

// peekLimit bounds the reads of a held response before it counts as a
// stream that does not end (a body returning no data and no error).
const peekLimit = 64

// peek reads the first body chunk of a response whose class waits on its
// trailers, under the exchange's timeouts. A stream that ends before any
// data (a gRPC trailers-only or empty-body response) is classified by its
// trailers; a chunk of data, or an error, is put back in front of the body
// for the caller, and the class stays tentative.
func (x *exchange) peek(resp *http.Response, tentative classify.Class) (classify.Class, bool) {
	if resp.Body == nil || resp.Body == http.NoBody {
		return x.p.Classifier.End(tentative, x.grpc, resp.Trailer), true
	}
	buf := make([]byte, 512)
	for range peekLimit {
		n, err := resp.Body.Read(buf)
		switch {
		case n > 0 || err != nil && !errors.Is(err, io.EOF):
			resp.Body = &peekedBody{data: buf[:n], err: err, rest: resp.Body}
			return tentative, false
		case err != nil:
			// Ended without data: the trailers are known.
			return x.p.Classifier.End(tentative, x.grpc, resp.Trailer), true
		}
	}
	return tentative, false
}

// peekedBody is a response body with its first chunk, or the error its
// first read returned, put back in front.
type peekedBody struct {
	data []byte
	err  error
	rest io.ReadCloser
}

func (b *peekedBody) Read(p []byte) (int, error) {
	if len(b.data) > 0 {
		n := copy(p, b.data)
		b.data = b.data[n:]
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.rest.Read(p)
}

func (b *peekedBody) Close() error { return b.rest.Close() }

// routeBody records the exchange when the response stream ends.
type routeBody struct {
	io.ReadCloser
	x     *exchange
	resp  *http.Response
	class classify.Class
	final bool
	once  atomic.Bool
	// deposit: the answer deposits at the first read that returns data,
	// the end of the stream or an error other than the caller's giving up.
	deposit bool
}

func (b *routeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.x.touch()
	}
	if b.deposit && (n > 0 || err != nil) {
		b.deposit = false
		if n > 0 || errors.Is(err, io.EOF) || !classify.Abandoned(b.x.parent) {
			b.x.deposit()
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		b.end(nil)
	default:
		b.end(err)
	}
	return n, err
}

func (b *routeBody) Close() error {
	err := b.ReadCloser.Close()
	b.end(nil)
	return err
}

func (b *routeBody) end(err error) {
	if b.once.Swap(true) {
		return
	}
	b.x.record(b.resp, b.class, b.final, err)
	b.x.done()
}

// discard closes a response that will be retried. An HTTP/1 body of a
// small declared length is read first, under the exchange's timeouts, so
// that its connection can be reused; an HTTP/2 stream is reset, which
// returns its flow-control window.
func discard(resp *http.Response) {
	if resp.Body == nil {
		return
	}
	if resp.ProtoMajor == 1 && resp.ContentLength >= 0 && resp.ContentLength <= MaxRetryBodyBytes {
		_, _ = io.CopyN(io.Discard, resp.Body, resp.ContentLength+1)
	}
	resp.Body.Close()
}

func closeBody(resp *http.Response) {
	if resp.Body != nil {
		resp.Body.Close()
	}
}

// attemptKind is the trace kind of attempt n of a logical request: none
// (no span of its own) when the request is never retried, so that its one
// attempt is its span.
func attemptKind(retryable bool, n int) meshtrace.AttemptKind {
	switch {
	case !retryable:
		return ""
	case n == 0:
		return meshtrace.AttemptFirst
	}
	return meshtrace.AttemptRetry
}
