package router

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/inmesh/inmesh/tap"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/exchange"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/proxyerr"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/router/internal/profileroute"
	"google.golang.org/grpc/codes"
)

// FailFast is implemented by errors of a backend that failed a request
// without sending it because it had no ready endpoint in time (the
// balancer's fail-fast). Such a request is retried by a policy route with
// retries, whatever its conditions.
type FailFast interface{ FailFast() bool }

// LoadShed is implemented by errors of a backend that refused a request
// because it was overloaded; these are never retried.
type LoadShed interface{ LoadShed() bool }

// ErrForbiddenRoute is the error of a request whose target's policy
// refuses every connection ([policy.Table.Forbidden]): an opaque policy
// whose route forbids it, such as the one Linkerd's policy controller
// answers for a Service's clusterIP on a port that the Service does not
// declare. Linkerd's proxy closes such a connection without a response
// (linkerd/app/outbound/src/opaq/logical/route/filters.rs,
// TCPForbiddenRoute); the router answers no response either: the request
// fails with this error, never sent.
var ErrForbiddenRoute = errors.New("forbidden TCP route")

// Transport returns the outbound side of the router around base (nil:
// http.DefaultTransport). base receives each attempt with its URL host
// set to the chosen backend: a balancer backend's authority (base is then
// typically a balancer.Transport, which resolves it), or a forward
// backend's address. Its Host stays the authority the caller sent (the
// caller's URL host when it set no Host), as Linkerd's proxy leaves a
// request's authority to the application behind the backend. A target
// whose policy has no HTTP routes (opaque or TLS) takes the default
// route, unless its opaque route forbids the connection: its requests
// then fail with [ErrForbiddenRoute], unsent.
//
// Policy routes: the rule's filters apply in order (request and response
// header modifiers, redirects, failure injectors), then the backend's;
// the backend comes from the rule's distribution (empty: 500 with
// l5d-proxy-error; first-available: the first; random-available: at
// random by weight). The request timeout bounds the whole exchange, both
// streams; the response timeout the time from the end of the request
// body (at once without one) to the end of the response, so that a slow
// upload does not count; when one fires before the response went to the
// caller the answer is a 504. The idle timeout bounds the time in which
// neither body moves (the wait for the response head included). None of
// these is retried. The retry's timeout
// bounds each attempt but the last from the end of its request body until
// its response headers; an attempt that runs out is retried. Retries are counted (max_retries, default 1):
// responses with a status in the rule's ranges or a gRPC status among its
// codes (a rule that lists neither retries no response), fail-fast errors
// ([FailFast]), response header timeouts and REFUSED_STREAM resets; never
// load shedding ([LoadShed]). Request bodies of up to max_request_bytes are replayed;
// larger ones are sent once. Between attempts the retry's backoff waits
// (25-250 ms with full jitter by default).
//
// With allow_l5d_request_headers the l5d-retry-http, l5d-retry-grpc,
// l5d-retry-limit, l5d-retry-timeout, l5d-timeout (or l5d-request-timeout)
// and l5d-response-timeout request headers override the rule's retry and
// timeouts, the retry conditions on routes of either kind. These headers
// never reach the upstream on a policy route: Linkerd's proxy removes them
// only when it honours them; here they are removed whether or not the rule
// allows them, so a client cannot steer a proxy further on.
func (r *Router) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if t := r.tracer(); t != nil {
		return t.Transport(&transport{r: r, base: meshtrace.Outbound(base)})
	}
	return &transport{r: r, base: base}
}

