package classify

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/internal/metrics"
)

// Transport classifies every response of its base RoundTripper and
// records the outbound request metrics. It changes neither requests nor
// responses, apart from wrapping the response body to see the end of the
// stream (bodies of 101 responses are left alone).
type Transport struct {
	base       http.RoundTripper
	rec        *recorder
	classifier *Classifier
	labels     *Labels
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport wraps base (nil: http.DefaultTransport).
func NewTransport(base http.RoundTripper, opts ...Option) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	cfg := newConfig(opts)
	return &Transport{base: base, rec: newRecorder(cfg, "outbound"), classifier: cfg.classifier, labels: cfg.labels}
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	ctx := req.Context()
	l := labelsFromContext(ctx)
	// The authority label is the one a balancer chose the endpoint for
	// (Labels.ForAuthority): the backend, or the split's target, as
	// Linkerd's proxy labels an endpoint's requests by its concrete
	// authority (linkerd/app/outbound/src/http/concrete.rs,
	// OutboundEndpointLabels), whatever Host the request carries. A
	// request with labels WithoutAuthority (a forward backend's) has no
	// authority label; its series are kept under the address it goes to.
	// Otherwise the request's own.
	authority := l.Authority()
	if authority == "" && !l.Unnamed() {
		authority = req.Host
	}
	if authority == "" && req.URL != nil {
		authority = req.URL.Host
	}
	if l == nil {
		l = t.labels
	}
	tg := t.rec.target(authority, l)
	tg.Request(ctx)
	c := FromContext(ctx)
	if c == nil {
		c = t.classifier
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		// A request the application cancelled before a response head
		// has no response, as in Linkerd's proxy, whose response future
		// is dropped with the application's stream and records nothing.
		if !Abandoned(ctx) {
			tg.Response(ctx, response(0, ErrorClass(ctx, err)), start)
		}
		return nil, err
	}
	grpc := IsGRPC(req.Header)
	class, final := c.Head(grpc, resp.StatusCode, resp.Header)
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil || resp.Body == http.NoBody {
		tg.Response(ctx, response(resp.StatusCode, class), start)
		return resp, nil
	}
	resp.Body = &observedBody{
		ReadCloser: resp.Body, resp: resp, ctx: ctx, start: start, target: tg,
		classifier: c, class: class, final: final, grpc: grpc,
	}
	return resp, nil
}

// observedBody records the response when its stream ends: at EOF (with
// the trailers), on a read error, or when it is closed early.
type observedBody struct {
	io.ReadCloser
	resp       *http.Response
	ctx        context.Context
	start      time.Time
	target     *metrics.Target
	classifier *Classifier
	class      Class
	final      bool
	grpc       bool
	done       atomic.Bool
}

func (b *observedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		b.finish(nil)
	default:
		b.finish(err)
	}
	return n, err
}

func (b *observedBody) Close() error {
	b.finish(nil)
	return b.ReadCloser.Close()
}

func (b *observedBody) finish(err error) {
	if b.done.Swap(true) {
		return
	}
	class := b.class
	switch {
	case err != nil && !Abandoned(b.ctx):
		class = ErrorClass(b.ctx, err)
	case !b.final:
		// The end of the stream, or of its reading: a body the
		// application gave up on is classified as one it closed, as
		// Linkerd's proxy classifies a response body dropped with the
		// application's stream.
		class = b.classifier.End(class, b.grpc, b.resp.Trailer)
	}
	b.target.Response(b.ctx, response(b.resp.StatusCode, class), b.start)
}
