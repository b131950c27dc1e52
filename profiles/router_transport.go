package profiles

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/proxyerr"
)

// Transport returns the outbound side of the router around base (nil:
// http.DefaultTransport). Each request is routed by its profile and its
// route put into its context.
//
// A route's timeout bounds the request, every attempt included, until its
// response goes to the caller: the wait for each response head, and for
// the first body chunk of a response held to read its trailers. When it
// fires the caller gets a 504 with an l5d-proxy-error header, classified
// error="timeout". A caller that cancels its request gets its context's
// error, classified as an error, never as a timeout.
//
// A retryable route's failed responses are retried while the profile's
// budget allows. The request body is forwarded as it arrives, never
// waited for, while a copy of up to [MaxRetryBodyBytes] is kept: a retry
// happens only when the first attempt read the whole body within that cap,
// and sends the copy. A body of a known length within the cap that the
// caller can give again (Request.GetBody) is taken from the caller instead. A response is held back only when its class waits on
// trailers and its stream ends before any data (a gRPC trailers-only or
// empty-body failure); a response with data goes to the caller at once.
// Errors are never retried: the upstream may have seen the request. The
// route_ metrics count the logical request, route_actual_ each attempt.
func (r *Router) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &routerTransport{r: r, base: base}
}

type routerTransport struct {
	r    *Router
	base http.RoundTripper
}

func (t *routerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	d := t.r.destFor(t.r.requestKey(req))
	ts := d.state.Load()
	route := ts.table.Select(req)
	tg := &ts.targetsOf(route).out
	parent := req.Context()
	tg.route.Request(parent)
	if ts.budget != nil {
		ts.budget.Deposit()
	}

	x := &exchange{route: route, tg: tg, start: start, parent: parent, grpc: classify.IsGRPC(req.Header)}
	ctx := classify.WithProvider(parent, route)
	if route.Timeout > 0 {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		x.cancel = func() { cancel(context.Canceled) }
		// One timer for the whole exchange: it runs across the attempts
		// and stops when a response goes to the caller.
		x.timer = time.AfterFunc(route.Timeout, func() { cancel(classify.ErrTimeout) })
	}
	x.ctx = ctx

	retryable := route.Retryable && ts.budget != nil
	body := req.Body // what the first attempt reads
	if body != nil && body != http.NoBody {
		if x.timer != nil {
			body = newAbortBody(ctx, body)
		}
		switch {
		case !retryable:
		case req.ContentLength > MaxRetryBodyBytes:
			retryable = false
		case req.GetBody != nil && req.ContentLength > 0:
			// The caller can give the body again (http.NewRequest does
			// for bytes and strings): each retry gets a fresh copy, however
			// far the first attempt read.
			x.getBody = req.GetBody
		default:
			x.body = newReplayBody(body, req.ContentLength)
			body = x.body
		}
	}

	for attempt := 0; ; attempt++ {
		areq := req.WithContext(ctx)
		switch {
		case attempt == 0:
			areq.Body = body
		case x.getBody != nil || x.body != nil:
			b, err := x.nextBody()
			if err != nil {
				x.fail(classify.ErrorClass(ctx, err))
				return nil, err
			}
			areq.Body, areq.GetBody = b, x.nextBody
		}
		tg.actual.Request(parent)
		resp, err := t.base.RoundTrip(areq)
		if err != nil {
			class := classify.ErrorClass(ctx, err)
			tg.actual.Response(parent, response(0, class), start)
			if x.timedOut() {
				return x.gatewayTimeout(req), nil
			}
			x.fail(class)
			return nil, err
		}
		class, final := route.classifier.Head(x.grpc, resp.StatusCode, resp.Header)
		canRetry := retryable && x.replayable()
		if canRetry && !final {
			class, final = x.peek(resp, class)
		}
		if x.timedOut() {
			// The timeout fired as the head or the first chunk arrived.
			tg.actual.Response(parent, response(resp.StatusCode, classify.ErrorClass(ctx, classify.ErrTimeout)), start)
			closeBody(resp)
			return x.gatewayTimeout(req), nil
		}
		if !canRetry || !final || !class.Failure {
			return x.deliver(req, resp, class, final), nil
		}
		t.r.fams.retryable.Add(parent, tg.retryable)
		if !ts.budget.Withdraw() {
			t.r.fams.retryable.Add(parent, tg.noBudget)
			return x.deliver(req, resp, class, final), nil
		}
		tg.actual.Response(parent, response(resp.StatusCode, class), start)
		discard(resp)
		switch {
		case parent.Err() != nil:
			// The caller gave up between attempts: a cancellation, not a
			// timeout of the route.
			err := context.Cause(parent)
			x.fail(classify.ErrorClass(parent, err))
			return nil, err
		case x.timedOut():
			return x.gatewayTimeout(req), nil
		}
	}
}

