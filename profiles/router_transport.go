package profiles

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/proxyerr"
)

// Transport returns the outbound side of the router around base (nil:
// http.DefaultTransport). Each request is routed by its profile and its
// route put into its context. A route's timeout bounds the request, every
// attempt included, until the response head: when it fires the caller gets
// a 504 with an l5d-proxy-error header, classified error="timeout". A
// retryable route's failed responses are retried while the profile's
// budget allows, when the request body is replayable (no body, or one of at
// most [MaxRetryBodyBytes], which is then buffered). Errors are never
// retried: the upstream may have seen the request. The route_ metrics count
// the logical request, route_actual_ each attempt.
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

// errBodyTooLarge marks a request body that cannot be replayed.
var errBodyTooLarge = errors.New("profiles: request body too large to retry")

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
		x.timer = time.AfterFunc(route.Timeout, func() { cancel(classify.ErrTimeout) })
	}
	x.ctx = ctx

	retryable := route.Retryable && ts.budget != nil
	var replay []byte
	body := req.Body
	if retryable {
		var err error
		replay, body, err = bufferBody(req)
		if err != nil && !errors.Is(err, errBodyTooLarge) {
			x.done()
			tg.route.Response(parent, response(0, classify.ErrorClass(ctx, err)), start)
			return nil, err
		}
		retryable = err == nil
	}

	for attempt := 0; ; attempt++ {
		areq := req.WithContext(ctx)
		if replay != nil {
			areq.Body = io.NopCloser(bytes.NewReader(replay))
			areq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(replay)), nil }
		} else {
			areq.Body = body // no body, or the one that is sent once
		}
		tg.actual.Request(parent)
		resp, err := t.base.RoundTrip(areq)
		if err != nil {
			class := classify.ErrorClass(ctx, err)
			tg.actual.Response(parent, response(0, class), start)
			if class.Error == "timeout" && x.timedOut() {
				return x.gatewayTimeout(req), nil
			}
			x.done()
			tg.route.Response(parent, response(0, class), start)
			return nil, err
		}
		if x.timer != nil && !x.timer.Stop() {
			// The timeout fired as the head arrived.
			tg.actual.Response(parent, response(resp.StatusCode, classify.ErrorClass(ctx, classify.ErrTimeout)), start)
			discard(resp)
			return x.gatewayTimeout(req), nil
		}
		class, final := route.classifier.Head(x.grpc, resp.StatusCode, resp.Header)
		if retryable && !final {
			// gRPC status may be in the trailers: read the body (up to the
			// buffer limit) to see them.
			class, final = x.peekTrailers(resp, class)
		}
		if !retryable || !final || !class.Failure {
			return x.finish(resp, class, final), nil
		}
		t.r.fams.retryable.Add(parent, tg.retryable)
		if !ts.budget.Withdraw() {
			t.r.fams.retryable.Add(parent, tg.noBudget)
			return x.finish(resp, class, final), nil
		}
		tg.actual.Response(parent, response(resp.StatusCode, class), start)
		discard(resp)
		if x.timer != nil {
			// Re-arm for what remains of the route timeout.
			remaining := route.Timeout - time.Since(start)
			if remaining <= 0 || ctx.Err() != nil {
				return x.gatewayTimeout(req), nil
			}
			x.timer.Reset(remaining)
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

// peekTrailers reads a response body of up to MaxRetryBodyBytes to classify
// it by its trailers, and puts the bytes back in front of the body.
func (x *exchange) peekTrailers(resp *http.Response, tentative classify.Class) (classify.Class, bool) {
	buf, err := io.ReadAll(io.LimitReader(resp.Body, MaxRetryBodyBytes+1))
	rest := resp.Body
	resp.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf), rest), closer: rest}
	if err != nil || len(buf) > MaxRetryBodyBytes {
		return tentative, false
	}
	// The body ended within the limit: trailers are known.
	var probe [1]byte
	if n, err := rest.Read(probe[:]); n != 0 || !errors.Is(err, io.EOF) {
		resp.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf), bytes.NewReader(probe[:n]), rest), closer: rest}
		return tentative, false
	}
	return x.route.classifier.End(tentative, x.grpc, resp.Trailer), true
}

type prefixedBody struct {
	io.Reader
	closer io.Closer
}

func (b *prefixedBody) Close() error { return b.closer.Close() }

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

// bufferBody reads a request body for replay. It returns the bytes and a
// body to send once in its place; errBodyTooLarge (with a body that
// replays the bytes read and streams the rest) when the body is larger than
// MaxRetryBodyBytes.
func bufferBody(req *http.Request) ([]byte, io.ReadCloser, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, req.Body, nil
	}
	if req.ContentLength > MaxRetryBodyBytes {
		return nil, req.Body, errBodyTooLarge
	}
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(io.LimitReader(req.Body, MaxRetryBodyBytes+1))
	data := bytes.Clone(buf.Bytes())
	bufPool.Put(buf)
	if err != nil {
		req.Body.Close()
		return nil, nil, err
	}
	if len(data) > MaxRetryBodyBytes {
		return nil, &prefixedBody{Reader: io.MultiReader(bytes.NewReader(data), req.Body), closer: req.Body}, errBodyTooLarge
	}
	req.Body.Close()
	if data == nil {
		data = []byte{}
	}
	return data, nil, nil
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// discard drains a little of a response that will not be used, so that its
// connection can be reused, and closes it.
func discard(resp *http.Response) {
	if resp.Body != nil {
		_, _ = io.CopyN(io.Discard, resp.Body, MaxRetryBodyBytes)
		resp.Body.Close()
	}
}
