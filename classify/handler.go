package classify

import (
	"context"
	"net/http"
	"reflect"
	"time"

	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/rw"
)

// NewMiddleware returns a middleware that classifies every response of the
// wrapped handler and records the inbound request metrics. The middleware
// panics when it is given a nil handler, as [http.Handle] does: a nil
// handler could serve no request.
func NewMiddleware(opts ...Option) func(http.Handler) http.Handler {
	cfg := newConfig(opts)
	rec := newRecorder(cfg, "inbound")
	return func(next http.Handler) http.Handler {
		if nilHandler(next) {
			panic("classify: nil handler")
		}
		return &handler{next: next, rec: rec, classifier: cfg.classifier, labels: cfg.labels}
	}
}

// NewHandler wraps next with [NewMiddleware]. It panics when next is nil,
// at once rather than at the first request.
func NewHandler(next http.Handler, opts ...Option) http.Handler {
	if nilHandler(next) {
		panic("classify: NewHandler: nil handler")
	}
	return NewMiddleware(opts...)(next)
}

// nilHandler reports whether h is nil or a nil func or pointer in an
// interface (http.HandlerFunc(nil), a nil *http.ServeMux).
func nilHandler(h http.Handler) bool {
	if h == nil {
		return true
	}
	switch v := reflect.ValueOf(h); v.Kind() {
	case reflect.Func, reflect.Pointer:
		return v.IsNil()
	}
	return false
}

// HandlerWithLabels returns a handler that records into the same metrics
// as h, a handler made by [NewHandler] or [NewMiddleware], and serves the
// same next handler, but labels the requests whose context carries no
// labels with l (as [WithDefaultLabels] would). It lets a layer in front
// choose a request's labels by choosing its handler, which costs the
// request no new context. It returns nil when h was not made by this
// package.
func HandlerWithLabels(h http.Handler, l *Labels) http.Handler {
	hh, ok := h.(*handler)
	if !ok {
		return nil
	}
	c := *hh
	c.labels = l
	return &c
}

type handler struct {
	next       http.Handler
	rec        *recorder
	classifier *Classifier
	labels     *Labels
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx := r.Context()
	l := labelsFromContext(ctx)
	if l == nil {
		l = h.labels
	}
	t := h.rec.target(r.Host, l)
	t.Request(ctx)
	ww, st := rw.Wrap(w)
	st.Ctx = ctx
	completed := false
	defer func() {
		if !completed {
			switch {
			case !Abandoned(ctx):
				// The handler panicked (http.ErrAbortHandler included):
				// the response was cut short.
				t.Response(ctx, metrics.Aborted(st.Status), start)
			case !st.Unanswered():
				// The client went away during the response (a reverse
				// proxy aborts its copy): Linkerd's proxy records a
				// response body its client dropped as it ended.
				t.Response(ctx, response(Finish(h.classifierOf(ctx), r, st)), start)
			}
			st.Release()
		}
	}()
	h.next.ServeHTTP(ww, r)
	completed = true

	// A request whose client gave up before the head went out has no
	// response, as in Linkerd's proxy: nobody received the 502 a proxy
	// answers once its upstream call is cancelled, nor the 200 of an
	// application that returns without writing.
	if !Abandoned(ctx) || !st.Unanswered() {
		t.Response(ctx, response(Finish(h.classifierOf(ctx), r, st)), start)
	}
	st.Release()
}

// classifierOf returns the classifier of a request with context ctx.
func (h *handler) classifierOf(ctx context.Context) *Classifier {
	if c := FromContext(ctx); c != nil {
		return c
	}
	return h.classifier
}

// Written is what a handler wrote, as a ResponseWriter wrapper records it.
type Written interface {
	// WrittenHead returns the status written (0: none), whether the
	// connection was hijacked, and the header when it carries a
	// grpc-status (nil otherwise).
	WrittenHead() (status int, hijacked bool, grpcHead http.Header)
	// Trailer returns the value of a trailer the handler set.
	Trailer(name string) (string, bool)
}

// Finish returns the status and class of what a handler wrote, once it
// returned. A handler that wrote nothing answered 200 (net/http writes it
// when the handler returns); a hijacked connection has no status and is a
// success.
func Finish(c *Classifier, r *http.Request, w Written) (status int, class Class) {
	status, hijacked, head := w.WrittenHead()
	if hijacked {
		return 0, success
	}
	if status == 0 {
		status = http.StatusOK
	}
	grpc := IsGRPC(r.Header)
	class, final := c.Head(grpc, status, head)
	if !final {
		v, ok := w.Trailer("Grpc-Status")
		class = c.EndStatus(class, grpc, v, ok)
	}
	return status, class
}
