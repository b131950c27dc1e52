package transport

import (
	"hash/maphash"
	"net/http"
	"sync/atomic"
)

// The defaults of an [H2Pool].
const (
	// DefaultStreamsPerConn is how many requests may wait for their
	// response on one HTTP/2 connection to a peer before the pool sends
	// the next ones on a further connection to it.
	//
	// It is a threshold on the connection's read and write loops, not on
	// the peer's stream limit (1,000 for inmesh's inbound listener): one
	// connection is served by one read loop and one frame-writing loop on
	// each side, which handle the frames of all its streams in turn. With
	// 64 concurrent requests on a 2-core machine, two connections carried
	// about 12% more requests per second than one; 4 connections did no
	// better than 2.
	DefaultStreamsPerConn = 8
	// DefaultConnsPerPeer caps the HTTP/2 connections of an [H2Pool] to
	// one peer. Past DefaultStreamsPerConn x DefaultConnsPerPeer requests
	// in flight, each goes on the less busy connection.
	DefaultConnsPerPeer = 2
)

// stripes is the number of counter sets requests are counted in, by a
// hash of their peer's address; peers that share a stripe count each
// other's requests. The pool keeps no state per peer, so it stays the
// same size however many peers it talks to.
const stripes = 64

// H2Pool is an HTTP/2 transport without TLS (prior knowledge) that keeps
// up to [DefaultConnsPerPeer] connections per peer and opens a further one
// only when [DefaultStreamsPerConn] requests already wait for their
// response on each connection it has, and the first connection has
// answered: a cold burst of requests still shares one connection (each
// connection is one of the pool's [H2] transports, whose dials to a peer
// are never made in parallel). This is how net/http's own HTTP/2
// transport behaves past a peer's stream limit, with a lower threshold.
type H2Pool struct {
	conns []*http.Transport
	limit int32
	seed  maphash.Seed
	lanes [stripes]lane
}

type lane struct {
	warm   atomic.Bool    // the first connection answered a request
	active []atomic.Int32 // requests waiting for their response, by connection
}

// NewH2Pool returns a pool of HTTP/2 transports made by [H2] with the
// bounds l, [DefaultConnsPerPeer] connections per peer at most, each
// taking [DefaultStreamsPerConn] requests before the next is used.
func NewH2Pool(l Limits) *H2Pool { return NewH2PoolSize(l, DefaultConnsPerPeer, DefaultStreamsPerConn) }

// NewH2PoolSize is [NewH2Pool] with conns connections per peer at most
// (at least 1), each taking streams requests (at least 1) before the next
// is used.
func NewH2PoolSize(l Limits, conns, streams int) *H2Pool {
	conns, streams = max(conns, 1), max(streams, 1)
	p := &H2Pool{conns: make([]*http.Transport, conns), limit: int32(streams), seed: maphash.MakeSeed()}
	for i := range p.conns {
		p.conns[i] = H2(l)
	}
	for i := range p.lanes {
		p.lanes[i].active = make([]atomic.Int32, conns)
	}
	return p
}

// Transports returns the pool's transports, one per connection to a peer,
// for a caller to set their dialer or timeouts before the first request.
func (p *H2Pool) Transports() []*http.Transport { return p.conns }

// RoundTrip implements http.RoundTripper.
func (p *H2Pool) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(p.conns) == 1 {
		return p.conns[0].RoundTrip(r)
	}
	ln := &p.lanes[maphash.String(p.seed, r.URL.Host)%stripes]
	i, least := 0, ln.active[0].Load()
	if least >= p.limit && ln.warm.Load() {
		for j := 1; j < len(ln.active) && least >= p.limit; j++ {
			if n := ln.active[j].Load(); n < least {
				i, least = j, n
			}
		}
	}
	ln.active[i].Add(1)
	resp, err := p.conns[i].RoundTrip(r)
	ln.active[i].Add(-1)
	if i == 0 && err == nil && !ln.warm.Load() {
		ln.warm.Store(true)
	}
	return resp, err
}

// CloseIdleConnections closes the idle connections of every transport of
// the pool.
func (p *H2Pool) CloseIdleConnections() {
	for _, t := range p.conns {
		t.CloseIdleConnections()
	}
}
