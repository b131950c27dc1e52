package balancer

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
)

// ErrNoOtherEndpoint is the error of a request that must avoid the
// endpoints its request already tried ([WithTried] with exclude) when no
// other endpoint is in rotation: a hedge that is not sent.
var ErrNoOtherEndpoint = errors.New("balancer: no endpoint other than those already tried")

// Tried is the set of endpoints the attempts of one logical request went
// to. A balancer adds each endpoint it picks for a request whose context
// carries it ([WithTried]); a request that excludes it goes only to an
// endpoint not in it. It is safe for concurrent use.
type Tried struct {
	mu    sync.Mutex
	addrs []netip.AddrPort
}

// Len returns how many endpoints were tried.
func (t *Tried) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.addrs)
}

// Has reports whether addr was tried.
func (t *Tried) Has(addr netip.AddrPort) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, a := range t.addrs {
		if a == addr {
			return true
		}
	}
	return false
}

// Add records addr as tried.
func (t *Tried) Add(addr netip.AddrPort) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, a := range t.addrs {
		if a == addr {
			return
		}
	}
	t.addrs = append(t.addrs, addr)
}

type triedKey struct{}

type triedValue struct {
	t       *Tried
	exclude bool
}

// WithTried returns a context under which the balancer ([Balancer]'s
// transport and [Pool.PickExcluding]) records the endpoint it picks in t.
// With exclude, it picks only among the endpoints in rotation that are not
// in t, and fails the request with [ErrNoOtherEndpoint] when there is none
// (it neither queues it nor falls back to a tried endpoint).
func WithTried(ctx context.Context, t *Tried, exclude bool) context.Context {
	return context.WithValue(ctx, triedKey{}, triedValue{t, exclude})
}

// triedFrom returns the tried set of ctx and whether it is excluded.
func triedFrom(ctx context.Context) (*Tried, bool) {
	v, _ := ctx.Value(triedKey{}).(triedValue)
	return v.t, v.exclude
}

// without returns the snapshot of the endpoints of s that t does not
// hold, sharing their loads; nil when none is left. A zone-aware snapshot
// stays zone-aware while both localities keep an endpoint, so that a
// hedge or a re-sent request stays in a healthy local zone as a first
// attempt does; its picks follow the zones' spill share without moving it
// (the endpoints left are not the zone's load).
func (s *snapshot) without(t *Tried) *snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := s.filtered(t.addrs)
	if out == nil {
		return nil
	}
	if z := s.zones; z != nil {
		local, remote := z.local.filtered(t.addrs), z.remote.filtered(t.addrs)
		if local != nil && remote != nil {
			out.zones = &zoneSplit{local: local, remote: remote, conf: z.conf, state: z.state, filtered: true}
		}
	}
	return out
}

// filtered returns the snapshot of the endpoints of s not at one of
// addrs, sharing their members; nil when none is left.
func (s *snapshot) filtered(addrs []netip.AddrPort) *snapshot {
	out := &snapshot{err: s.err, exists: s.exists, health: s.health, group: s.group}
	var total uint64
	for _, e := range s.eps {
		if slices.Contains(addrs, e.Addr) {
			continue
		}
		total += uint64(max(e.Weight, 1))
		out.eps = append(out.eps, e)
		out.cum = append(out.cum, total)
	}
	if len(out.eps) == 0 {
		return nil
	}
	return out
}

// PickExcluding is [Pool.Pick] for a request whose attempts already tried
// the endpoints in t: with exclude, it chooses only among the others (ok
// false when none may take it); either way it adds its choice to t.
func (p *Pool) PickExcluding(t *Tried, exclude bool) (_ Pick, ok bool) {
	if t == nil {
		return p.Pick()
	}
	now := p.cfg.now()
	p.g.sweepOutliers(now) // a hedged call's picks all come here: they run outlier detection as Pick's do
	s := p.g.state.Load()
	if exclude {
		if s = s.without(t); s == nil {
			return Pick{}, false
		}
	}
	m, probe := s.choose(now, p.decay)
	if m == nil {
		return Pick{}, false
	}
	t.Add(m.Addr)
	m.load.pending.Add(1)
	return Pick{m: m, p: p, probe: probe, start: now}, true
}

// TriedFromContext returns the tried set a context carries ([WithTried])
// and whether its request excludes it; nil when it carries none.
func TriedFromContext(ctx context.Context) (t *Tried, exclude bool) { return triedFrom(ctx) }