type transport struct {
	r    *Router
	base http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := t.r
	if r.cfg.discoveryWait > 0 {
		if err := r.awaitDiscovery(req); err != nil {
			closeReqBody(req)
			return nil, err
		}
	}
	prof := r.outProfiles()
	if prof != nil {
		if v := prof.Resolve(req); v.Applies() {
			return v.RoundTrip(t.base, req)
		}
	}
	ps := r.policyFor(req)
	if ps == nil || ps.table == nil || ps.table.For(req) == nil {
		if ps != nil && ps.table.Forbidden() {
			// An opaque policy that refuses the connection: counted as
			// the connection Linkerd's proxy would open and close.
			ps.forbidden.Refused()
			closeReqBody(req)
			return nil, ErrForbiddenRoute
		}
		// No policy, or one without HTTP routes (an opaque or TLS port,
		// whose connections go to the Service as they are): the default
		// route, through the profile router when there is one (its
		// default route and metrics).
		if prof != nil {
			return prof.Resolve(req).RoundTrip(t.base, req)
		}
		return t.base.RoundTrip(req)
	}
	route, match := ps.table.Select(req)
	if route == nil {
		closeReqBody(req)
		return proxyerr.Response(req, http.StatusNotFound, "no route found for request"), nil
	}
	return r.runPolicy(t.base, req, ps.target(r, req, route), match)
}

// awaitDiscovery waits, at most the configured bound, until the request's
// authority has its first profile and policy answers; it returns the
// request's context error when the request ends first. A request that
// waited out the bound ends the wait of the authority for every request
// after it: a source that does not answer costs the bound once.
func (r *Router) awaitDiscovery(req *http.Request) error {
	var prof, pol <-chan struct{}
	var v profileroute.Resolved
	if p := r.outProfiles(); p != nil {
		v = p.Resolve(req)
		prof = v.Discovered()
	}
	ps := r.policyFor(req)
	if ps != nil {
		pol = ps.first.Done()
	}
	if answered(prof) && answered(pol) {
		return nil
	}
	timer := time.NewTimer(r.cfg.discoveryWait)
	defer timer.Stop()
	for _, ch := range []<-chan struct{}{prof, pol} {
		if ch == nil {
			continue
		}
		select {
		case <-ch:
		case <-timer.C:
			// The bound: the default route, for this request and, until
			// an answer comes, for those after it without a wait.
			if prof != nil {
				v.GiveUp()
			}
			if ps != nil {
				ps.first.Answered()
			}
			return nil
		case <-req.Context().Done():
			return req.Context().Err()
		}
	}
	return nil
}

// answered reports whether ch is nil or closed.
func answered(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return ch == nil
	}
}

// runPolicy runs req by the policy route of rt, selected by match.
func (r *Router) runPolicy(base http.RoundTripper, req *http.Request, rt *routeTarget, match policy.Match) (*http.Response, error) {
	route := rt.route
	tap.NoteRoute(req.Context(), route.Meta.Name)
	if meshtrace.Enabled(req.Context()) {
		meshtrace.SetAttributes(req.Context(), rt.traced().route...)
	}
	x := &policyExchange{r: r, rt: rt, base: base, grpc: route.GRPC || classify.IsGRPC(req.Header), match: match, ctx: req.Context()}
	timeouts := route.Timeouts
	retry := route.Retry
	if hasL5d(req.Header) {
		req = req.Clone(req.Context())
		if route.AllowL5dRequestHeaders {
			retry, timeouts = overrideL5d(req.Header, retry, timeouts)
		}
		stripL5d(req.Header)
	}
	x.retry = retry
	p := &exchange.Plan{Classifier: defaultClassifier, Recorder: x}
	if timeouts.Request > 0 {
		p.Timeouts = append(p.Timeouts, exchange.Timeout{After: timeouts.Request, Cause: exchange.ErrRequestTimeout, Stream: true,
			Message: "request timed out after " + timeouts.Request.String()})
	}
	if timeouts.Response > 0 {
		p.Timeouts = append(p.Timeouts, exchange.Timeout{After: timeouts.Response, Cause: exchange.ErrResponseTimeout, Stream: true,
			FromRequestEnd: true, Message: "response timed out after " + timeouts.Response.String()})
	}
	if timeouts.Idle > 0 {
		p.Timeouts = append(p.Timeouts, exchange.Timeout{After: timeouts.Idle, Cause: exchange.ErrIdleTimeout, Stream: true,
			Message: "stream idle for " + timeouts.Idle.String()})
	}
	if retry != nil {
		p.Retry = x
		p.MaxRetries = retry.Limit()
		p.BodyLimit = retry.BodyLimit()
		p.TryTimeout = retry.Timeout
	}
	if rt.budget != nil && (retry != nil || rt.hedge != nil) {
		// A request's answer earns budget on a route that spends it, by
		// retries or by hedges, which the same budget bounds; as in a
		// ServiceProfile's budget, an answer not retried deposits, a
		// retry withdraws, and a request given up before its answer
		// deposits nothing.
		p.Budget = rt.budget
	}
	resp, err := exchange.RoundTrip(attemptFunc(x.attempt), req, p)
	var be *backendError
	if err != nil && errors.As(err, &be) {
		// The balancer's own answer (fail-fast, load shed) goes to the
		// caller as it made it: a 503 with l5d-proxy-error.
		return be.resp, nil
	}
	return resp, err
}

