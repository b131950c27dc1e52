package destination

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// muxRetry is how long a client whose control plane answered the Watches
// service Unimplemented (a Linkerd control plane) opens Linkerd's per-name
// streams before it asks for Watches again: a replica that serves it may
// have replaced the one that did not.
const muxRetry = time.Minute

// errMuxHeaders is why a Watches stream whose headers did not come within
// the first-message deadline was abandoned.
var errMuxHeaders = errors.New("destination: no headers on the Watches stream before the first-message deadline")

// mux carries a client's profile, endpoint and policy watches over one
// stream of inmesh's Watches service (proto/watches.proto) instead of one
// Linkerd stream each: a watch's session subscribes on it and receives the
// answers of its subscription as it would its own stream's messages, so
// that every behaviour of a watch (first-message deadline, not found,
// rejected, unanswered, backoff, failover) holds on both paths. The
// answers are dispatched by one reader goroutine per stream, which also
// converts them (the subscriptions' sessions run on it); a subscription
// costs no goroutine and no gRPC stream of its own. When the
// control plane answers Unimplemented, watches open Linkerd's streams for
// [muxRetry].
type mux struct {
	api     watchespb.WatchesClient
	ctx     context.Context // the client's
	timeout time.Duration   // how long the stream's headers may take
	wg      *sync.WaitGroup // the client's: counts each stream's reader and writer
	nextID  atomic.Uint64

	mu          sync.Mutex
	cur         *muxConn
	opening     chan struct{} // closed when the open under way ends
	openingWait bool          // the open under way waits for the connection
	unsupported time.Time     // until when Watches is not asked for
}

// muxConn is one Watches stream.
type muxConn struct {
	stream watchespb.Watches_WatchClient
	ctx    context.Context // the stream's
	cancel context.CancelFunc
	// out are the requests the writer has yet to send, in order; the
	// writer alone calls Send, so that a watch's goroutine never runs
	// gRPC's deep send path (its stack stays small) nor blocks on flow
	// control.
	outMu  sync.Mutex
	out    []*watchespb.WatchRequest
	outSig chan struct{}

	mu   sync.Mutex
	subs map[uint64]*muxSub
	err  error // why the stream ended; set once
}

// muxSub is one subscription, part of its watch's session: it hands its
// answers, then its end, to the session, one at a time.
type muxSub struct {
	id   uint64
	to   muxSink
	conn *muxConn // the stream it was made on; nil before

	// mu is held while to's answer or end runs; ended is set before end
	// runs, so that an end from within it (a session's end stops its
	// subscription) does nothing.
	mu    sync.Mutex
	ended atomic.Bool
}

// subscribeMux opens a subscription of kind with req (a GetDestination or
// a TrafficSpec) on the Watches stream, opening the stream when there is
// none: waiting for the connection when wait, failing at once when the
// control plane cannot be reached otherwise (see [watch.attempt]). The
// answers of kind M go to s's message, on the stream's reader, and the
// subscription's end to s's end. It returns false and no error when the
// control plane does not serve Watches: the caller opens its Linkerd
// stream. ctx bounds the wait for the stream; the subscription is s's
// muxSub, and ends with unsubscribe.
func subscribeMux[M proto.Message](ctx context.Context, m *mux, kind watchespb.Kind, req proto.Message, s sink[M], opts []grpc.CallOption) (bool, error) {
	wait := slices.Contains(opts, grpc.CallOption(waitForReady))
	for {
		c, err := m.conn(ctx, wait)
		if c == nil || err != nil {
			return false, err
		}
		err = c.subscribe(m.nextID.Add(1), kind, req, s.muxSub())
		if errors.Is(err, errMuxEnded) {
			continue // the stream ended meanwhile: open the next
		}
		if err != nil {
			return false, err
		}
		s.subscribed()
		return true, nil
	}
}

// errMuxEnded is returned by subscribe on a stream that ended.
var errMuxEnded = errors.New("destination: Watches stream ended")

