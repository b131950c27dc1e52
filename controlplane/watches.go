package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// DefaultMaxSubscriptions is the default bound on the open subscriptions of
// one stream of the Watches service (see [WithMaxSubscriptions]): what one
// client needs, a profile, an endpoint and a policy subscription for each
// of the 10,000 targets package destination's client aims to watch at
// most, and the sixteenth of headroom that client keeps above its bound
// (destination.WithMaxWatches; its default bound,
// [destination.DefaultMaxWatches], is lower). What a peer holds over all
// its streams is bounded too ([WithWatchesPerPeer]).
const DefaultMaxSubscriptions = 3 * (10000 + 10000/16)

// WithMaxSubscriptions bounds the open subscriptions of one stream of the
// Watches service (default [DefaultMaxSubscriptions]): past it a
// subscription ends at once with ResourceExhausted, and the stream and its
// other subscriptions go on. n <= 0 changes nothing.
func WithMaxSubscriptions(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxSubscriptions = n
		}
	})
}

// watchesServer serves inmesh's Watches service (proto/watches.proto): the
// watches of a client multiplexed over one stream. Each subscription is a
// feed of the Store, the same one a Linkerd stream of its kind serves, so
// that both answer alike; it costs a waiter in the Store and its feed's
// state, not a goroutine. A stream costs two goroutines: its handler, which
// sends what the dirty subscriptions have to send, and a reader of the
// client's requests.
type watchesServer struct {
	watchespb.UnimplementedWatchesServer
	s   *Server
	max int
}

// muxStream is the state of one Watches stream.
type muxStream struct {
	s    *Server
	max  int
	peer peerID

	mu    sync.Mutex
	subs  map[uint64]*muxSub
	dirty []*muxSub
	// ended are the Ended answers of subscriptions refused or ended
	// outside the handler, to send.
	ended []*watchespb.WatchResponse
	wake  chan struct{} // a signal at most: something is dirty or ended
}

// muxSub is one subscription of a Watches stream.
type muxSub struct {
	id    uint64
	kind  watchespb.Kind
	feed  feed
	w     *waiter
	dirty bool // in the stream's dirty list
	fired bool // a change of the store woke it since it was last served
}

// Watch serves one stream of the Watches service until the client ends it,
// the server shuts down, or a request is malformed (InvalidArgument).
func (ws *watchesServer) Watch(stream watchespb.Watches_WatchServer) error {
	s := ws.s
	stop, err := s.begin()
	if err != nil {
		return err
	}
	defer s.streams.Done()
	ctx := stream.Context()
	p := peerOf(ctx)
	if !s.peerWatches.acquire(p.key) {
		return s.refuse(ctx, RefusedPeerWatches, status.Errorf(codes.ResourceExhausted,
			"controlplane: %s has %d Watches streams open, the most one peer may", p, s.peerWatches.max))
	}
	defer s.peerWatches.release(p.key, 1)
	// The headers go at once: they tell the client the service is served.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	m := &muxStream{s: s, max: ws.max, peer: p, subs: make(map[uint64]*muxSub), wake: make(chan struct{}, 1)}
	defer m.releaseAll()
	// The reader ends when the stream does, just after this handler
	// returns; Shutdown waits for it too.
	s.streams.Add(1)
	readErr := make(chan error, 1)
	go func() {
		defer s.streams.Done()
		readErr <- m.read(stream)
	}()
	for {
		select {
		case <-m.wake:
		case err := <-readErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-stop:
			return s.stopErr()
		case <-ctx.Done():
			return nil
		}
		if err := m.flush(stream); err != nil {
			return err
		}
	}
}

// read applies the client's requests until the stream ends or a request
// is malformed.
func (m *muxStream) read(stream watchespb.Watches_WatchServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		switch r := req.GetRequest().(type) {
		case *watchespb.WatchRequest_Subscribe:
			if err := m.subscribe(stream.Context(), r.Subscribe); err != nil {
				return err
			}
		case *watchespb.WatchRequest_Unsubscribe:
			m.release(r.Unsubscribe.GetId())
		default:
			return status.Error(codes.InvalidArgument, "a WatchRequest needs subscribe or unsubscribe")
		}
	}
}

