package balancer

import (
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
)

// Pool is the balancing core of one endpoint set without a transport and
// without discovery: the caller says which endpoints may take requests
// ([Pool.Update]), asks for one per request ([Pool.Pick]) and reports how
// the request ended ([Pick.Done]). It is the [Balancer]'s own logic, the
// same code: power of two choices by weight over peak-EWMA load, failure
// accrual with probation and its ejection floor, load penalties. A
// transport that dials by itself (grpc-go's sub-channels, say) balances
// with it.
//
// An endpoint's load and failure-accrual state are kept by address across
// updates, also while it is left out of an update (its connection is down,
// say), until [Pool.Retain] drops it. A Pool is safe for concurrent use;
// Pick never blocks on Update.
type Pool struct {
	cfg      config
	decay    float64
	rtt      float64
	penalty  float64 // the RTT sample of a request that failed without an answer
	conf     *groupConf
	g        *group
	mu       sync.Mutex
	loads    map[netip.AddrPort]*load
	readyLen int
	// unnamed: the pool is a forward backend's (see NewForwardPool).
	unnamed bool
}

// NewPool returns a Pool balancing by the options of a [Balancer]
// ([WithPeakEWMA], [WithErrorPenalty], [WithFailureAccrual],
// [WithPenaltyPeakEWMA], [WithOutlierDetection], [WithMeshTLS]; the others mean nothing to it) and by c, a
// policy backend's configuration, over them (nil: the options alone). It
// starts with no endpoint.
func NewPool(c *BackendConfig, opts ...Option) *Pool {
	cfg := newConfig(opts)
	b := &Balancer{cfg: cfg, decay: float64(cfg.decay)}
	b.def = newGroupConf(b.defaultKey())
	conf := b.def
	if c != nil {
		conf = newGroupConf(b.keyOf(c))
	}
	p := &Pool{cfg: cfg, decay: b.decay, rtt: float64(cfg.defaultRTT), penalty: float64(cfg.penalty),
		conf: conf, loads: make(map[netip.AddrPort]*load)}
	p.g = newGroup(conf)
	p.g.publish(&snapshot{exists: true, health: conf.health(), group: p.g})
	return p
}

// NewForwardPool returns a Pool as [NewPool] does, for the endpoint of a
// forward backend (an address, without discovery): its picks' labels
// ([Pick.Labels]) record no authority label
// ([classify.Labels.WithoutAuthority]), as the [Balancer] labels a
// [WithForward] request and Linkerd's proxy a forward's, which has no
// authority.
func NewForwardPool(c *BackendConfig, opts ...Option) *Pool {
	p := NewPool(c, opts...)
	p.unnamed = true
	return p
}

// Update makes eps the endpoints picks choose among (their weights
// honoured; a zero weight counts as 1), keeping the state of each address
// seen before.
func (p *Pool) Update(eps []endpoint.Endpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.cfg.now()
	s := &snapshot{exists: true, health: p.conf.health(), group: p.g}
	var total uint64
	for _, e := range eps {
		l := p.loads[e.Addr]
		if l == nil {
			l = newLoad(p.rtt, now)
			p.loads[e.Addr] = l
		}
		labels := endpointLabels(e, p.cfg.meshTLS)
		if p.unnamed {
			labels = labels.WithoutAuthority()
		}
		s.eps = append(s.eps, &member{Endpoint: e, addr: e.Addr.String(), load: l, g: p.g, labels: labels})
		total += uint64(max(e.Weight, 1))
		s.cum = append(s.cum, total)
	}
	s.splitZones()
	p.readyLen = len(s.eps)
	p.g.publish(s)
}

// Retain drops the state of every address keep rejects: an endpoint that
// comes back later starts afresh.
func (p *Pool) Retain(keep func(netip.AddrPort) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for a := range p.loads {
		if !keep(a) {
			delete(p.loads, a)
		}
	}
}

// Len returns how many endpoints the last Update gave.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readyLen
}

