package hedge

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The latency histogram: buckets growing by a quarter from 50µs (about
// 63 of them up to a minute), over two windows of latencyWindow each, so
// that the percentile follows the route as its latency changes.
const (
	firstBound    = 50 * time.Microsecond
	growth        = 1.25
	latencyWindow = 10 * time.Second
)

var bounds = func() []time.Duration {
	var out []time.Duration
	for b := float64(firstBound); b < float64(time.Minute); b *= growth {
		out = append(out, time.Duration(b))
	}
	return append(out, time.Minute)
}()

// Burst is how many hedges a route may send at once beyond what its
// requests earned; a new route starts with one, so that the first slow
// request of a fresh process may be hedged.
const Burst = 10

// State is the running hedging state of one route: its policy, the
// latency it observed, the share of extra load it has left, and counters
// for explanations. It is safe for concurrent use.
type State struct {
	policy Policy
	share  float64
	now    func() time.Time

	mu      sync.Mutex
	tokens  float64
	cur     []uint64 // the window being filled
	prev    []uint64 // the window before it
	curN    uint64
	prevN   uint64
	rotated time.Time

	requests, sent, won, refused atomic.Uint64
}

// NewState returns the state of a route hedged by p (which should be
// valid; out-of-range fields are clamped).
func NewState(p Policy) *State {
	return newState(p, time.Now)
}

func newState(p Policy, now func() time.Time) *State {
	s := &State{policy: p, share: math.Min(1, p.ExtraLoad()), now: now, tokens: 1,
		cur: make([]uint64, len(bounds)), prev: make([]uint64, len(bounds)), rotated: now()}
	return s
}

// Policy returns the route's policy.
func (s *State) Policy() Policy { return s.policy }

// Eligible reports whether a request of method with a body of
// contentLength bytes (-1: unknown; 0: none) may be hedged when its body
// can be sent twice within limit.
func (s *State) Eligible(method string, contentLength, limit int64) bool {
	if !s.policy.Idempotent && !IdempotentMethod(method) {
		return false
	}
	return contentLength >= 0 && contentLength <= limit
}

// Request counts one request of the route that may be hedged: it earns its
// share of a hedge. It returns the delay after which it is hedged, and
// false when the route has not yet learnt its percentile.
func (s *State) Request() (time.Duration, bool) {
	s.requests.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens = math.Min(Burst, s.tokens+s.share)
	return s.delayLocked()
}

// Delay returns the delay requests are hedged after now, false while a
// percentile is not learnt yet.
func (s *State) Delay() (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.delayLocked()
}

func (s *State) delayLocked() (time.Duration, bool) {
	if s.policy.Percentile <= 0 {
		return s.policy.Delay, s.policy.Delay > 0
	}
	s.rotateLocked()
	n := s.curN + s.prevN
	if n < DefaultMinSamples {
		return 0, false
	}
	rank := uint64(math.Ceil(float64(n) * s.policy.Percentile / 100))
	var seen uint64
	for i := range bounds {
		seen += s.cur[i] + s.prev[i]
		if seen >= rank {
			return bounds[i], true
		}
	}
	return bounds[len(bounds)-1], true
}

// Spend takes one hedge from the share of extra load; false (counted as
// refused) when none is left.
func (s *State) Spend() bool {
	s.mu.Lock()
	ok := s.tokens >= 1
	if ok {
		s.tokens--
	}
	s.mu.Unlock()
	if !ok {
		s.refused.Add(1)
	}
	return ok
}

// Refund gives back a hedge that was spent but not sent (no other
// endpoint could take it, or the retry budget refused it).
func (s *State) Refund() {
	s.mu.Lock()
	s.tokens = math.Min(Burst, s.tokens+1)
	s.mu.Unlock()
}

// Sent counts a hedge sent; Won one whose answer was the one delivered.
func (s *State) Sent() { s.sent.Add(1) }

// Won: see [State.Sent].
func (s *State) Won() { s.won.Add(1) }

// Observe records the latency of one attempt (to its response head) of
// the route; a percentile delay is learnt from them.
func (s *State) Observe(d time.Duration) {
	if s.policy.Percentile <= 0 {
		return
	}
	i := 0
	for i < len(bounds)-1 && d > bounds[i] {
		i++
	}
	s.mu.Lock()
	s.rotateLocked()
	s.cur[i]++
	s.curN++
	s.mu.Unlock()
}

func (s *State) rotateLocked() {
	now := s.now()
	switch age := now.Sub(s.rotated); {
	case age < latencyWindow:
		return
	case age < 2*latencyWindow:
		s.cur, s.prev = s.prev, s.cur
		s.prevN, s.curN = s.curN, 0
	default:
		clear(s.prev)
		s.prevN, s.curN = 0, 0
	}
	clear(s.cur)
	s.rotated = now
}

// Stats is what a State has done, for explanations.
type Stats struct {
	// Delay is the delay in force; Learning is true while a percentile
	// delay has too few samples (no request is hedged).
	Delay    time.Duration
	Learning bool
	// Samples is the number of latencies in the histogram.
	Samples uint64
	// Requests counts the requests that could be hedged, Sent the hedges
	// sent, Won those whose answer was delivered, Refused those the share
	// of extra load did not allow.
	Requests, Sent, Won, Refused uint64
	// Tokens is the number of hedges the route may send now.
	Tokens float64
}

// Stats returns the state's figures.
func (s *State) Stats() Stats {
	s.mu.Lock()
	d, ok := s.delayLocked()
	st := Stats{Delay: d, Learning: !ok, Samples: s.curN + s.prevN, Tokens: s.tokens}
	s.mu.Unlock()
	st.Requests, st.Sent, st.Won, st.Refused = s.requests.Load(), s.sent.Load(), s.won.Load(), s.refused.Load()
	return st
}
