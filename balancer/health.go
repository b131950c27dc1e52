package balancer

import (
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/classify"
)

// Defaults of failure accrual, the queue and the load penalties (Linkerd's
// Service annotations and policy-controller defaults).
const (
	DefaultMaxFailures     = 7
	DefaultMinPenalty      = time.Second
	DefaultMaxPenalty      = time.Minute
	DefaultJitterRatio     = 0.5
	DefaultSuccessRate     = 0.8
	DefaultSuccessDecay    = 10 * time.Second
	DefaultMinRequests     = 5
	DefaultQueueCapacity   = 100
	DefaultFailfastTimeout = 3 * time.Second
	DefaultLoadPenalty     = 5 * time.Second
	DefaultMaxRetryAfter   = 300 * time.Second
)

// FailureAccrual is how endpoints are taken out of rotation when they fail,
// shaped after the OutboundPolicy's FailureAccrual so that a policy or a
// Service annotation can fill it. Exactly one of ConsecutiveFailures and
// Unified is used (Unified when both are set); neither: no accrual.
//
// A tripped endpoint gets no requests for its penalty, then it is on
// probation: exactly one probe request goes to it. A success restores it;
// a failure trips it again for a penalty grown by the Backoff, never past
// its maximum. A failure is a response the classifier of the request's
// route (package classify; the default rules without one) classifies as a
// failure, a response stream that fails, or a request that fails without
// a response (the caller's own cancellation aside). By the default rules,
// as Linkerd's: a gRPC call whose status is UNKNOWN (or a code past 16),
// DEADLINE_EXCEEDED, PERMISSION_DENIED, INTERNAL, UNAVAILABLE or
// DATA_LOSS, whatever its HTTP status; a plain HTTP request answered 500
// to 599, whatever grpc-status its response carries. A gRPC call that
// ends without a status is a success. A response whose body its caller
// closes or gives up before the end counts as it stood then, as Linkerd's
// breaker counts a response body dropped: the class of its head, a gRPC
// call still without its status a success. A request given up before its
// response is no verdict.
type FailureAccrual struct {
	ConsecutiveFailures *ConsecutiveFailures
	Unified             *Unified
	Ejection            Ejection
}

// ConsecutiveFailures trips an endpoint after MaxFailures failures in a
// row (0: [DefaultMaxFailures]).
type ConsecutiveFailures struct {
	MaxFailures uint32
	Backoff     Backoff
}

// Unified trips an endpoint when its success rate, an average that forgets
// with time constant Decay (0: [DefaultSuccessDecay]) and in which every
// response weighs at least a tenth, falls below SuccessRateThreshold (0 or
// NaN: [DefaultSuccessRate]) after at least MinRequests responses (0:
// [DefaultMinRequests]), or after MaxConsecutiveFailures failures in a row
// (0: [DefaultMaxFailures]). A rate limit that the classifier calls a
// success (a 429; a gRPC RESOURCE_EXHAUSTED, in the headers or trailers)
// lowers the success rate and fails a probe, but is no failure in a row,
// as in Linkerd's unified breaker; [ConsecutiveFailures] counts it as the
// success it is.
type Unified struct {
	SuccessRateThreshold   float64
	Decay                  time.Duration
	MinRequests            uint32
	MaxConsecutiveFailures uint32
	Backoff                Backoff
}

// Backoff is the penalty of a tripped endpoint: MinBackoff (0:
// [DefaultMinPenalty]) the first time, doubling on each failed probe up to
// MaxBackoff (0: [DefaultMaxPenalty]), each grown by a random share of up
// to JitterRatio (0 or NaN: [DefaultJitterRatio]; negative: none) and
// capped at MaxBackoff.
type Backoff struct {
	MinBackoff  time.Duration
	MaxBackoff  time.Duration
	JitterRatio float64
}