// FailFast returns how long a request may wait for an endpoint of the
// pool in rotation before it fails fast: the failfast timeout of
// [WithQueue] or of the policy backend's configuration. A transport that
// queues its own requests (grpc-go's, whose picker cannot block) bounds
// their wait with it, as the [Balancer]'s queue does.
func (p *Pool) FailFast() time.Duration { return p.conf.failfast }

// Pick is one request's endpoint, from [Pool.Pick]. Its Done must be
// called exactly once.
type Pick struct {
	m     *member
	p     *Pool
	probe bool
	start int64
	// begun: FirstData took the request out of the endpoint's load.
	begun bool
}

// Pick chooses the endpoint of a request and counts the request in its
// load until the first data of its response ([Pick.FirstData]) or Done;
// ok is false when no endpoint may take it (none given, or every one
// tripped, or on probation with its probe out).
func (p *Pool) Pick() (_ Pick, ok bool) {
	now := p.cfg.now()
	p.g.sweepOutliers(now)
	m, probe := p.g.state.Load().choose(now, p.decay)
	if m == nil {
		return Pick{}, false
	}
	m.load.pending.Add(1)
	return Pick{m: m, p: p, probe: probe, start: now}, true
}

// Endpoint returns the picked endpoint; it is shared and must not be
// changed.
func (k Pick) Endpoint() *endpoint.Endpoint { return &k.m.Endpoint }

// Labels returns the metric labels of requests to the picked endpoint, as
// the [Balancer] puts them in a request's context for classify: its own
// as dst_*, and the tls labels ([WithMeshTLS] says whether the transport
// speaks mTLS to endpoints with an identity); for a [NewForwardPool]'s
// endpoint, labels without an authority.
func (k Pick) Labels() *classify.Labels { return k.m.labels }

// FirstData reports that the first data of the request's response came
// (a gRPC call's first response message): the request leaves its
// endpoint's load, and its time until now is the RTT sample, as
// Linkerd's balancer counts a request until its response's first data
// frame (hyper-balance/src/lib.rs, PendingUntilFirstData), so a long
// stream that has begun is not load. It returns the pick to call Done on,
// which then takes no second sample; failure accrual still waits for
// Done. Calling it again does nothing.
func (k Pick) FirstData() Pick {
	if k.m == nil || k.begun {
		return k
	}
	p, l := k.p, k.m.load
	l.pending.Add(-1)
	now := p.cfg.now()
	l.observe(float64(now-k.start), now, p.decay)
	k.begun = true
	return k
}

// Result is how a request ended, for [Pick.Done].
type Result struct {
	// GRPCStatus is the gRPC status code of the response, -1 for none.
	GRPCStatus int
	// HTTPStatus is the HTTP status of the response, 0 for none.
	HTTPStatus int
	// Unanswered: the request failed without a response from the
	// endpoint (a connection error); it counts as a failure and as a
	// penalty sample in the load.
	Unanswered bool
	// Canceled: the caller gave the request up before its response
	// began. The time it waited is a sample of the endpoint's load, as
	// for a response, so an endpoint too slow for its callers looks
	// slow; it is no verdict for failure accrual (a probe is given
	// back).
	Canceled bool
	// Unsent: the transport gave the pick up without sending the
	// request (it picks again); nothing is learned of the endpoint (a
	// probe is given back).
	Unsent bool
	// Dropped: the caller gave a gRPC call up after its response began,
	// before its status. It counts as a call that ended without a
	// status, a success, as Linkerd's classifier ends a response body
	// dropped early; it is no load sample.
	Dropped bool
	// TrailersOnly: the gRPC status came in the response's head (a
	// Trailers-Only answer, its content-type gRPC's), the only framing
	// whose status sets a load penalty.
	TrailersOnly bool
	// PlainHTTP: a gRPC call was answered by an HTTP response that is
	// not gRPC's (its content-type is not application/grpc), of status
	// HTTPStatus. It ended without a gRPC status, a success, as Linkerd's
	// classifier ends a gRPC response without grpc-status and the
	// [Balancer] classes a gRPC request so answered; its HTTPStatus sets
	// the load penalty as any response's does. GRPCStatus is ignored.
	PlainHTTP bool
	// RetryAfter is the Retry-After of a 429 or 503, or the
	// grpc-retry-pushback-ms of a Trailers-Only answer, 0 for none.
	RetryAfter time.Duration
}

