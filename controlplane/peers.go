package controlplane

import (
	"context"
	"fmt"
	"sync"
)

// The bounds of what one peer (one verified mTLS identity, else one IP
// address) can make a Server hold through its watch APIs, unless
// [WithMaxStreamsPerPeer] or [WithWatchesPerPeer] set others. Replicas of
// one workload share an identity, and processes behind one address share
// it too: a fleet of many replicas of one service account needs the bounds
// raised.
const (
	// DefaultMaxStreamsPerPeer bounds the open Linkerd streams (Get,
	// GetProfile, OutboundPolicies.Watch, InboundServerPolicies.WatchPort)
	// of one peer: three kinds for each of 10,000 targets, the watch
	// bound package destination's client aims at, with that client's
	// headroom: as many as one Watches stream's subscriptions.
	DefaultMaxStreamsPerPeer = DefaultMaxSubscriptions
	// DefaultMaxWatchesStreamsPerPeer bounds the open streams of the
	// Watches service of one peer; a client opens one.
	DefaultMaxWatchesStreamsPerPeer = 64
	// DefaultMaxSubscriptionsPerPeer bounds the open subscriptions of
	// one peer over all its Watches streams: four clients at
	// [DefaultMaxSubscriptions] each.
	DefaultMaxSubscriptionsPerPeer = 4 * DefaultMaxSubscriptions
)

// The reasons of stream_refused_total.
const (
	// RefusedPeerStreams: a Linkerd stream of a peer at its bound of
	// open streams ([WithMaxStreamsPerPeer]).
	RefusedPeerStreams = "peer_streams"
	// RefusedPeerWatches: a Watches stream of a peer at its bound of open
	// Watches streams ([WithWatchesPerPeer]).
	RefusedPeerWatches = "peer_watches"
	// RefusedPeerSubscriptions: a subscription of a peer at its bound of
	// open subscriptions ([WithWatchesPerPeer]).
	RefusedPeerSubscriptions = "peer_subscriptions"
	// RefusedStreamSubscriptions: a subscription of a Watches stream at
	// its bound ([WithMaxSubscriptions]).
	RefusedStreamSubscriptions = "stream_subscriptions"
)

// WithMaxStreamsPerPeer bounds the open Linkerd streams (Get, GetProfile,
// OutboundPolicies.Watch, InboundServerPolicies.WatchPort) of one peer,
// its verified mTLS identity or else its IP address (default
// [DefaultMaxStreamsPerPeer]): past it a new stream ends at once with
// ResourceExhausted, and the peer's open streams go on. n <= 0 changes
// nothing.
func WithMaxStreamsPerPeer(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxStreamsPerPeer = n
		}
	})
}

// WithWatchesPerPeer bounds the open streams of the Watches service of one
// peer, its verified mTLS identity or else its IP address, and their
// subscriptions all together (defaults [DefaultMaxWatchesStreamsPerPeer]
// and [DefaultMaxSubscriptionsPerPeer]): past the first a new stream ends
// at once with ResourceExhausted; past the second a new subscription ends
// so, and the stream and its other subscriptions go on. A value <= 0 keeps
// its default.
func WithWatchesPerPeer(streams, subscriptions int) Option {
	return optionFunc(func(c *config) {
		if streams > 0 {
			c.maxWatchesPerPeer = streams
		}
		if subscriptions > 0 {
			c.maxSubscriptionsPerPeer = subscriptions
		}
	})
}

// peerID is the peer a bound per peer counts a caller as.
type peerID struct {
	key      string // the identity, or "ip " and the address
	verified bool
}

// peerOf returns the caller's peer: its verified mTLS identity, else its
// IP address.
func peerOf(ctx context.Context) peerID {
	if id, ok := callerOf(ctx); ok {
		return peerID{key: id, verified: true}
	}
	return peerID{key: "ip " + peerHost(ctx)}
}

func (p peerID) String() string {
	if p.verified {
		return fmt.Sprintf("identity %q", p.key)
	}
	return "address " + p.key[len("ip "):]
}

// peerCounts counts what each peer holds of one resource against a bound.
// It is safe for concurrent use.
type peerCounts struct {
	max  int
	mu   sync.Mutex
	held map[string]int // by peerID.key; a peer holding none is absent
}

func newPeerCounts(max int) *peerCounts {
	return &peerCounts{max: max, held: make(map[string]int)}
}

// acquire takes one for peer, unless it holds the bound already.
func (c *peerCounts) acquire(peer string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[peer] >= c.max {
		return false
	}
	c.held[peer]++
	return true
}

// release gives back n that peer took.
func (c *peerCounts) release(peer string, n int) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[peer] -= n; c.held[peer] <= 0 {
		delete(c.held, peer)
	}
}
