package authz

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxLimitedIdentities bounds the per-identity buckets of a rate limit;
// past it the buckets are dropped together and start again full.
const maxLimitedIdentities = 10000

// limitScope is which limit refused a request.
type limitScope uint8

const (
	limitNone limitScope = iota
	limitTotal
	limitOverride
	limitIdentity
)

// limiter is a Server's compiled rate limit. Its buckets (GCRA-like token
// buckets, burst = rate) live as long as the compiled policy, so a new
// policy starts with full buckets.
type limiter struct {
	meta        Meta
	totalRPS    uint32
	total       *rate.Limiter
	identityRPS uint32
	overrides   map[string]*override

	mu     sync.RWMutex
	byID   map[string]*rate.Limiter
	noneID *rate.Limiter // the clients without an identity
}

type override struct {
	rps uint32
	l   *rate.Limiter
}

func newBucket(rps uint32) *rate.Limiter { return rate.NewLimiter(rate.Limit(rps), int(rps)) }

func newLimiter(rl *RateLimit) (*limiter, error) {
	l := &limiter{meta: rl.Meta, totalRPS: rl.Total, identityRPS: rl.Identity}
	if rl.Total > 0 {
		l.total = newBucket(rl.Total)
	}
	if rl.Identity > 0 {
		l.byID = make(map[string]*rate.Limiter)
		l.noneID = newBucket(rl.Identity)
	}
	for i, o := range rl.Overrides {
		path := fmt.Sprintf("rateLimit.overrides[%d]", i)
		if o.RPS == 0 {
			return nil, fmt.Errorf("%s.rps: must be positive", path)
		}
		if len(o.Identities) == 0 {
			return nil, fmt.Errorf("%s.identities: at least one identity is required", path)
		}
		shared := &override{rps: o.RPS, l: newBucket(o.RPS)}
		for j, id := range o.Identities {
			if id == "" {
				return nil, fmt.Errorf("%s.identities[%d]: empty identity", path, j)
			}
			if l.overrides == nil {
				l.overrides = make(map[string]*override)
			}
			if _, dup := l.overrides[id]; !dup {
				l.overrides[id] = shared
			}
		}
	}
	return l, nil
}

// check takes one request of the client with identity id (empty: none)
// at now from the limits, in Linkerd's order: the total; then the
// client's override, if one lists it, instead of the per-identity limit;
// then the per-identity limit. A token taken at one step is not returned
// when a later step refuses. It returns the scope that refused, and its
// rate, or limitNone.
func (l *limiter) check(now time.Time, id string) (limitScope, uint32) {
	if l.total != nil && !l.total.AllowN(now, 1) {
		return limitTotal, l.totalRPS
	}
	if id != "" {
		if o := l.overrides[id]; o != nil {
			if !o.l.AllowN(now, 1) {
				return limitOverride, o.rps
			}
			return limitNone, 0
		}
	}
	if l.identityRPS == 0 {
		return limitNone, 0
	}
	if !l.bucket(id).AllowN(now, 1) {
		return limitIdentity, l.identityRPS
	}
	return limitNone, 0
}

func (l *limiter) bucket(id string) *rate.Limiter {
	if id == "" {
		return l.noneID
	}
	l.mu.RLock()
	b := l.byID[id]
	l.mu.RUnlock()
	if b != nil {
		return b
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if b = l.byID[id]; b == nil {
		if len(l.byID) >= maxLimitedIdentities {
			clear(l.byID)
		}
		b = newBucket(l.identityRPS)
		l.byID[id] = b
	}
	return b
}
