package balancer

import (
	"context"
	"time"
)

// BackendConfig is the balancing configuration that a backend of an
// outbound policy carries for its authority (the OutboundPolicy's
// FailureAccrual and Queue): a router puts it in the context of each
// request it sends to the backend ([WithBackendConfig]). Its zero fields
// keep the balancer's options.
//
// The balancer balances an authority under each configuration apart, as a
// Linkerd proxy builds one balancer per backend: the endpoints' loads,
// their failure accrual (failures in a row, penalties, probation and its
// probe) and the queue belong to one configuration, and requests under
// another neither see nor change them. Configurations equal in every field
// share that state: a policy update bringing an equal one keeps it; a
// changed one starts afresh, every endpoint ready, while requests still
// under the old one finish there (a probe in flight is answered where it
// was sent). An authority keeps the state of at most [MaxConfigurations]
// configurations, dropping the least recently used.
//
// A BackendConfig must not change once used: the balancer remembers the
// last few it saw by their address, so that a request costs a few pointer
// comparisons.
type BackendConfig struct {
	// FailureAccrual takes failing endpoints out of rotation; nil keeps the
	// balancer's ([WithFailureAccrual]).
	FailureAccrual *FailureAccrual
	// QueueCapacity and FailFast configure the queue as [WithQueue] does;
	// <= 0 keeps the balancer's.
	QueueCapacity int
	FailFast      time.Duration
	// PenaltyPeakEWMA, when not nil, adds load penalties as
	// [WithPenaltyPeakEWMA] does (its Penalty and MaxRetryAfter; zero
	// fields take their defaults). They fade with the balancer's decay.
	PenaltyPeakEWMA *PenaltyPeakEWMA
	// OutlierDetection, when not nil, ejects outliers as
	// [WithOutlierDetection] does (one with neither ejection: none), in
	// place of the balancer's.
	OutlierDetection *OutlierDetection
}

// MaxConfigurations bounds the configurations an authority is balanced
// under at once (the balancer's options aside): past it, the least
// recently used one's state is dropped.
const MaxConfigurations = 8

type backendConfigKey struct{}

// WithBackendConfig returns a context whose requests the balancer balances
// by c (nil: the balancer's options).
func WithBackendConfig(ctx context.Context, c *BackendConfig) context.Context {
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, backendConfigKey{}, c)
}

// groupConf is the resolved configuration of one group; immutable.
type groupConf struct {
	key      confKey
	acc      *accrual
	od       *outlier
	queueCap int
	failfast time.Duration
	penalty  *PenaltyPeakEWMA
	zone     zoneConf
}

// confKey is a configuration as a comparable value: the zero accrual and
// the zero penalty are none (resolved ones have positive fields).
type confKey struct {
	acc      accrual
	od       outlier
	queueCap int
	failfast time.Duration
	penalty  PenaltyPeakEWMA
	zone     zoneConf
}

// health reports whether picks under c check the endpoints' health
// (failure accrual or load penalties are on).
func (c *groupConf) health() bool { return c.acc != nil || c.penalty != nil || c.od != nil }

// newGroupConf makes the configuration of key.
func newGroupConf(k confKey) *groupConf {
	c := &groupConf{key: k, queueCap: k.queueCap, failfast: k.failfast, zone: k.zone}
	if k.acc != (accrual{}) {
		acc := k.acc
		c.acc = &acc
	}
	if k.od != (outlier{}) {
		od := k.od
		c.od = &od
	}
	if k.penalty != (PenaltyPeakEWMA{}) {
		p := k.penalty
		c.penalty = &p
	}
	return c
}

// defaultKey is the configuration of the balancer's options.
func (b *Balancer) defaultKey() confKey {
	k := confKey{queueCap: b.cfg.queueCap, failfast: b.cfg.failfast, zone: b.cfg.zone.resolved()}
	if b.cfg.accrual != nil {
		k.acc = *b.cfg.accrual
	}
	if b.cfg.outlier != nil {
		k.od = *b.cfg.outlier
	}
	if b.cfg.penaltyEWMA != nil {
		k.penalty = *b.cfg.penaltyEWMA
		k.penalty.DefaultRTT, k.penalty.Decay, k.penalty.PenaltyDecay = 0, 0, 0
	}
	return k
}

