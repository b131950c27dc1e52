package transport

import (
	"net/http"
	"sync"
	"sync/atomic"
)

// DefaultMaxHosts is how many distinct hosts a [Recycling] transport sends
// to before it starts a fresh generation.
const DefaultMaxHosts = 16384

// Recycling is an HTTP/1 transport whose per-host state stays bounded
// however many distinct hosts it is asked to reach.
//
// net/http's Transport keeps a little state for every host a request ever
// waited on (its queue of waiters for an idle connection): when the dial to
// a host fails and no connection to it ever goes idle, that entry stays
// until a later request for the same host, which for a flood of distinct
// Hosts falling back to their own addresses means about 650 bytes per Host,
// forever. Recycling counts the distinct hosts of its current
// *http.Transport; at MaxHosts it replaces it with a new one (made by the
// same function) and closes the idle connections of the old one, whose
// requests in flight finish on it. A program that talks to fewer hosts
// than MaxHosts never sees a new generation; one under a flood loses its
// idle pool once every MaxHosts new hosts.
type Recycling struct {
	make     func() *http.Transport
	maxHosts int64

	cur atomic.Pointer[generation]
	mu  sync.Mutex // serialises the change of generation
}

type generation struct {
	t     *http.Transport
	hosts sync.Map // host -> struct{}
	n     atomic.Int64
	n0    int64 // the generation's number, from 0
}

// NewRecycling returns a recycling transport over the transports newT
// makes; maxHosts <= 0 means [DefaultMaxHosts].
func NewRecycling(newT func() *http.Transport, maxHosts int) *Recycling {
	if maxHosts <= 0 {
		maxHosts = DefaultMaxHosts
	}
	r := &Recycling{make: newT, maxHosts: int64(maxHosts)}
	r.cur.Store(&generation{t: newT()})
	return r
}

// RoundTrip implements http.RoundTripper.
func (r *Recycling) RoundTrip(req *http.Request) (*http.Response, error) {
	g := r.cur.Load()
	host := req.URL.Host
	if _, ok := g.hosts.Load(host); !ok {
		if _, loaded := g.hosts.LoadOrStore(host, struct{}{}); !loaded && g.n.Add(1) > r.maxHosts {
			g = r.next(g, host)
		}
	}
	return g.t.RoundTrip(req)
}

// next replaces g, whose host count ran over, with a new generation that
// starts with host, and returns the generation now in force.
func (r *Recycling) next(g *generation, host string) *generation {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.cur.Load(); cur != g {
		return cur // another request started the new generation
	}
	ng := &generation{t: r.make(), n0: g.n0 + 1}
	ng.hosts.Store(host, struct{}{})
	ng.n.Store(1)
	r.cur.Store(ng)
	g.t.CloseIdleConnections()
	return ng
}

// Transport returns the *http.Transport in use now.
func (r *Recycling) Transport() *http.Transport { return r.cur.Load().t }

// Generation returns how many times the transport was replaced.
func (r *Recycling) Generation() int64 { return r.cur.Load().n0 }

// CloseIdleConnections closes the idle connections of the transport in use.
func (r *Recycling) CloseIdleConnections() { r.cur.Load().t.CloseIdleConnections() }