// Ejection bounds how many endpoints accrual may take out: an endpoint does
// not trip while fewer than MinReadyEndpoints others would stay ready
// (in rotation: an endpoint outlier detection ejected is not ready).
type Ejection struct {
	MinReadyEndpoints uint32
}

// accrual is a FailureAccrual with its defaults filled in.
type accrual struct {
	unified     bool
	maxFailures int
	threshold   float64
	decay       float64
	minRequests int
	minPenalty  float64
	maxPenalty  float64
	jitter      float64
	minReady    int
}

func newAccrual(fa *FailureAccrual) *accrual {
	a, ok := accrualOf(fa)
	if !ok {
		return nil
	}
	return &a
}

// accrualOf is fa with its defaults filled in; false when fa takes no
// endpoint out.
func accrualOf(fa *FailureAccrual) (accrual, bool) {
	if fa == nil || (fa.ConsecutiveFailures == nil && fa.Unified == nil) {
		return accrual{}, false
	}
	a := accrual{minReady: int(fa.Ejection.MinReadyEndpoints)}
	var bo Backoff
	if u := fa.Unified; u != nil {
		a.unified = true
		a.maxFailures = int(u.MaxConsecutiveFailures)
		a.threshold = u.SuccessRateThreshold
		if !(a.threshold > 0) { // NaN too
			a.threshold = DefaultSuccessRate
		}
		a.decay = float64(u.Decay)
		if a.decay <= 0 {
			a.decay = float64(DefaultSuccessDecay)
		}
		a.minRequests = int(u.MinRequests)
		if a.minRequests <= 0 {
			a.minRequests = DefaultMinRequests
		}
		bo = u.Backoff
	} else {
		a.maxFailures = int(fa.ConsecutiveFailures.MaxFailures)
		bo = fa.ConsecutiveFailures.Backoff
	}
	if a.maxFailures <= 0 {
		a.maxFailures = DefaultMaxFailures
	}
	a.minPenalty, a.maxPenalty, a.jitter = float64(bo.MinBackoff), float64(bo.MaxBackoff), bo.JitterRatio
	if a.minPenalty <= 0 {
		a.minPenalty = float64(DefaultMinPenalty)
	}
	if a.maxPenalty <= 0 {
		a.maxPenalty = float64(DefaultMaxPenalty)
	}
	a.maxPenalty = max(a.maxPenalty, a.minPenalty)
	switch {
	case a.jitter == 0 || math.IsNaN(a.jitter):
		a.jitter = DefaultJitterRatio
	case a.jitter < 0:
		a.jitter = 0
	}
	return a, true
}

// penalty is the penalty after n failed probes (n = 0: the first trip).
func (a *accrual) penalty(n int) float64 {
	base := a.minPenalty * math.Pow(2, float64(min(n, 62)))
	base = min(base, a.maxPenalty)
	return min(base*(1+a.jitter*rand.Float64()), a.maxPenalty)
}

// Endpoint health states.
const (
	stateReady     = "ready"
	stateTripped   = "tripped"
	stateProbation = "probation"
	stateEjected   = "ejected"
)

// group is the balancing of one authority under one configuration (the
// balancer's options, or a policy backend's): its own snapshot of the
// endpoints, whose loads carry their failure-accrual state, its queue,
// and how many of its endpoints are ready, for the ejection floor.
type group struct {
	conf   *groupConf // immutable
	state  atomic.Pointer[snapshot]
	queued atomic.Int64 // requests in the queue
	// failfast: the queue's failfast timeout passed with no endpoint in
	// rotation; requests are shed at once until one finds an endpoint.
	failfast atomic.Bool
	used     atomic.Int64 // clock reading of its last use, to drop the least recently used

	// zone is the spill controller of zone-aware balancing, nil when
	// the group is not zone-aware (most are, and a proxy holds a group
	// for each of thousands of authorities).
	zone *zoneState

	mu    sync.Mutex
	ready int           // endpoints neither tripped nor ejected by outlier detection
	wch   chan struct{} // closed when an endpoint may be back

	// Outlier detection: the clock reading its interval ends (0: not
	// started), and the lock of its sweeps.
	odNext atomic.Int64
	odMu   sync.Mutex
	// odEjected is how many endpoints the last sweep left ejected, for
	// the spans of the requests picked meanwhile.
	odEjected atomic.Int64
}

