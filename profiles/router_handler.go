package profiles

import (
	"net/http"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/rw"
)

// Handler returns the inbound side of the router: each request for one of
// the server's own authorities ([WithLocalAuthorities]) is routed by its
// profile; every other request takes the default route, labelled
// dst="other", and never makes the router watch its Host. The route goes
// into the request's context and the request is recorded in the route_
// metrics with direction="inbound". Inbound routes are neither retried nor
// timed out.
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
	tg := &ts.targetsOf(route).in
	ctx := req.Context()
	tg.route.Request(ctx)

	req = req.WithContext(classify.WithProvider(ctx, route))
	ww, st := rw.Wrap(w)
	completed := false
	defer func() {
		if !completed {
			tg.route.Response(ctx, metrics.Aborted(st.Status), start)
			st.Release()
		}
	}()
	h.next.ServeHTTP(ww, req)
	completed = true
	tg.route.Response(ctx, response(classify.Finish(route.classifier, req, st)), start)
	st.Release()
}
