package router

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router/internal/profileroute"
	"github.com/inmesh/inmesh/tap"
	"go.opentelemetry.io/otel/metric"
)

// WithHedging hedges the requests of every policy route that sets no
// hedging of its own by p (beyond Linkerd; see [hedge.Policy]): a program
// without a control plane hedges this way, or with a policy whose rules
// carry their own. A nil or disabled policy changes nothing; an invalid
// one is ignored.
func WithHedging(p *hedge.Policy) Option {
	return optionFunc(func(c *config) {
		if p.Enabled() && p.Validate() == nil {
			cp := *p
			c.hedge = &cp
		}
	})
}

// hedger hedges the requests of one route: after the route's delay, a
// second copy of a request that is safe to send twice goes to an endpoint
// the first did not go to (the balancer excludes the endpoints the request
// tried); the first answer wins and the other attempt is cancelled, its
// body closed.
type hedger struct {
	state   *hedge.State
	metrics *metrics.HedgeTarget
	budget  *profiles.Budget // the route's retry budget, nil for none
	limit   int64            // the largest body sent twice
}

type hedgeResult struct {
	resp    *http.Response
	err     error
	hedge   bool
	cancel  context.CancelFunc
	elapsed time.Duration
}

// roundTrip sends req through base, hedged when the route and the request
// allow. base must record the endpoint it picks in the request's
// [balancer.Tried] (a balancer's transport does); a request whose first
// attempt picked no endpoint by the delay is not hedged.
func (h *hedger) roundTrip(base http.RoundTripper, req *http.Request) (*http.Response, error) {
	cl := req.ContentLength
	if req.Body == nil || req.Body == http.NoBody {
		cl = 0
	} else if cl == 0 {
		// A client request's body of unknown length (net/http's
		// ContentLength 0 with a Body): never sent twice.
		cl = -1
	}
	if !h.state.Eligible(req.Method, cl, h.limit) || req.Header.Get("Upgrade") != "" {
		return base.RoundTrip(req)
	}
	delay, ok := h.state.Request()
	if !ok {
		start := time.Now()
		resp, err := base.RoundTrip(req)
		if err == nil {
			h.state.Observe(time.Since(start))
		}
		return resp, err
	}
	// The body, if any, must be sent twice: the caller's GetBody, or a
	// copy of the (small, whole) body.
	getBody := req.GetBody
	if cl > 0 && getBody == nil {
		buf := make([]byte, cl)
		_, err := io.ReadFull(req.Body, buf)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		getBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
		b, _ := getBody()
		req = req.WithContext(req.Context())
		req.Body, req.GetBody = b, getBody
	}

	tried := new(balancer.Tried)
	results := make(chan hedgeResult, 2)
	start := time.Now()
	send := func(r *http.Request, isHedge bool, cancel context.CancelFunc) {
		// Each attempt has its span when the request is traced: the
		// first, then the hedge.
		kind, n := meshtrace.AttemptFirst, 0
		if isHedge {
			kind, n = meshtrace.AttemptHedge, 1
		}
		resp, err := meshtrace.RoundTripAttempt(base, r, kind, n)
		results <- hedgeResult{resp: resp, err: err, hedge: isHedge, cancel: cancel, elapsed: time.Since(start)}
	}
	pctx, pcancel := context.WithCancel(req.Context())
	go send(req.WithContext(balancer.WithTried(pctx, tried, false)), false, pcancel)

	timer := time.NewTimer(delay)
	select {
	case r := <-results:
		timer.Stop()
		if r.err == nil {
			h.state.Observe(r.elapsed)
		}
		return deliverHedged(r)
	case <-timer.C:
	}
	paid, ok := h.mayHedge(req, tried)
	if !ok {
		r := <-results
		if r.err == nil {
			h.state.Observe(r.elapsed)
		}
		return deliverHedged(r)
	}
	hctx, hcancel := context.WithCancel(req.Context())
	hreq := req.Clone(balancer.WithTried(hctx, tried, true))
	if cl > 0 {
		b, err := getBody()
		if err != nil {
			hcancel()
			h.refund(paid)
			r := <-results
			return deliverHedged(r)
		}
		hreq.Body = b
	}
	tap.NoteHedge(req.Context())
	go send(hreq, true, hcancel)

	var failed *hedgeResult
	for pending := 2; pending > 0; pending-- {
		r := <-results
		if r.hedge {
			if errors.Is(r.err, balancer.ErrNoOtherEndpoint) {
				h.refund(paid) // not sent: no other endpoint
			} else {
				h.sent(req.Context())
			}
		} else if r.err == nil {
			h.state.Observe(r.elapsed)
		}
		if r.err != nil && pending > 1 {
			if failed == nil && !r.hedge {
				failed = &r // the first attempt's error, if the hedge fails too
			}
			r.cancel()
			continue
		}
		if pending > 1 {
			// The other attempt loses: cancelled, its answer closed.
			if r.hedge {
				pcancel()
			} else {
				hcancel()
			}
			if r.hedge {
				// The first attempt's latency is at least this long: the
				// learnt percentile sees the tail it cut.
				h.state.Observe(r.elapsed)
			}
			go h.drain(req.Context(), results, paid)
		}
		if r.err != nil && failed != nil {
			r.cancel()
			return deliverHedged(*failed)
		}
		if r.hedge && r.err == nil {
			h.state.Won()
			h.metrics.Won(req.Context())
		}
		return deliverHedged(r)
	}
	panic("unreachable")
}

// hedgePayment is what a hedge spent: a share of extra load and, when the
// route has a retry budget, a retry of it.
type hedgePayment struct {
	retry  profiles.Withdrawal
	budget bool // retry was taken from h.budget
}