// exchange is the state of one logical request across its attempts.
type exchange struct {
	route  *CompiledRoute
	tg     *dirTargets
	start  time.Time
	parent context.Context
	ctx    context.Context
	grpc   bool
	timer  *time.Timer
	cancel func()
	// The request body of a request that may be retried: the copy kept of
	// it, or the caller's way to get it again.
	body    *replayBody
	getBody func() (io.ReadCloser, error)
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

// deliver hands resp to the caller: no retry follows, the timer stops. A
// timer that fired as it was stopped makes the answer a 504.
func (x *exchange) deliver(req *http.Request, resp *http.Response, class classify.Class, final bool) *http.Response {
	x.body.release()
	if x.timer != nil && !x.timer.Stop() {
		x.tg.actual.Response(x.parent, response(resp.StatusCode, classify.ErrorClass(x.ctx, classify.ErrTimeout)), x.start)
		closeBody(resp)
		return x.gatewayTimeout(req)
	}
	return x.finish(resp, class, final)
}

// fail records a logical request that ended in an error of class c.
func (x *exchange) fail(c classify.Class) {
	x.done()
	x.tg.route.Response(x.parent, response(0, c), x.start)
}

// done releases the exchange's context and timer.
func (x *exchange) done() {
	if x.timer != nil {
		x.timer.Stop()
	}
	if x.cancel != nil {
		x.cancel()
	}
}

func (x *exchange) timedOut() bool {
	return errors.Is(context.Cause(x.ctx), classify.ErrTimeout)
}

// gatewayTimeout is the response to a request whose route timeout fired.
func (x *exchange) gatewayTimeout(req *http.Request) *http.Response {
	x.done()
	class := classify.ErrorClass(x.ctx, classify.ErrTimeout)
	x.tg.route.Response(x.parent, response(http.StatusGatewayTimeout, class), x.start)
	return proxyerr.Response(req, http.StatusGatewayTimeout, "request timed out after "+x.route.Timeout.String())
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
	resp.Body = &routeBody{ReadCloser: resp.Body, x: x, resp: resp, class: class, final: final}
	return resp
}

func (x *exchange) record(resp *http.Response, class classify.Class, final bool, err error) {
	switch {
	case err != nil:
		class = classify.ErrorClass(x.ctx, err)
	case !final:
		class = x.route.classifier.End(class, x.grpc, resp.Trailer)
	}
	r := response(resp.StatusCode, class)
	x.tg.actual.Response(x.parent, r, x.start)
	x.tg.route.Response(x.parent, r, x.start)
}

// peekLimit bounds the reads of a held response before it counts as a
// stream that does not end (a body returning no data and no error).
const peekLimit = 64

// peek reads the first body chunk of a response whose class waits on its
// trailers, under the route timeout. A stream that ends before any data (a
// gRPC trailers-only or empty-body response) is classified by its
// trailers; a chunk of data, or an error, is put back in front of the body
// for the caller, and the class stays tentative.
func (x *exchange) peek(resp *http.Response, tentative classify.Class) (classify.Class, bool) {
	if resp.Body == nil || resp.Body == http.NoBody {
		return x.route.classifier.End(tentative, x.grpc, resp.Trailer), true
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
			return x.route.classifier.End(tentative, x.grpc, resp.Trailer), true
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
}

func (b *routeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
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
// small declared length is read first, under the route timeout, so that
// its connection can be reused; an HTTP/2 stream is reset, which returns
// its flow-control window.
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