// newGroup returns a group of conf.
func newGroup(conf *groupConf) *group {
	g := &group{conf: conf}
	if conf.zone.local != "" {
		g.zone = &zoneState{}
	}
	return g
}

// publish makes s the group's snapshot; the first answer releases the
// requests waiting for one.
func (g *group) publish(s *snapshot) {
	// Between outlier sweeps, which eject and bring back endpoints of the
	// snapshot in force and keep the ready count right as they do.
	g.odMu.Lock()
	n := s.countReady() // before any request may pick from s
	g.mu.Lock()
	g.ready = n
	g.mu.Unlock()
	prev := g.state.Swap(s)
	g.odMu.Unlock()
	if prev != nil && prev.wait != nil {
		close(prev.wait)
	}
	g.notify()
}

// wake returns a channel closed at the next notify.
func (g *group) wake() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.wch == nil {
		g.wch = make(chan struct{})
	}
	return g.wch
}

// addReady changes the count of the group's endpoints in rotation, those
// neither tripped by failure accrual nor ejected by outlier detection, by
// d; nil changes nothing.
func (g *group) addReady(d int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.ready += d
	g.mu.Unlock()
}

// notify wakes the queued requests.
func (g *group) notify() {
	if g == nil {
		return
	}
	g.mu.Lock()
	if g.wch != nil {
		close(g.wch)
		g.wch = nil
	}
	g.mu.Unlock()
}

// health is the failure-accrual state of one endpoint; it lives in the
// endpoint's load, across updates, under the load's lock.
type health struct {
	tripped  bool
	probing  bool  // the probe is out
	until    int64 // tripped: clock reading its penalty ends
	failures int   // in a row
	rate     float64
	requests int
	stamp    int64
	trips    int // failed probes since the last restore
	penalty  float64

	// Outlier detection: the outcomes of the current interval, whether
	// the endpoint is ejected (since odAt) and its ejection count.
	odSucc, odFail int64
	odEjected      bool
	odAt           int64
	odMult         int
}

// available reports whether a pick may choose the endpoint at now, and
// claims the probe of an endpoint on probation (probe true). It is called
// under l.mu.
func (h *health) availableLocked(now int64) (ok, probe bool) {
	if h.odEjected {
		return false, false
	}
	if !h.tripped {
		return true, false
	}
	if h.probing || now < h.until {
		return false, false
	}
	h.probing = true
	return true, true
}

// outcome is what a response says to accrual and to the load penalties.
type outcome struct {
	failure bool
	// limited: a success of the classifier that asks its client to slow
	// down ([rateLimited]), which unified accrual counts against the
	// endpoint.
	limited bool
	// biased: a response the load penalty counts ([outcome.bias]);
	// retryIn its Retry-After or pushback that may lengthen the
	// penalty, 0: none.
	biased  bool
	retryIn int64
}

// classified sets o's verdict from class, the class of a response of HTTP
// status status.
func (o *outcome) classified(class classify.Class, status int) {
	o.failure, o.limited = class.Failure, rateLimited(class, status)
}

// rateLimited reports whether class, the class of a response of HTTP
// status status, is a success that is a rate limit: a 429 its HTTP
// status decided, or a RESOURCE_EXHAUSTED its gRPC status decided, as
// Linkerd's unified breaker reads a class
// (linkerd2-proxy linkerd/app/outbound/src/http/breaker/unified.rs,
// is_rate_limit_signal). A gRPC call that ended without a status is none,
// whatever its HTTP status.
func rateLimited(class classify.Class, status int) bool {
	switch {
	case class.Failure || class.Error != "" || class.NoGRPCStatus:
		return false
	case class.GRPCStatus >= 0:
		return class.GRPCStatus == grpcResourceExhausted
	}
	return status == http.StatusTooManyRequests
}