// mayHedge reports whether a hedge may be sent now: the first attempt is
// at an endpoint (so that the hedge can avoid it), the request is still
// wanted, and the share of extra load and the retry budget allow. A hedge
// that may be sent is paid for; [hedger.refund] gives back one that is
// not sent after all.
func (h *hedger) mayHedge(req *http.Request, tried *balancer.Tried) (hedgePayment, bool) {
	if tried.Len() == 0 || req.Context().Err() != nil {
		return hedgePayment{}, false
	}
	if !h.state.Spend() {
		h.metrics.Overflow(req.Context())
		return hedgePayment{}, false
	}
	if h.budget == nil {
		return hedgePayment{}, true
	}
	w, ok := h.budget.Take()
	if !ok {
		h.state.Refund()
		h.metrics.Overflow(req.Context())
		return hedgePayment{}, false
	}
	return hedgePayment{retry: w, budget: true}, true
}

// refund gives back a hedge that was paid for but never sent (no other
// endpoint to go to, or its body could not be copied): its share of extra
// load and its retry, so that neither later hedges nor retries go without
// because of it.
func (h *hedger) refund(p hedgePayment) {
	h.state.Refund()
	if p.budget {
		h.budget.Refund(p.retry)
	}
}

func (h *hedger) sent(ctx context.Context) {
	h.state.Sent()
	h.metrics.Sent(ctx)
}

// drain ends the losing attempt: its context is cancelled at once and its
// answer, when one comes, closed. A hedge that lost without being sent (the
// first attempt answered before the balancer found no other endpoint) is
// given back as in roundTrip.
func (h *hedger) drain(ctx context.Context, results <-chan hedgeResult, paid hedgePayment) {
	r := <-results
	r.cancel()
	if r.hedge {
		if errors.Is(r.err, balancer.ErrNoOtherEndpoint) {
			h.refund(paid)
		} else {
			h.sent(ctx)
		}
	}
	if r.resp != nil && r.resp.Body != nil {
		r.resp.Body.Close()
	}
}

// deliverHedged returns an attempt's result; its context is cancelled
// when its body ends or is closed.
func deliverHedged(r hedgeResult) (*http.Response, error) {
	if r.err != nil {
		r.cancel()
		return nil, r.err
	}
	if r.resp.Body == nil || r.resp.Body == http.NoBody {
		r.cancel()
		return r.resp, nil
	}
	r.resp.Body = &cancelBody{ReadCloser: r.resp.Body, cancel: r.cancel}
	return r.resp, nil
}

// cancelBody cancels its attempt's context when it is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// hedger returns the hedging of a policy route: its own policy, else the
// router's ([WithHedging]); nil when neither hedges.
func (r *Router) hedger(route *policy.Route, rt *routeTarget) *hedger {
	p := route.Hedge
	if !p.Enabled() {
		p = r.cfg.hedge
	}
	if !p.Enabled() {
		return nil
	}
	hedges := r.httpHedges
	if route.GRPC {
		hedges = r.grpcHedges
	}
	limit := int64(MaxRetryBodyBytes)
	if route.Retry != nil {
		limit = min(limit, route.Retry.BodyLimit())
	}
	return &hedger{state: hedge.NewState(*p), metrics: hedges.Target(rt.metrics().route), budget: rt.budget, limit: limit}
}

// profileHedger returns the hedging of a ServiceProfile route hedged by p,
// with its route_hedge_* series labelled opts, bounded by the profile's
// retry budget when it has one. Its requests go to the route's authority
// (the balancer excludes the endpoints a request tried; without a balancer
// nothing is hedged).
func (r *Router) profileHedger(p hedge.Policy, opts []metric.AddOption, budget *profiles.Budget) profileroute.Hedger {
	return &hedger{state: hedge.NewState(p), metrics: r.profHedges.TargetWith(opts), budget: budget, limit: MaxRetryBodyBytes}
}

// RoundTrip sends req through base, hedged as roundTrip says: the
// profile router's Hedger.
func (h *hedger) RoundTrip(base http.RoundTripper, req *http.Request) (*http.Response, error) {
	return h.roundTrip(base, req)
}

// HedgeInfo is the hedging of a route, as [Router.Explain] shows it.
type HedgeInfo struct {
	// Policy says when and what is hedged, in words.
	Policy string `json:"policy"`
	// Delay is the delay in force ("" while a percentile is still being
	// learnt: then nothing is hedged); Samples the latencies it is learnt
	// from.
	Delay   string `json:"delay,omitempty"`
	Samples uint64 `json:"samples,omitempty"`
	// MaxRequestBytes is the largest request body hedged.
	MaxRequestBytes int64 `json:"maxRequestBytes"`
	// Requests that could be hedged, hedges Sent and Won, hedges Refused
	// by the share of extra load; Tokens is how many may be sent now.
	Requests uint64  `json:"requests"`
	Sent     uint64  `json:"sent"`
	Won      uint64  `json:"won"`
	Refused  uint64  `json:"refused"`
	Tokens   float64 `json:"tokens"`
	// Budget says that the route's retry budget bounds hedges too.
	Budget bool `json:"budget,omitempty"`
}

func (h *hedger) explain() *HedgeInfo {
	p := h.state.Policy()
	st := h.state.Stats()
	info := &HedgeInfo{Policy: p.String(), Samples: st.Samples, MaxRequestBytes: h.limit,
		Requests: st.Requests, Sent: st.Sent, Won: st.Won, Refused: st.Refused, Tokens: st.Tokens, Budget: h.budget != nil}
	if !st.Learning {
		info.Delay = st.Delay.String()
	}
	return info
}