// keyOf resolves c over the balancer's options, allocating nothing.
func (b *Balancer) keyOf(c *BackendConfig) confKey {
	k := b.def.key
	if acc, ok := accrualOf(c.FailureAccrual); ok {
		k.acc = acc
	}
	if c.OutlierDetection != nil {
		k.od, _ = outlierOf(c.OutlierDetection)
	}
	if c.QueueCapacity > 0 {
		k.queueCap = c.QueueCapacity
	}
	if c.FailFast > 0 {
		k.failfast = c.FailFast
	}
	if p := c.PenaltyPeakEWMA; p != nil {
		q := *p
		// The balancer's estimate; not part of the configuration.
		// PenaltyDecay is ignored (see PenaltyPeakEWMA).
		q.DefaultRTT, q.Decay, q.PenaltyDecay = 0, 0, 0
		if q.Penalty <= 0 {
			q.Penalty = DefaultLoadPenalty
		}
		if q.MaxRetryAfter <= 0 {
			q.MaxRetryAfter = DefaultMaxRetryAfter
		}
		k.penalty = q
	}
	return k
}

// conf returns the configuration that balances g.
func (b *Balancer) conf(g *group) *groupConf {
	if g != nil {
		return g.conf
	}
	return b.def
}

// Ready reports whether a request for authority (host:port) would find an
// endpoint in rotation now. It is false only when the balancer knows the
// authority's endpoints and none may take a request: there are none, the
// name does not resolve, or every endpoint is tripped, or on probation
// with its probe out. An authority the
// balancer has not seen yet, or whose first answer is still awaited, is
// ready: a request to it starts its watch. A router's first-available
// distribution uses it to pass over a backend that would fail fast. The
// endpoints' health is that under the configuration of the authority's
// latest request (see [BackendConfig]).
func (b *Balancer) Ready(authority string) bool {
	a := b.table.find(authority)
	if a == nil {
		return true
	}
	return b.ready(a.current().state.Load(), true)
}

// ReadyWith is [Balancer.Ready] for the requests that carry c
// ([WithBackendConfig]; nil: the balancer's options): the endpoints'
// health is that under c. Under a configuration no request carried yet,
// every endpoint is ready. A router asks it for the backend it is about to
// choose.
func (b *Balancer) ReadyWith(authority string, c *BackendConfig) bool {
	a := b.table.find(authority)
	if a == nil {
		return true
	}
	if g := b.findGroup(a, c); g != nil {
		return b.ready(g.state.Load(), true)
	}
	return b.ready(a.def.state.Load(), false)
}

// ready reports whether a pick from s may find an endpoint now; health
// false: as if none were out of rotation.
func (b *Balancer) ready(s *snapshot, health bool) bool {
	switch {
	case s.wait != nil:
		return true
	case s.err != nil || !s.exists || len(s.eps) == 0:
		return false
	case !s.health || !health:
		return true
	}
	return s.countAvailable(b.cfg.now()) > 0
}

// findGroup returns the group of a that balances requests carrying c, or
// nil when none has been made; it makes none.
func (b *Balancer) findGroup(a *authority, c *BackendConfig) *group {
	if c == nil {
		return a.def
	}
	if r := a.recent.Load(); r != nil {
		for _, ref := range *r {
			if ref.src == c {
				return ref.g
			}
		}
	}
	k := b.keyOf(c)
	if k == a.def.conf.key {
		return a.def
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.groups[k]
}

// penalize applies the load penalty of c (none: nothing) for outcome o of
// a request to the endpoint of l, as linkerd2-proxy's load biaser does
// (linkerd/load-biaser/src/lib.rs, effective_rtt): a response it counts
// ([headOutcome]) records Penalty, or its Retry-After or pushback capped
// at MaxRetryAfter when that is longer, as the endpoint's RTT sample in
// place of the time it took (decay is the estimate's time constant).
// The hint lengthens the penalty and never shortens it; the endpoint
// stays in rotation, its load decaying until a pick prefers it again. It
// reports whether it recorded a penalty.
func (c *groupConf) penalize(l *load, o outcome, now int64, decay float64) bool {
	p := c.penalty
	if p == nil || !o.biased {
		return false
	}
	pen := int64(p.Penalty)
	if o.retryIn > 0 {
		pen = max(pen, min(o.retryIn, int64(p.MaxRetryAfter)))
	}
	l.penalize(float64(pen), now, decay)
	return true
}
