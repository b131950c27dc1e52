package profileroute

import (
	"io"
	"net/http"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/rw"
)

// Handler returns the inbound side of the router: each request for one of
// the server's own authorities ([WithLocalAuthorities]) is routed by its
// profile; every other request takes the default route, labelled
// dst="other", and never makes the router watch its Host. The route goes
// into the request's context and the request is recorded in the route_
// metrics with direction="inbound"; one its client gave up on before the
// response head has no response there. Inbound routes are neither retried
// nor timed out.
//
// HTTP/1 requests are served full duplex ([http.ResponseController.EnableFullDuplex]):
// the application may answer, or stream its answer, while the request body
// still arrives, where Go's HTTP/1 server would otherwise wait for the whole
// body before it writes a response.
func (r *Router) Handler(next http.Handler) http.Handler {
	return &routerHandler{r: r, next: next}
}

type routerHandler struct {
	r    *Router
	next http.Handler
}

func (h *routerHandler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	d := h.r.localDestFor(h.r.requestKey(req))
	ts := d.state.Load()
	route := ts.table.Select(req)
	tg := ts.targetsOf(route).inbound()
	if meshtrace.Enabled(req.Context()) {
		meshtrace.SetAttributes(req.Context(), tg.trace...)
	}
	ctx := req.Context()
	tg.route.Request(ctx)
	// A request without a body has nothing to read while the response is
	// written: it is served as Go's server serves it. (An HTTP/2 request
	// restored to HTTP/1 by the orig-proto layer has a body value even
	// when it has no body, and a ContentLength of 0.)
	var duplex *duplexBody
	if req.ProtoMajor == 1 && req.ContentLength != 0 && req.Body != nil && req.Body != http.NoBody &&
		canFullDuplex(w) && http.NewResponseController(w).EnableFullDuplex() == nil {
		duplex = &duplexBody{ReadCloser: req.Body}
	}

	req = req.WithContext(classify.WithProvider(ctx, route))
	if duplex != nil {
		req.Body = duplex
	}
	ww, st := rw.Wrap(w)
	st.Ctx = ctx
	completed := false
	defer func() {
		if !completed {
			// As classify's handler: a panic is a response cut short,
			// unless the client went away, before the head (no response)
			// or after it (the response as it ended).
			switch {
			case !classify.Abandoned(ctx):
				tg.route.Response(ctx, metrics.Aborted(st.Status), start)
			case !st.Unanswered():
				tg.route.Response(ctx, response(classify.Finish(route.ResponseClassifier(), req, st)), start)
			}
			st.Release()
		}
	}()
	h.next.ServeHTTP(ww, req)
	completed = true
	if duplex != nil && !st.Hijacked {
		endDuplex(ww, duplex, st.Status != 0)
	}
	// A request whose client gave up before the head went out has no
	// response, as in Linkerd's proxy.
	if !classify.Abandoned(ctx) || !st.Unanswered() {
		tg.route.Response(ctx, response(classify.Finish(route.ResponseClassifier(), req, st)), start)
	}
	st.Release()
}

// canFullDuplex reports whether w, or a writer it wraps, has
// EnableFullDuplex: asking a writer that has none costs the formatting of
// an error on every request.
func canFullDuplex(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case interface{ EnableFullDuplex() error }:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// duplexBody is the body of a request served full duplex; it notes
// whether the handler read it to its end.
type duplexBody struct {
	io.ReadCloser
	done bool
}

func (b *duplexBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.done = true
	}
	return n, err
}

// endDuplex ends an HTTP/1 exchange served full duplex whose body the
// handler did not read to its end: the response goes out first, then the
// request body is closed. Closing it here, not in the server after the
// handler, is what keeps Go's server from reading the next request while
// its read of this body's end is still under way (golang/go#68560, a
// panic), and the flush first keeps that close, which waits for the rest
// of a body still arriving, from holding the response back. A body read
// to its end needs neither, and without the flush a short response keeps
// its Content-Length and goes out in one write.
func endDuplex(w http.ResponseWriter, body *duplexBody, wrote bool) {
	if body.done {
		return
	}
	if wrote {
		_ = http.NewResponseController(w).Flush()
	}
	body.Close()
}