// subscribe opens a subscription: an id already open ends the stream; a
// kind not known, a request the Linkerd stream would refuse or one past
// the bound ends the subscription at once.
func (m *muxStream) subscribe(ctx context.Context, req *watchespb.Subscribe) error {
	id := req.GetId()
	switch req.GetKind() {
	case watchespb.Kind_PROFILE, watchespb.Kind_ENDPOINTS, watchespb.Kind_POLICY:
	default:
		m.end(id, status.Errorf(codes.InvalidArgument, "unknown kind %d", req.GetKind()))
		return nil
	}
	m.mu.Lock()
	if _, dup := m.subs[id]; dup {
		m.mu.Unlock()
		return status.Errorf(codes.InvalidArgument, "subscription %d is open already", id)
	}
	full := len(m.subs) >= m.max
	m.mu.Unlock()
	if full {
		m.end(id, m.s.refuse(ctx, RefusedStreamSubscriptions, status.Errorf(codes.ResourceExhausted,
			"this stream has %d subscriptions open, the most it may", m.max)))
		return nil
	}
	var f feed
	var err error
	switch req.GetKind() {
	case watchespb.Kind_PROFILE:
		f, err = m.s.profileFeed(orEmpty(req.GetDestination()))
	case watchespb.Kind_ENDPOINTS:
		f, err = m.s.endpointsFeed(orEmpty(req.GetDestination()))
	case watchespb.Kind_POLICY:
		spec := req.GetTrafficSpec()
		if spec == nil {
			spec = &outboundpb.TrafficSpec{}
		}
		f, err = m.s.policyFeed(spec)
	}
	if err != nil {
		m.end(id, err)
		return nil
	}
	// Taken last, so that a refused request holds nothing; given back
	// when the subscription leaves m.subs.
	if !m.s.peerSubscriptions.acquire(m.peer.key) {
		m.end(id, m.s.refuse(ctx, RefusedPeerSubscriptions, status.Errorf(codes.ResourceExhausted,
			"%s has %d subscriptions open over its Watches streams, the most one peer may", m.peer, m.s.peerSubscriptions.max)))
		return nil
	}
	sub := &muxSub{id: id, kind: req.GetKind(), feed: f}
	m.mu.Lock()
	if m.subs == nil { // the stream ended meanwhile (releaseAll)
		m.mu.Unlock()
		m.s.peerSubscriptions.release(m.peer.key, 1)
		return nil
	}
	m.subs[id] = sub
	m.mu.Unlock()
	// Registered before the first answer is computed, so that no change
	// in between is missed; outside m.mu, which fire takes under the
	// store's lock.
	w := m.s.store.subscribeFunc(func() { m.mark(sub, true) }, f.keys...)
	m.mu.Lock()
	if m.subs[id] == sub {
		sub.w = w
		w = nil
	}
	m.mu.Unlock()
	if w != nil { // unsubscribed meanwhile
		m.s.store.unsubscribe(w)
		return nil
	}
	m.mark(sub, false)
	return nil
}

func orEmpty(req *pb.GetDestination) *pb.GetDestination {
	if req == nil {
		return &pb.GetDestination{}
	}
	return req
}

// mark puts sub in the dirty list; fired says a change of the store did.
// It is called under the store's lock and never blocks.
func (m *muxStream) mark(sub *muxSub, fired bool) {
	m.mu.Lock()
	if fired {
		sub.fired = true
	}
	if !sub.dirty {
		sub.dirty = true
		m.dirty = append(m.dirty, sub)
	}
	m.mu.Unlock()
	m.signal()
}

func (m *muxStream) signal() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// end queues the Ended answer of subscription id.
func (m *muxStream) end(id uint64, err error) {
	st := status.Convert(err)
	m.mu.Lock()
	m.ended = append(m.ended, &watchespb.WatchResponse{Id: id, Answer: &watchespb.WatchResponse_Ended{
		Ended: &watchespb.Ended{Code: uint32(st.Code()), Message: st.Message()}}})
	m.mu.Unlock()
	m.signal()
}

// release closes subscription id, if open.
func (m *muxStream) release(id uint64) {
	m.mu.Lock()
	sub := m.subs[id]
	delete(m.subs, id)
	var w *waiter
	if sub != nil {
		w, sub.w = sub.w, nil
	}
	m.mu.Unlock()
	if w != nil {
		m.s.store.unsubscribe(w)
	}
	if sub != nil {
		m.s.peerSubscriptions.release(m.peer.key, 1)
	}
}

// releaseAll closes every subscription, when the stream ends.
func (m *muxStream) releaseAll() {
	m.mu.Lock()
	subs := m.subs
	m.subs = nil
	m.mu.Unlock()
	for _, sub := range subs {
		if sub.w != nil {
			m.s.store.unsubscribe(sub.w)
		}
	}
	m.s.peerSubscriptions.release(m.peer.key, len(subs))
}

// flush sends the answers of the subscriptions refused or ended, then what
// each dirty subscription has to send, in the order they became dirty.
func (m *muxStream) flush(stream watchespb.Watches_WatchServer) error {
	m.mu.Lock()
	ended := m.ended
	m.ended = nil
	m.mu.Unlock()
	for _, r := range ended {
		if err := stream.Send(r); err != nil {
			return err
		}
	}
	for {
		m.mu.Lock()
		if len(m.dirty) == 0 {
			m.dirty = nil
			m.mu.Unlock()
			return nil
		}
		sub := m.dirty[0]
		m.dirty[0] = nil
		m.dirty = m.dirty[1:]
		sub.dirty = false
		fired := sub.fired
		sub.fired = false
		open := m.subs[sub.id] == sub
		m.mu.Unlock()
		if !open {
			continue
		}
		if fired {
			m.s.wakes.Add(1)
		}
		msgs, err := sub.feed.next()
		if err != nil {
			m.release(sub.id)
			m.end(sub.id, err)
			continue
		}
		for _, msg := range msgs {
			r, err := answer(sub, msg.Message)
			if err != nil {
				return err
			}
			if err := stream.Send(r); err != nil {
				return err
			}
		}
	}
}

// answer tags msg, an answer of sub's kind, with sub's id.
func answer(sub *muxSub, msg proto.Message) (*watchespb.WatchResponse, error) {
	r := &watchespb.WatchResponse{Id: sub.id}
	switch m := msg.(type) {
	case *pb.DestinationProfile:
		r.Answer = &watchespb.WatchResponse_Profile{Profile: m}
	case *pb.Update:
		r.Answer = &watchespb.WatchResponse_Update{Update: m}
	case *outboundpb.OutboundPolicy:
		r.Answer = &watchespb.WatchResponse_Policy{Policy: m}
	default:
		return nil, status.Error(codes.Internal, fmt.Sprintf("no answer of kind %v is a %T", sub.kind, msg))
	}
	return r, nil
}