// record folds one outcome into h at now; probe says whether the request
// was the endpoint's probe. It returns whether an endpoint that was out of
// rotation is back (the queue may go on).
func (l *load) record(o outcome, probe bool, now int64, acc *accrual, g *group) (restored bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := &l.health
	if g != nil && g.conf.od != nil {
		h.countLocked(o.failure)
	}
	if acc == nil {
		h.probing = h.probing && !probe // a probe is given back whatever happens
		return false
	}
	if probe {
		h.probing = false
		if o.failure || acc.unified && o.limited { // a failed probe
			h.trips++
			h.penalty = acc.penalty(h.trips)
			h.until = now + int64(h.penalty)
			return false
		}
		h.tripped, h.failures, h.trips, h.penalty = false, 0, 0, 0
		h.rate, h.requests, h.stamp = 1, 0, now
		if !h.odEjected { // else it counts once outlier detection brings it back
			g.addReady(1)
		}
		return true
	}
	if h.tripped {
		return false // an answer from before the trip
	}
	if o.failure {
		h.failures++
	} else {
		h.failures = 0
	}
	trip := h.failures >= acc.maxFailures
	if acc.unified {
		w := 0.9
		if h.requests == 0 {
			h.rate, w = 1, 0.9
		} else if dt := now - h.stamp; dt > 0 {
			w = min(math.Exp(-float64(dt)/acc.decay), 0.9)
		}
		x := 1.0
		if o.failure || o.limited {
			x = 0
		}
		h.rate = h.rate*w + x*(1-w)
		h.requests++
		h.stamp = max(h.stamp, now)
		trip = trip || (h.requests >= acc.minRequests && h.rate < acc.threshold)
	}
	if !trip {
		return false
	}
	if g != nil {
		// The others that would stay in rotation: the ready count holds
		// this endpoint unless outlier detection ejected it.
		self := 1
		if h.odEjected {
			self = 0
		}
		g.mu.Lock()
		if g.ready-self < acc.minReady {
			g.mu.Unlock()
			return false // the ejection floor keeps it in rotation
		}
		g.ready -= self
		g.mu.Unlock()
	}
	h.tripped, h.trips = true, 0
	h.penalty = acc.penalty(0)
	h.until = now + int64(h.penalty)
	return false
}

// release gives back the probe of a request that ended without a verdict
// (its caller cancelled it): the next pick probes again.
func (l *load) release() {
	l.mu.Lock()
	l.health.probing = false
	l.mu.Unlock()
}

// grpcResourceExhausted is the gRPC status code RESOURCE_EXHAUSTED, a
// rate-limit signal as a 429 is.
const grpcResourceExhausted = 8