// conn returns the open Watches stream, opening it when there is none;
// nil, nil when Watches is not served.
func (m *mux) conn(ctx context.Context, wait bool) (*muxConn, error) {
	for {
		m.mu.Lock()
		if time.Now().Before(m.unsupported) {
			m.mu.Unlock()
			return nil, nil
		}
		if m.cur != nil {
			c := m.cur
			m.mu.Unlock()
			return c, nil
		}
		if m.opening != nil && (wait || !m.openingWait) {
			// One open at a time: the others wait for it, but for a
			// fail-fast one, which does not wait for an open that
			// waits for the connection.
			ch := m.opening
			m.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		var ch chan struct{}
		if m.opening == nil {
			ch = make(chan struct{})
			m.opening, m.openingWait = ch, wait
		}
		m.mu.Unlock()

		c, err := m.open(ctx, wait)
		m.mu.Lock()
		if ch != nil {
			m.opening = nil
			close(ch)
		}
		switch {
		case status.Code(err) == codes.Unimplemented || errors.Is(err, errMuxHeaders):
			// Not served, or by a control plane that accepts streams and
			// does not answer: the Linkerd streams, with their
			// first-message deadline, take over.
			m.unsupported = time.Now().Add(muxRetry)
			m.mu.Unlock()
			return nil, nil
		case err != nil:
			m.mu.Unlock()
			return nil, err
		case m.cur == nil:
			m.cur = c
			m.mu.Unlock()
			m.wg.Add(2)
			go m.read(c)
			go c.write(m.wg)
			return c, nil
		default: // a fail-fast open raced another
			cur := m.cur
			m.mu.Unlock()
			c.cancel()
			return cur, nil
		}
	}
}

// open starts a Watches stream and waits for its headers, which say
// whether the control plane serves it. The stream lives with the client;
// ctx, the first subscriber's, bounds only the wait.
func (m *mux) open(ctx context.Context, wait bool) (*muxConn, error) {
	sctx, cancel := context.WithCancel(m.ctx)
	stop := context.AfterFunc(ctx, cancel)
	var opts []grpc.CallOption
	if wait {
		opts = append(opts, waitForReady)
	}
	stream, err := m.api.Watch(sctx, opts...)
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	headers := time.AfterFunc(m.timeout, cancel)
	md, err := stream.Header()
	if err == nil && md == nil {
		// The stream ended before any headers (Unimplemented comes
		// so): Recv says how.
		if _, err = stream.Recv(); err == nil {
			err = status.Error(codes.Internal, "destination: a Watches answer without headers")
		}
	}
	late := !headers.Stop()
	if !stop() || late {
		cancel()
		if late {
			return nil, errMuxHeaders
		}
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		cancel()
		// The stream was opened: its end is the control plane's answer
		// (or its connection's, as on any open stream), not a failure
		// to reach it.
		return nil, &answeredError{err}
	}
	return &muxConn{stream: stream, ctx: sctx, cancel: cancel, outSig: make(chan struct{}, 1), subs: make(map[uint64]*muxSub)}, nil
}

// read dispatches the answers of c to their subscriptions until c ends;
// then every subscription of c ends with c's error, and the next
// subscription opens a new stream.
func (m *mux) read(c *muxConn) {
	defer m.wg.Done()
	for {
		r, err := c.stream.Recv()
		if err != nil {
			m.mu.Lock()
			if m.cur == c {
				m.cur = nil
			}
			if status.Code(err) == codes.Unimplemented {
				m.unsupported = time.Now().Add(muxRetry)
			}
			m.mu.Unlock()
			c.fail(err)
			return
		}
		c.mu.Lock()
		sub := c.subs[r.GetId()]
		ended := r.GetEnded()
		if sub != nil && ended != nil {
			delete(c.subs, sub.id)
		}
		c.mu.Unlock()
		if sub == nil {
			continue // unsubscribed meanwhile
		}
		if ended != nil {
			sub.end(status.Error(codes.Code(ended.GetCode()), ended.GetMessage()))
			continue
		}
		sub.push(r)
	}
}

// fail ends c and its subscriptions with err.
func (c *muxConn) fail(err error) {
	c.cancel()
	c.mu.Lock()
	c.err = err
	subs := c.subs
	c.subs = nil
	c.mu.Unlock()
	for _, sub := range subs {
		sub.end(err)
	}
}

// muxSink is where a subscription's answers and end go: its watch's
// session (see [sink]), held as itself rather than as closures, of which
// a client would keep two for each of its thousands of watches.
type muxSink interface {
	// answer takes an answer of the Watches stream.
	answer(*watchespb.WatchResponse)
	// end takes the subscription's end; it is called once, after the
	// last answer.
	end(error)
}

// answerOf returns the message of r that a subscription of M takes, and
// whether there is one: an answer of another kind, or none, is skipped,
// as a field a Linkerd stream does not know.
func answerOf[M any](r *watchespb.WatchResponse) (M, bool) {
	var msg proto.Message
	switch a := r.GetAnswer().(type) {
	case *watchespb.WatchResponse_Profile:
		msg = a.Profile
	case *watchespb.WatchResponse_Update:
		msg = a.Update
	case *watchespb.WatchResponse_Policy:
		msg = a.Policy
	}
	m, ok := msg.(M)
	return m, ok
}

// subscribe makes sub, whose to is set, the subscription id on c.
func (c *muxConn) subscribe(id uint64, kind watchespb.Kind, req proto.Message, sub *muxSub) error {
	s := &watchespb.Subscribe{Id: id, Kind: kind}
	switch r := req.(type) {
	case *pb.GetDestination:
		s.Destination = r
	case *outboundpb.TrafficSpec:
		s.TrafficSpec = r
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return errMuxEnded
	}
	sub.id, sub.conn = id, c
	c.subs[id] = sub
	c.mu.Unlock()
	c.send(&watchespb.WatchRequest{Request: &watchespb.WatchRequest_Subscribe{Subscribe: s}})
	return nil
}

// unsubscribe closes sub when its watch no longer reads it.
func (sub *muxSub) unsubscribe() {
	c := sub.conn
	c.mu.Lock()
	open := c.err == nil && c.subs[sub.id] == sub
	if open {
		delete(c.subs, sub.id)
	}
	c.mu.Unlock()
	sub.end(status.Error(codes.Canceled, "destination: watch ended"))
	if open {
		c.send(&watchespb.WatchRequest{Request: &watchespb.WatchRequest_Unsubscribe{Unsubscribe: &watchespb.Unsubscribe{Id: sub.id}}})
	}
}

// send queues r for the writer.
func (c *muxConn) send(r *watchespb.WatchRequest) {
	c.outMu.Lock()
	c.out = append(c.out, r)
	c.outMu.Unlock()
	select {
	case c.outSig <- struct{}{}:
	default:
	}
}

// write sends the queued requests until the stream ends. An error of Send
// is the stream's end, which the reader reports to every subscription.
func (c *muxConn) write(wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		select {
		case <-c.outSig:
		case <-c.ctx.Done():
			return
		}
		c.outMu.Lock()
		out := c.out
		c.out = nil
		c.outMu.Unlock()
		for _, r := range out {
			if c.stream.Send(r) != nil {
				return
			}
		}
	}
}

// push hands r to the subscription, unless it ended.
func (s *muxSub) push(r *watchespb.WatchResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended.Load() {
		s.to.answer(r)
	}
}

// end ends s with err; the first end counts.
func (s *muxSub) end(err error) {
	if !s.ended.CompareAndSwap(false, true) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.to.end(err)
}
