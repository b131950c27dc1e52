package profileroute

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/inmesh/inmesh/tap"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/exchange"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/profiles"
)

// Transport returns the outbound side of the router around base (nil:
// http.DefaultTransport). Each request is routed by its profile and its
// route put into its context.
//
// A route's timeout bounds the request, every attempt included, until its
// response goes to the caller: the wait for each response head, and for
// the first body chunk of an HTTP/2 response held to read its trailers. When it
// fires the caller gets a 504 with an l5d-proxy-error header, classified
// error="timeout". A caller that cancels its request gets its context's
// error, classified as an error, never as a timeout.
//
// A retryable route's failed responses are retried while the profile's
// budget allows; the budget is earned by the answers of the routes that
// spend it (retryable or hedged), not by the profile's other routes: each
// answer that is not retried deposits, a request given up or timed out
// before its answer deposits nothing. The
// request body is forwarded as it arrives, never waited for, while a copy
// of up to [MaxRetryBodyBytes] is kept: a retry
// happens only when the first attempt read the whole body within that cap,
// and sends the copy. A body of a known length within the cap that the
// caller can give again (Request.GetBody) is taken from the caller
// instead. An HTTP/2 response whose class waits on trailers is held until
// its first body chunk, and retried by them only when its stream ends
// before any data (a gRPC trailers-only or empty-body failure); a response
// with data goes to the caller at once. An HTTP/1 response is never held:
// its head decides, as a stream that ends without trailers. Errors are
// never retried: the upstream may have seen the request. The route_
// metrics count the logical request, route_actual_ each attempt. When the
// profile's dst overrides split the traffic, each attempt (a retry, a
// hedge) draws its backend anew, so that a retry may reach a backend
// other than the one that failed.
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
	d := t.r.destFor(t.r.requestKey(req))
	return t.r.roundTrip(t.base, req, d.state.Load())
}

// roundTrip runs req by the profile table state ts.
func (r *Router) roundTrip(base http.RoundTripper, req *http.Request, ts *tableState) (*http.Response, error) {
	route := ts.table.Select(req)
	tg := ts.targetsOf(route).outbound()
	if meshtrace.Enabled(req.Context()) {
		meshtrace.SetAttributes(req.Context(), tg.trace...)
	}
	tg.route.Request(req.Context())
	tap.NoteRoute(req.Context(), tg.name)
	p := tg.plan.Load()
	if p == nil {
		tg.plan.CompareAndSwap(nil, r.newPlan(route, ts, tg)) // a racing first request may have won
		p = tg.plan.Load()
	}
	if p.Provider != route {
		// Routes without targets of their own share the default ones:
		// the plan cached there is another route's.
		p = r.newPlan(route, ts, tg)
	}
	switch {
	case ts.logical == "":
		// The authority itself: the balancer splits it by its profile.
	case ts.split != nil:
		// The profile got for the authority is its service's, and its
		// dst overrides split the traffic: each attempt draws its
		// backend, a retry too, as Linkerd's proxy retries a profile
		// route above the distribution over the profile's targets
		// (linkerd/app/outbound/src/http/logical/profile.rs,
		// RouteParams::layer).
		base = &splitTransport{split: ts.split, base: base}
	default:
		// The profile got for the authority is its service's, without
		// dst overrides: the service itself
		// (linkerd/app/outbound/src/http/logical/profile.rs builds the
		// concrete backend from that profile's address).
		req = withAuthority(req, ts.logical)
	}
	if tg.hedge != nil {
		// Outside the split: a hedge is another attempt, which draws its
		// backend as a retry does.
		base = hedged{h: tg.hedge, base: base}
	}
	return exchange.RoundTrip(base, req, p)
}

// splitTransport sends each request to a backend of a profile's split,
// drawn at random by weight for that request.
type splitTransport struct {
	split *balancer.Split
	base  http.RoundTripper
}

func (t *splitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.base.RoundTrip(withAuthority(req, t.split.Pick()))
}

