package meshgrpc_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
)

// callEnd is what a call's CallOptions ask grpc-go for as the call ends:
// its response header, trailer and peer, and its OnFinish callbacks.
type callEnd struct {
	header, trailer metadata.MD
	peer            peer.Peer

	mu       sync.Mutex
	finishes []codes.Code
}

// options asks for every one of them; pointers uses the options'
// pointer forms, which grpc-go honours as well.
func (e *callEnd) options(pointers bool) []grpc.CallOption {
	if pointers {
		return []grpc.CallOption{&grpc.HeaderCallOption{HeaderAddr: &e.header}, &grpc.TrailerCallOption{TrailerAddr: &e.trailer},
			&grpc.PeerCallOption{PeerAddr: &e.peer}, grpc.OnFinish(e.finished)}
	}
	return []grpc.CallOption{grpc.Header(&e.header), grpc.Trailer(&e.trailer), grpc.Peer(&e.peer), grpc.OnFinish(e.finished)}
}

func (e *callEnd) finished(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.finishes = append(e.finishes, status.Code(err))
}

// seen is what the caller has: the header's and trailer's values of key
// (key and key-trailer), the peer's address, and the codes OnFinish was
// called with.
func (e *callEnd) seen(key string) (string, string, string, []codes.Code) {
	e.mu.Lock()
	defer e.mu.Unlock()
	addr := ""
	if e.peer.Addr != nil {
		addr = e.peer.Addr.String()
	}
	return mdValue(e.header, key), mdValue(e.trailer, key+"-trailer"), addr, append([]codes.Code(nil), e.finishes...)
}

func mdValue(md metadata.MD, k string) string {
	if v := md.Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

// duel is what the endpoints of a hedged call's test share: of the two
// attempts of a call (by x-call), the one numbered winner (0: the first
// to arrive, 1: the hedge) answers once both have arrived, with a header
// and a trailer (ep, ep-trailer) naming its endpoint; the other stalls
// until it is cancelled, and then says so on cancelled.
type duel struct {
	winner    int
	mu        sync.Mutex
	arrived   map[string]int
	both      map[string]chan struct{}
	cancelled chan struct{}
}

// duelApp is one endpoint of a duel.
type duelApp struct {
	testgrpc.UnimplementedTestServiceServer
	name string
	d    *duel
}

// arrive waits until the attempt of ctx may answer: nil for the winner,
// the status of its cancellation for the loser.
func (a *duelApp) arrive(ctx context.Context) error {
	id := metadata.ValueFromIncomingContext(ctx, "x-call")[0]
	d := a.d
	d.mu.Lock()
	n := d.arrived[id]
	d.arrived[id]++
	if d.both[id] == nil {
		d.both[id] = make(chan struct{})
	}
	both := d.both[id]
	if n == 1 {
		close(both)
	}
	d.mu.Unlock()
	if n != d.winner {
		<-ctx.Done()
		d.cancelled <- struct{}{}
		return status.FromContextError(ctx.Err()).Err()
	}
	select {
	case <-both:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (a *duelApp) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	if err := a.arrive(ctx); err != nil {
		return nil, err
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("ep", a.name))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("ep-trailer", a.name))
	return &testgrpc.Empty{}, nil
}

func (a *duelApp) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	if err := a.arrive(s.Context()); err != nil {
		return err
	}
	if err := s.SendHeader(metadata.Pairs("ep", a.name)); err != nil {
		return err
	}
	s.SetTrailer(metadata.Pairs("ep-trailer", a.name))
	return s.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: []byte(a.name)}})
}

// startDuel serves two endpoints of d; addrs maps their names to their
// addresses.
func startDuel(t *testing.T, d *duel) (eps []endpoint.Endpoint, addrs map[string]string) {
	t.Helper()
	addrs = map[string]string{}
	for _, name := range []string{"ep0", "ep1"} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		g := grpc.NewServer()
		testgrpc.RegisterTestServiceServer(g, &duelApp{name: name, d: d})
		go func() { _ = g.Serve(lis) }()
		t.Cleanup(g.Stop)
		eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(lis.Addr().String())})
		addrs[name] = lis.Addr().String()
	}
	return eps, addrs
}