// grpcStatus reads the grpc-status of h.
func grpcStatus(h http.Header) (int, bool) {
	v := h.Get("Grpc-Status")
	if v == "" {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	return n, err == nil
}

// headOutcome reads a response head for accrual and the load penalties.
// Whether it is a failure is the class c gives it, c being the classifier
// of the request's route (nil: the default rules) and grpcReq whether the
// request is a gRPC call, as Linkerd's breaker takes the class of the
// route's response classifier (linkerd2-proxy
// linkerd/app/outbound/src/http/breaker.rs, fed by
// linkerd/http/classify/src/channel.rs). final is false when the class
// waits for the trailers ([classify.Classifier.End]).
//
// The load penalty reads the head as linkerd2-proxy's load biaser
// classifies a response (linkerd/load-biaser/src/lib.rs, failure_hint and
// effective_rtt): a 429 or a 503 sets it, lengthened by the response's
// Retry-After; any other 5xx sets it; so does a gRPC answer of HTTP 200
// whose content-type is gRPC's and whose head holds its grpc-status (a
// Trailers-Only answer): RESOURCE_EXHAUSTED and UNAVAILABLE, lengthened by
// grpc-retry-pushback-ms, and UNKNOWN, DEADLINE_EXCEEDED, INTERNAL and
// DATA_LOSS. A grpc-status in the trailers after a message, or in the head
// of a response that is not gRPC's, sets none, nor do the other codes.
func headOutcome(c *classify.Classifier, grpcReq bool, resp *http.Response, now time.Time) (o outcome, class classify.Class, final bool) {
	class, final = c.Head(grpcReq, resp.StatusCode, resp.Header)
	o.classified(class, resp.StatusCode)
	switch s := resp.StatusCode; {
	case s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable:
		o.bias(true, retryAfter(resp.Header.Get("Retry-After"), now))
	case s >= 500 && s <= 599:
		o.bias(false, 0)
	case s == http.StatusOK && classify.IsGRPC(resp.Header):
		if code, ok := grpcStatus(resp.Header); ok {
			o.grpcBias(code, int64(ParsePushback(resp.Header.Get("Grpc-Retry-Pushback-Ms"))))
		}
	}
	return o, class, final
}

// bias marks o as a response the load penalty counts, with hint (the
// Retry-After or pushback in nanoseconds, 0: none) when hinted says the
// kind of failure lets a hint lengthen the penalty.
func (o *outcome) bias(hinted bool, hint int64) {
	o.biased = true
	if hinted {
		o.retryIn = hint
	}
}

// grpcBias reads the gRPC status code of a Trailers-Only answer and its
// grpc-retry-pushback-ms in nanoseconds (0: none) for the load penalty.
func (o *outcome) grpcBias(code int, pushback int64) {
	switch code {
	case grpcResourceExhausted, grpcUnavailable:
		o.bias(true, pushback)
	case grpcUnknown, grpcDeadlineExceeded, grpcInternal, grpcDataLoss:
		o.bias(false, 0)
	}
}

// gRPC status codes that set the load penalty besides
// RESOURCE_EXHAUSTED.
const (
	grpcUnknown          = 2
	grpcDeadlineExceeded = 4
	grpcInternal         = 13
	grpcUnavailable      = 14
	grpcDataLoss         = 15
)

// ParsePushback parses a grpc-retry-pushback-ms value, a signed 32-bit
// count of milliseconds as gRFC A6 defines it, for [Result.RetryAfter]: 0
// when it is empty, invalid, negative or zero.
func ParsePushback(v string) time.Duration {
	if v == "" {
		return 0
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
	if err != nil || ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// retryAfter parses a Retry-After value (seconds or an HTTP-date) into
// nanoseconds from now; 0 when absent, invalid or past.
func retryAfter(v string, now time.Time) int64 {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return min(s, math.MaxInt64/int64(time.Second)) * int64(time.Second)
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return int64(d)
		}
	}
	return 0
}

// Errors a [Balancer] answers requests with, as a response with
// l5d-proxy-error (504 for ErrFailFast, 503 for ErrLoadShed, as Linkerd's
// proxy answers them); [ResponseError] recovers them from the response.
var (
	// ErrFailFast: no endpoint of the authority became ready within the
	// failfast timeout. A router may send the request to the next backend
	// of a first-available distribution, and may retry it.
	ErrFailFast = errors.New("FAIL_FAST")
	// ErrLoadShed: the authority's queue was full; the request was refused
	// at once. Not retryable.
	ErrLoadShed = errors.New("LOAD_SHED")
)

// errBody is the empty body of a response the balancer made itself,
// carrying why.
type errBody struct{ err error }

func (errBody) Read([]byte) (int, error) { return 0, io.EOF }
func (errBody) Close() error             { return nil }

// ResponseError returns [ErrFailFast] or [ErrLoadShed] when resp is the
// balancer's answer for that reason, else nil.
func ResponseError(resp *http.Response) error {
	if resp == nil {
		return nil
	}
	if b, ok := resp.Body.(errBody); ok {
		return b.err
	}
	return nil
}