// withAuthority returns a shallow copy of req sent to the concrete backend
// a, as the policy router sends a request to its backend: a in the URL's
// host, whose endpoints alone a balancer resolves
// (balancer.ConcreteContext), and the Host the caller sent (its URL's host
// when it set none) kept, as Linkerd's proxy leaves the authority of a
// request it balances over a profile's backends
// (linkerd/app/outbound/src/http/logical/profile.rs sets no authority).
func withAuthority(req *http.Request, a string) *http.Request {
	l := &concreteRequest{ctx: balancer.ConcreteContext{Context: req.Context()}, url: *req.URL}
	out := req.WithContext(&l.ctx)
	if out.Host == "" {
		out.Host = req.URL.Host
	}
	l.url.Host = a
	out.URL = &l.url
	return out
}

// concreteRequest holds the context and URL of a request sent to a
// profile's backend, in one allocation.
type concreteRequest struct {
	ctx balancer.ConcreteContext
	url url.URL
}

// hedged sends each attempt of a hedged route through its hedger.
type hedged struct {
	h    Hedger
	base http.RoundTripper
}

func (t hedged) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.h.RoundTrip(t.base, req)
}

// newPlan builds the exchange plan of route in table state ts, whose
// outbound targets are tg. Everything in it is fixed for the life of ts (its
// budget included: ts is built whole before it serves), so it is built on
// the route's first request and shared by every later one.
func (r *Router) newPlan(route *profiles.CompiledRoute, ts *tableState, tg *dirTargets) *exchange.Plan {
	p := &exchange.Plan{
		Provider:   route,
		Classifier: route.ResponseClassifier(),
		BodyLimit:  MaxRetryBodyBytes,
		Recorder:   (*profileRecorder)(tg),
	}
	if route.Timeout > 0 {
		p.Timeouts = []exchange.Timeout{{After: route.Timeout, Cause: classify.ErrTimeout,
			Message: "request timed out after " + route.Timeout.String()}}
	}
	if route.Retryable && ts.budget != nil {
		p.Retry = &budgetRetry{budget: ts.budget.get(), tg: tg, fam: r.fams.retryable}
	}
	if ts.budget != nil && (route.Retryable || tg.hedge != nil) {
		// Only a route that spends the budget earns it, by retries or by
		// hedges: traffic on the profile's other routes earns nothing.
		// Its answers deposit as they come, as Linkerd's proxy asks the
		// budget (linkerd/app/outbound/src/http/retry.rs,
		// RetryPolicy::retry): an answer not retried deposits, a retry
		// withdraws, a failure the budget refuses deposits nothing, and
		// a request dropped before its answer (given up, or ended by the
		// route's timeout, which wraps the retry layer in
		// linkerd/app/outbound/src/http/logical/profile.rs) is never
		// asked.
		p.Budget = ts.budget.get()
	}
	return p
}

// profileRecorder records the route_ (logical request) and route_actual_
// (attempt) families.
type profileRecorder dirTargets

func (pr *profileRecorder) Attempt(ctx context.Context) { pr.actual.Request(ctx) }

func (pr *profileRecorder) AttemptDone(ctx context.Context, o exchange.Outcome, start time.Time) {
	if !o.Unanswered(ctx) {
		pr.actual.Response(ctx, response(o.Status, o.Class), start)
	}
}

func (pr *profileRecorder) Done(ctx context.Context, o exchange.Outcome, start time.Time) {
	if !o.Unanswered(ctx) {
		pr.route.Response(ctx, response(o.Status, o.Class), start)
	}
	if meshtrace.Enabled(ctx) {
		errLabel := ""
		if o.Err != nil && errors.Is(o.Err, classify.ErrTimeout) {
			errLabel = "REQUEST_TIMEOUT"
		}
		meshtrace.Classified(ctx, !o.Class.Failure, errLabel, o.Retries)
	}
}

// budgetRetry retries a retryable route's failed responses, never its
// errors, while the profile's budget allows.
type budgetRetry struct {
	budget *profiles.Budget
	tg     *dirTargets
	fam    *metrics.Counter
}

func (b *budgetRetry) Retryable(resp *http.Response, class classify.Class, _ error) bool {
	return resp != nil && class.Failure
}

func (b *budgetRetry) Allow(ctx context.Context, _ int) bool {
	b.fam.Add(ctx, b.tg.retryable)
	if !b.budget.Withdraw() {
		b.fam.Add(ctx, b.tg.noBudgetOpts())
		return false
	}
	return true
}
