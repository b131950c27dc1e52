package balancer

import (
	"context"
	"time"
)

// BackendConfig is the balancing configuration that a backend of an
// outbound policy carries for its authority (the OutboundPolicy's
// FailureAccrual and Queue): a router puts it in the context of each
// request it sends to the backend ([WithBackendConfig]), and the authority
// is balanced by it from then on, instead of by the balancer's own
// options. Its zero fields keep the balancer's options.
//
// A BackendConfig must not change once used: a router makes one per
// backend of each policy it compiles, and the balancer recognises it by
// its address, so that a request costs one pointer comparison. When a
// policy update brings a new one, the endpoints keep their health state
// (failure counts, penalties) under the new configuration.
type BackendConfig struct {
	// FailureAccrual takes failing endpoints out of rotation; nil keeps the
	// balancer's ([WithFailureAccrual]).
	FailureAccrual *FailureAccrual
	// QueueCapacity and FailFast configure the queue as [WithQueue] does;
	// <= 0 keeps the balancer's.
	QueueCapacity int
	FailFast      time.Duration
	// PenaltyPeakEWMA, when not nil, adds load penalties as
	// [WithPenaltyPeakEWMA] does (its Penalty, MaxRetryAfter and
	// PenaltyDecay; zero fields take their defaults).
	PenaltyPeakEWMA *PenaltyPeakEWMA
}

type backendConfigKey struct{}

// WithBackendConfig returns a context whose requests the balancer balances
// by c (nil: the balancer's options).
func WithBackendConfig(ctx context.Context, c *BackendConfig) context.Context {
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, backendConfigKey{}, c)
}

// groupConf is the resolved configuration of one authority.
type groupConf struct {
	src      *BackendConfig // nil: the balancer's options
	acc      *accrual
	queueCap int
	failfast time.Duration
	penalty  *PenaltyPeakEWMA
	penDecay float64
}

// defaultConf is the configuration of the balancer's options.
func (b *Balancer) defaultConf() *groupConf {
	return &groupConf{acc: b.cfg.accrual, queueCap: b.cfg.queueCap, failfast: b.cfg.failfast,
		penalty: b.cfg.penaltyEWMA, penDecay: b.penDecay}
}

// conf returns the configuration that balances g.
func (b *Balancer) conf(g *group) *groupConf {
	if g != nil {
		if c := g.conf.Load(); c != nil {
			return c
		}
	}
	return b.def
}

// configure makes c the configuration of g when it is not already.
func (b *Balancer) configure(g *group, c *BackendConfig) {
	if cur := g.conf.Load(); cur != nil && cur.src == c {
		return
	}
	gc := b.defaultConf()
	gc.src = c
	if c.FailureAccrual != nil {
		gc.acc = newAccrual(c.FailureAccrual)
	}
	if c.QueueCapacity > 0 {
		gc.queueCap = c.QueueCapacity
	}
	if c.FailFast > 0 {
		gc.failfast = c.FailFast
	}
	if p := c.PenaltyPeakEWMA; p != nil {
		q := *p
		if q.Penalty <= 0 {
			q.Penalty = DefaultLoadPenalty
		}
		if q.MaxRetryAfter <= 0 {
			q.MaxRetryAfter = DefaultMaxRetryAfter
		}
		gc.penalty, gc.penDecay = &q, b.decay
		if q.PenaltyDecay > 0 {
			gc.penDecay = float64(q.PenaltyDecay)
		}
	}
	g.conf.Store(gc)
	g.notify() // queued requests look again under the new configuration
}

// Ready reports whether a request for authority (host:port) would find an
// endpoint in rotation now. It is false only when the balancer knows the
// authority's endpoints and none may take a request: there are none, the
// name does not resolve, or every endpoint is tripped, on probation with
// its probe out, or avoided after a Retry-After. An authority the
// balancer has not seen yet, or whose first answer is still awaited, is
// ready: a request to it starts its watch. A router's first-available
// distribution uses it to pass over a backend that would fail fast.
func (b *Balancer) Ready(authority string) bool {
	a := b.table.find(authority)
	if a == nil {
		return true
	}
	s := a.state.Load()
	switch {
	case s.wait != nil:
		return true
	case s.err != nil || !s.exists || len(s.eps) == 0:
		return false
	case !s.health && !s.group.ownHealth():
		return true
	}
	return s.countAvailable(b.cfg.now()) > 0
}
