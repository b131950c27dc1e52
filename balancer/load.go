package balancer

import (
	"math"
	"sync"
	"sync/atomic"
)

// load is the peak-EWMA load estimate of one endpoint. It lives as long as
// the endpoint stays in its authority's set, across updates. It is safe for
// concurrent use; its lock is held only for arithmetic.
type load struct {
	pending atomic.Int64 // requests in flight: to their first body chunk or message

	mu    sync.Mutex
	rtt   float64 // estimate in nanoseconds at stamp
	stamp int64   // clock reading of the estimate

	health health
}

func newLoad(defaultRTT float64, now int64) *load {
	return &load{rtt: defaultRTT, stamp: now}
}

// estimateLocked is the RTT estimate at now: it decays toward zero while
// no sample arrives, so an endpoint that was slow is tried again in time.
func (l *load) estimateLocked(now int64, decay float64) float64 {
	if dt := now - l.stamp; dt > 0 {
		return l.rtt * math.Exp(-float64(dt)/decay)
	}
	return l.rtt
}

// cost is the estimate times the requests in flight plus one.
func (l *load) cost(now int64, decay float64) float64 {
	l.mu.Lock()
	rtt := l.estimateLocked(now, decay)
	l.mu.Unlock()
	return rtt * float64(l.pending.Load()+1)
}

// observe folds one RTT sample (nanoseconds) into the estimate: a sample
// above the estimate replaces it at once (the peak); one below moves it by
// the weight of the time since the last sample.
func (l *load) observe(sample float64, now int64, decay float64) {
	l.mu.Lock()
	l.observeLocked(sample, now, decay)
	l.mu.Unlock()
}

func (l *load) observeLocked(sample float64, now int64, decay float64) {
	cur := l.estimateLocked(now, decay)
	if sample > cur {
		l.rtt = sample
	} else {
		w := 1.0
		if dt := now - l.stamp; dt > 0 {
			w = math.Exp(-float64(dt) / decay)
		}
		// cur already holds the decayed weight of the old estimate.
		l.rtt = cur + sample*(1-w)
	}
	if now > l.stamp {
		l.stamp = now
	}
}

// penalize records a load penalty of p nanoseconds (see
// [PenaltyPeakEWMA]) as a sample of the RTT estimate, floored at the
// estimate itself, as Linkerd's load biaser records a failure
// (linkerd/load-biaser/src/lib.rs, Handle's drop): the penalty becomes the
// estimate's new peak, fades with the estimate's decay, and faster answers
// pull it down as they pull down any slow sample. Penalties do not add
// up: a burst of 503s weighs as much as one.
func (l *load) penalize(p float64, now int64, decay float64) {
	l.mu.Lock()
	l.observeLocked(max(p, l.estimateLocked(now, decay)), now, decay)
	l.mu.Unlock()
}