// Done ends the request: its time is a sample of the endpoint's load
// (unless FirstData took it), and its result goes to failure accrual as the [Balancer] counts failures by
// the default rules of package classify (a gRPC call by its status alone:
// UNKNOWN or a code past 16, DEADLINE_EXCEEDED, PERMISSION_DENIED,
// INTERNAL, UNAVAILABLE, DATA_LOSS, and none for a PlainHTTP answer;
// otherwise an HTTP status from 500 to 599; no answer at all), rate limits as [Unified] counts them, and load
// penalties as the [Balancer] reads a response head (see
// [PenaltyPeakEWMA]): an HTTP status of 429, 503 or another 5xx, or the
// status of a TrailersOnly answer (HTTPStatus 0 or 200) that is
// RESOURCE_EXHAUSTED, UNAVAILABLE, UNKNOWN, DEADLINE_EXCEEDED, INTERNAL or
// DATA_LOSS; RetryAfter lengthens the penalty of a 429, a 503, a
// RESOURCE_EXHAUSTED and an UNAVAILABLE.
func (k Pick) Done(r Result) {
	if k.m == nil {
		return
	}
	p, l := k.p, k.m.load
	if !k.begun {
		l.pending.Add(-1)
	}
	now := p.cfg.now()
	if r.Unsent || r.Canceled {
		if r.Canceled && !k.begun {
			// As Linkerd's load biaser records the elapsed time of a
			// request dropped in flight (linkerd/load-biaser/src/lib.rs,
			// Handle's drop).
			l.observe(float64(now-k.start), now, p.decay)
		}
		if k.probe {
			l.release()
		}
		return
	}
	if r.Dropped {
		var o outcome
		o.classified((*classify.Classifier)(nil).GRPCCall(-1), 0)
		p.record(k, o, now)
		return
	}
	if r.Unanswered {
		l.observe(p.penalty, now, p.decay)
		p.record(k, outcome{failure: true}, now)
		return
	}
	var o outcome
	switch {
	case r.PlainHTTP:
		// A gRPC call without a status (Linkerd's GrpcOpen ended
		// without trailers): a success, whatever the HTTP status.
		o.classified((*classify.Classifier)(nil).GRPCCall(-1), r.HTTPStatus)
	case r.GRPCStatus >= 0:
		// A gRPC call: its status decides, whatever the HTTP status.
		o.classified((*classify.Classifier)(nil).GRPCCall(int64(r.GRPCStatus)), r.HTTPStatus)
	default:
		class, _ := (*classify.Classifier)(nil).Head(false, r.HTTPStatus, nil)
		o.classified(class, r.HTTPStatus)
	}
	hint := max(int64(r.RetryAfter), 0)
	switch s := r.HTTPStatus; {
	case s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable:
		o.bias(true, hint)
	case s >= 500 && s <= 599:
		o.bias(false, 0)
	case (s == 0 || s == http.StatusOK) && r.TrailersOnly && r.GRPCStatus >= 0 && !r.PlainHTTP:
		o.grpcBias(r.GRPCStatus, hint)
	}
	if !p.conf.penalize(l, o, now, p.decay) && !k.begun {
		// A penalized answer's sample is its penalty.
		l.observe(float64(now-k.start), now, p.decay)
	}
	p.record(k, o, now)
}

func (p *Pool) record(k Pick, o outcome, now int64) {
	if k.m.load.record(o, k.probe, now, p.conf.acc, k.m.group()) {
		p.g.notify()
	}
}