// A hedged call gives its caller the response header, trailer and peer
// (grpc.Header, grpc.Trailer, grpc.Peer) of the attempt whose answer it
// returns, and calls its OnFinish once, with the call's end, whichever
// attempt wins: the losing attempt, cancelled, ends after the winner (the
// first attempt, when the hedge wins a unary call) or after the call
// returned, on a goroutine of its own, and must write none of the
// caller's variables (the race detector watches them too).
func TestHedgedCallOptionsGetTheWinner(t *testing.T) {
	for _, stream := range []bool{false, true} {
		for _, winner := range []int{1, 0} {
			name := map[bool]string{false: "unary", true: "stream"}[stream] + "/" +
				map[int]string{0: "the first attempt wins", 1: "the hedge wins"}[winner]
			t.Run(name, func(t *testing.T) {
				d := &duel{winner: winner, arrived: map[string]int{}, both: map[string]chan struct{}{}, cancelled: make(chan struct{}, 1)}
				eps, addrs := startDuel(t, d)
				c, _ := policyChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})

				var end callEnd
				ctx := callAs(callCtx(t), "call", "")
				if stream {
					s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{}, end.options(false)...)
					require.NoError(t, err)
					_, err = s.Recv()
					require.NoError(t, err)
					_, err = s.Recv()
					require.ErrorIs(t, err, io.EOF)
				} else {
					_, err := c.EmptyCall(ctx, &testgrpc.Empty{}, end.options(false)...)
					require.NoError(t, err)
				}
				check := func(when string) {
					header, trailer, addr, finishes := end.seen("ep")
					require.NotEmpty(t, header, "%s: the winner's header", when)
					assert.Equal(t, header, trailer, "%s: the winner's trailer", when)
					assert.Equal(t, addrs[header], addr, "%s: the winner's peer", when)
					assert.Equal(t, []codes.Code{codes.OK}, finishes, "%s: OnFinish, once", when)
				}
				check("as the call returns")
				select {
				case <-d.cancelled:
				case <-time.After(testutil.Timeout):
					t.Fatal("the losing attempt was never cancelled")
				}
				check("once the loser ended")
			})
		}
	}
}

// A call the route retries gives its caller the response header, trailer
// and peer of its last attempt, and calls its OnFinish once, with the
// call's end, as grpc-go's own retries do: a GRPCRoute's unary calls and
// streams, and a ServiceProfile route's unary calls. The first attempt
// fails Trailers-Only with UNAVAILABLE and a trailer; the second answers
// with a header and a trailer.
func TestRetriedCallOptionsGetTheLastAttempt(t *testing.T) {
	handle := func(ctx context.Context, n int64) error {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("attempt-trailer", strconv.FormatInt(n, 10)))
		if n%2 == 1 {
			return status.Error(codes.Unavailable, "every other call")
		}
		_ = grpc.SetHeader(ctx, metadata.Pairs("attempt", strconv.FormatInt(n, 10)))
		return nil
	}
	check := func(t *testing.T, a *app, end *callEnd) {
		t.Helper()
		header, trailer, addr, finishes := end.seen("attempt")
		last := strconv.FormatInt(a.calls.Load(), 10)
		assert.Equal(t, "2", last, "two attempts")
		assert.Equal(t, last, header, "the last attempt's header")
		assert.Equal(t, last, trailer, "the last attempt's trailer")
		assert.Equal(t, a.addr.String(), addr)
		assert.Equal(t, []codes.Code{codes.OK}, finishes, "OnFinish, once")
	}
	for _, pointers := range []bool{false, true} {
		t.Run("GRPCRoute unary"+map[bool]string{true: ", options as pointers"}[pointers], func(t *testing.T) {
			a := startApp(t, &app{handle: handle}, nil)
			c, _ := policyChannel(t, retriedStreams, map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
			var end callEnd
			_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{}, end.options(pointers)...)
			require.NoError(t, err)
			check(t, a, &end)
		})
	}
	t.Run("GRPCRoute stream", func(t *testing.T) {
		a := startApp(t, &app{handle: handle}, nil)
		c, _ := policyChannel(t, retriedStreams, map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
		var end callEnd
		s, err := c.StreamingOutputCall(callCtx(t), &testgrpc.StreamingOutputCallRequest{}, end.options(false)...)
		require.NoError(t, err)
		_, err = s.Recv()
		require.NoError(t, err)
		_, err = s.Recv()
		require.ErrorIs(t, err, io.EOF)
		check(t, a, &end)
	})
	t.Run("ServiceProfile unary", func(t *testing.T) {
		a := startApp(t, &app{handle: handle}, nil)
		c, m := retryableEmptyCall(t, a, "")
		// Until the profile is in force, a call may fail; the call that
		// succeeds by it leaves the count even.
		require.Eventually(t, func() bool {
			_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
			return err == nil && m.Value(t, "route_response_total", `rt_route="EmptyCall"`, `classification="success"`) != ""
		}, testutil.Timeout, 10*time.Millisecond)
		a.calls.Store(0)
		var end callEnd
		_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{}, end.options(false)...)
		require.NoError(t, err)
		check(t, a, &end)
	})
}