// backendError is a balancer's answer that it sent no request (fail-fast,
// load shed): an error to the exchange, so that it is retried or not as
// such and labelled FAIL_FAST or LOAD_SHED, and the balancer's response for
// the caller.
type backendError struct {
	err  error
	resp *http.Response
}

func (e *backendError) Error() string  { return e.err.Error() }
func (e *backendError) Unwrap() error  { return e.err }
func (e *backendError) FailFast() bool { return errors.Is(e.err, balancer.ErrFailFast) }
func (e *backendError) LoadShed() bool { return errors.Is(e.err, balancer.ErrLoadShed) }

type attemptFunc func(*http.Request) (*http.Response, error)

func (f attemptFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// policyExchange is one logical request of a policy route: the retry
// strategy and the recorder of its exchange, and the attempt that applies
// the filters and picks the backend.
type policyExchange struct {
	r     *Router
	rt    *routeTarget
	base  http.RoundTripper
	grpc  bool
	retry *policy.Retry
	match policy.Match
	// backend is the series of the attempt in flight.
	backend *metrics.BackendTarget
	start   time.Time
	// mirrored is set once the route's mirrors had their copy.
	mirrored bool
	// ctx is the logical request's context, whose span the mirrors'
	// copies are traced under, as its attempts are.
	ctx context.Context
}

// attempt sends one attempt: the rule's filters, a backend, its filters.
func (x *policyExchange) attempt(req *http.Request) (*http.Response, error) {
	route := x.rt.route
	x.start = time.Now()
	x.backend = nil // a rule filter's answer has no backend series
	var respMods []*policy.HeaderModifier
	req, resp := x.filter(req, route.Filters, &respMods)
	if resp != nil {
		return resp, nil
	}
	i := x.pick()
	if i < 0 {
		x.backend = x.rt.noBackend()
		x.backend.Request(req.Context())
		closeReqBody(req)
		msg := "no backends for this route"
		if len(route.Backends.Backends) > 0 {
			msg = "every backend of this route has weight 0"
		}
		return proxyerr.Response(req, http.StatusInternalServerError, msg), nil
	}
	if mr := x.rt.mirror; mr != nil && !x.mirrored {
		// Once per request, not per retry: the copy is the request as
		// the rule's filters left it.
		x.mirrored = true
		req = mr.start(x, req)
	}
	rb := &route.Backends.Backends[i]
	if meshtrace.Enabled(req.Context()) {
		meshtrace.SetAttributes(req.Context(), x.rt.traced().backends[i]...)
	}
	x.backend = x.rt.metrics().backends[i]
	x.backend.Request(req.Context())
	if req, resp = x.filter(req, rb.Filters, &respMods); resp != nil {
		return resp, nil
	}
	ctx := req.Context()
	if bc := x.rt.balancing[i]; bc != nil {
		ctx = balancer.WithBackendConfig(ctx, bc)
	}
	if f := rb.Backend.Forward; f != nil {
		ctx = balancer.WithForward(ctx, f)
	} else {
		ctx = balancer.WithConcrete(ctx)
	}
	out := req.Clone(ctx)
	out.Body, out.GetBody = req.Body, req.GetBody
	u := *req.URL
	out.URL = &u
	if out.Host == "" {
		// The backend goes in the URL's host; the Host keeps the
		// authority the caller sent.
		out.Host = req.URL.Host
	}
	switch b := rb.Backend; {
	case b.Balancer != nil:
		out.URL.Host = b.Balancer.Authority
	case b.Forward != nil:
		out.URL.Host = b.Forward.Addr.String()
	default:
		closeReqBody(req)
		return proxyerr.Response(req, http.StatusInternalServerError, "backend has no destination"), nil
	}
	if out.URL.Scheme == "" {
		out.URL.Scheme = "http"
	}
	var err error
	if h := x.rt.hedge; h != nil && rb.Backend.Balancer != nil {
		resp, err = h.roundTrip(x.base, out)
	} else {
		resp, err = x.base.RoundTrip(out)
	}
	if err == nil {
		if berr := balancer.ResponseError(resp); berr != nil {
			return nil, &backendError{err: berr, resp: resp}
		}
		for _, m := range respMods {
			m.Apply(resp.Header)
		}
	}
	return resp, err
}

// filter applies filters to req: header modifiers edit a copy of its
// headers (response modifiers are collected for the response); a redirect
// or a failure injector that fires answers at once.
func (x *policyExchange) filter(req *http.Request, fs []policy.Filter, respMods *[]*policy.HeaderModifier) (*http.Request, *http.Response) {
	cloned := false
	for _, f := range fs {
		switch {
		case f.RequestHeaders != nil:
			if !cloned {
				body, getBody := req.Body, req.GetBody
				req = req.Clone(req.Context())
				req.Body, req.GetBody = body, getBody
				cloned = true
			}
			f.RequestHeaders.Apply(req.Header)
		case f.ResponseHeaders != nil:
			*respMods = append(*respMods, f.ResponseHeaders)
		case f.Redirect != nil:
			loc, same, err := f.Redirect.Location(req, x.match)
			switch {
			case err != nil:
				closeReqBody(req)
				return req, proxyerr.Response(req, http.StatusInternalServerError, err.Error())
			case same:
				continue // nothing to redirect to
			}
			closeReqBody(req)
			resp := proxyerr.Response(req, f.Redirect.StatusCode(), "redirected")
			resp.Header.Del(proxyerr.Header)
			resp.Header.Set("Location", loc)
			return req, resp
		case f.FailureInjector != nil:
			if x.fires(f.FailureInjector.Ratio) {
				closeReqBody(req)
				return req, proxyerr.Response(req, f.FailureInjector.Status, f.FailureInjector.Message)
			}
		case f.GRPCFailureInjector != nil:
			if x.fires(f.GRPCFailureInjector.Ratio) {
				closeReqBody(req)
				resp := proxyerr.Response(req, http.StatusOK, f.GRPCFailureInjector.Message)
				resp.Header.Del(proxyerr.Header)
				resp.Header.Set("Content-Type", "application/grpc")
				resp.Header.Set("Grpc-Status", strconv.Itoa(int(f.GRPCFailureInjector.Code)))
				resp.Header.Set("Grpc-Message", f.GRPCFailureInjector.Message)
				return req, resp
			}
		}
	}
	return req, nil
}

func (x *policyExchange) random() float64 {
	if x.r.cfg.rand != nil {
		return x.r.cfg.rand()
	}
	return rand.Float64()
}

func (x *policyExchange) fires(r policy.Ratio) bool {
	p := r.Probability()
	return p >= 1 || p > 0 && x.random() < p
}

// pick returns the index of the backend of this attempt, -1 for none.
func (x *policyExchange) pick() int {
	d := &x.rt.route.Backends
	switch {
	case len(d.Backends) == 0 || d.Kind == policy.DistributionEmpty:
		return -1
	case d.Kind == policy.DistributionRandomAvailable && x.rt.total == 0:
		// A backend of weight 0 takes no traffic (the Gateway API's
		// backendRef weight), even when it is the only one.
		return -1
	case len(d.Backends) == 1:
		return 0
	case d.Kind == policy.DistributionFirstAvailable:
		// The first backend that may take the request: a balancer backend
		// none of whose endpoints is in rotation (all tripped, or failing
		// fast) is passed over while another is ready.
		bal := x.r.cfg.balancer
		if bal == nil {
			return 0
		}
		for i, b := range d.Backends {
			if b.Backend.Balancer == nil || bal.ReadyWith(b.Backend.Balancer.Authority, x.rt.balancing[i]) {
				return i
			}
		}
		return 0
	}
	// Random-available: at random by weight among the backends that may
	// take the request, as linkerd2-proxy's distribute picks (a balancer
	// backend with no endpoint in rotation is passed over while another is
	// ready); when none is ready, among them all, so that the pick queues
	// and fails fast as its balancer says. Readiness is read once per
	// backend (the first 64 of a route; past them, no backend is passed
	// over), so that both passes agree.
	total := x.rt.total
	var down uint64 // bit i: backend i has no endpoint in rotation
	if bal := x.r.cfg.balancer; bal != nil && len(d.Backends) <= 64 {
		var ready uint64
		for i, b := range d.Backends {
			switch {
			case b.Weight == 0:
			case x.available(bal, i):
				ready += uint64(b.Weight)
			default:
				down |= 1 << i
			}
		}
		if ready > 0 {
			total = ready
		} else {
			down = 0
		}
	}
	n := uint64(x.random() * float64(total))
	last := -1
	for i, b := range d.Backends {
		if b.Weight == 0 || i < 64 && down&(1<<i) != 0 {
			continue
		}
		if n < uint64(b.Weight) {
			return i
		}
		n -= uint64(b.Weight)
		last = i
	}
	return last // only reached through rounding: the last weighted backend
}

// available reports whether backend i of the route may take a request: it
// is not a balancer, or its balancer has an endpoint in rotation.
func (x *policyExchange) available(bal *balancer.Balancer, i int) bool {
	b := &x.rt.route.Backends.Backends[i]
	return b.Backend.Balancer == nil || bal.ReadyWith(b.Backend.Balancer.Authority, x.rt.balancing[i])
}

// Retryable implements exchange.Retry. A response is retried when its
// gRPC status is among the retry's codes or its HTTP status in the
// retry's ranges, whatever the route's kind, as in Linkerd's proxy: an
// HTTPRoute's ranges retry a gRPC call answered 503.
func (x *policyExchange) Retryable(resp *http.Response, class classify.Class, err error) bool {
	if resp != nil {
		return class.GRPCStatus >= 0 && x.retry.RetryableCode(codes.Code(class.GRPCStatus)) ||
			x.retry.RetryableStatus(resp.StatusCode)
	}
	var ls LoadShed
	if errors.As(err, &ls) && ls.LoadShed() {
		return false
	}
	var ff FailFast
	return errors.Is(err, exchange.ErrTryTimeout) || errors.As(err, &ff) && ff.FailFast() ||
		class.Error == "h2(REFUSED_STREAM)"
}

// retriable reports whether the final outcome of a retried request is
// one the policy would retry: then the retries did not succeed.
func (x *policyExchange) retriable(o exchange.Outcome) bool {
	if x.grpc && o.Class.GRPCStatus < 0 {
		return true // a call without a status did not succeed
	}
	return o.Class.GRPCStatus >= 0 && x.retry.RetryableCode(codes.Code(o.Class.GRPCStatus)) ||
		x.retry.RetryableStatus(o.Status)
}

// Allow implements exchange.Retry: the count, then the budget, then the
// backoff.
func (x *policyExchange) Allow(ctx context.Context, retries int) bool {
	m := x.rt.metrics().route
	if retries >= x.retry.Limit() {
		m.LimitExceeded(ctx)
		return false
	}
	if x.rt.budget != nil && !x.rt.budget.Withdraw() {
		m.Overflow(ctx)
		return false
	}
	m.Retry(ctx)
	return x.r.cfg.wait(ctx, x.retry.BackoffPolicy().Delay(retries))
}

// Attempt implements exchange.Recorder; the backend's request is counted
// once the attempt picked it.
func (x *policyExchange) Attempt(context.Context) {}

// AttemptDone implements exchange.Recorder. An attempt the caller gave up
// before its response head has no backend response (its request stays
// counted), as in Linkerd's proxy.
func (x *policyExchange) AttemptDone(ctx context.Context, o exchange.Outcome, _ time.Time) {
	if x.backend != nil && !o.Unanswered(ctx) {
		x.backend.Done(ctx, x.status(ctx, o), x.start)
	}
}

// Done implements exchange.Recorder. A request the caller gave up before
// its response head has no status and no duration, as in Linkerd's proxy.
func (x *policyExchange) Done(ctx context.Context, o exchange.Outcome, start time.Time) {
	st := x.status(ctx, o)
	unanswered := o.Unanswered(ctx)
	if !unanswered {
		x.rt.metrics().route.Done(ctx, st, start)
	}
	if meshtrace.Enabled(ctx) {
		meshtrace.Classified(ctx, st.Error == "" && !o.Class.Failure, st.Error, o.Retries)
	}
	if !unanswered && o.Retries > 0 && st.Error == "" && !x.retriable(o) {
		x.rt.metrics().route.RetrySuccess(ctx)
	}
}

// status is the series labels of o, which ended under the caller's
// context ctx.
func (x *policyExchange) status(ctx context.Context, o exchange.Outcome) metrics.Status {
	if o.GaveUp(ctx) {
		// The caller dropped the response stream: the head's status with
		// the error UNKNOWN (linkerd2-proxy
		// linkerd/app/outbound/src/http/logical/policy/route/metrics/tests.rs,
		// http_ and grpc_response_body_drop_early).
		return metrics.Status{HTTP: o.Status, GRPC: o.Class.GRPCStatus, Error: "UNKNOWN"}
	}
	st := metrics.Status{HTTP: o.Status, GRPC: o.Class.GRPCStatus, Error: errorValue(o)}
	if st.Error != "" {
		// An error carries no upstream gRPC status.
		st.GRPC = -1
	}
	return st
}

// errorValue maps an outcome to Linkerd's error label values.
func errorValue(o exchange.Outcome) string {
	err := o.Err
	if err == nil {
		return ""
	}
	var ff FailFast
	var ls LoadShed
	switch {
	case errors.Is(err, exchange.ErrRequestTimeout):
		return "REQUEST_TIMEOUT"
	case errors.Is(err, exchange.ErrResponseTimeout):
		return "RESPONSE_STREAM_TIMEOUT"
	case errors.Is(err, exchange.ErrTryTimeout):
		return "RESPONSE_HEADERS_TIMEOUT"
	case errors.Is(err, exchange.ErrIdleTimeout):
		return "IDLE_TIMEOUT"
	case errors.As(err, &ff) && ff.FailFast():
		return "FAIL_FAST"
	case errors.As(err, &ls) && ls.LoadShed():
		return "LOAD_SHED"
	case errors.Is(err, context.Canceled):
		return "CANCEL"
	}
	switch o.Class.Error {
	case "h2(REFUSED_STREAM)":
		return "REFUSED"
	case "h2(ENHANCE_YOUR_CALM)":
		return "ENHANCE_YOUR_CALM"
	case "h2(CANCEL)":
		return "CANCEL"
	case "unclassified", "", "timeout":
	default:
		if strings.HasPrefix(o.Class.Error, "h2(") {
			return "RESET"
		}
	}
	if strings.Contains(err.Error(), "GOAWAY") {
		return "GO_AWAY"
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) || strings.Contains(err.Error(), "connection") {
		return "IO"
	}
	return "UNKNOWN"
}

func closeReqBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// defaultClassifier classifies the responses of policy routes: Linkerd's
// default rules (5xx, failing gRPC codes, errors).
var defaultClassifier = classify.Default()
