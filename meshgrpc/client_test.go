package meshgrpc_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

func callCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// Endpoint weights from the Destination API decide the shares: 3:1 over
// 10,000 calls, within 5 points. The RTT average forgets at once (a
// decay of 1 ns), so that a slow answer on a loaded machine cannot make
// load decide instead of the weights.
func TestWeights(t *testing.T) {
	a := startApp(t, &app{}, nil)
	b := startApp(t, &app{}, nil)
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr, Weight: 30000}, {Addr: b.addr, Weight: 10000}}})
	c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithPeakEWMA(0, time.Nanosecond)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*testutil.Timeout) // 10,000 calls under -race
	defer cancel()
	const n = 10000
	for range n {
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		require.NoError(t, err)
	}
	assert.InDelta(t, 0.75, float64(a.calls.Load())/n, 0.05, "a: %d, b: %d", a.calls.Load(), b.calls.Load())
	assert.Equal(t, int64(n), a.calls.Load()+b.calls.Load())
}

// An endpoint that answers UNAVAILABLE is tripped after the consecutive
// failures of the accrual policy and gets no call after that.
func TestFailureAccrual(t *testing.T) {
	good := startApp(t, &app{}, nil)
	bad := startApp(t, &app{handle: func(context.Context, int64) error { return status.Error(codes.Unavailable, "down") }}, nil)
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: good.addr}, {Addr: bad.addr}}})
	// Load is held equal (see TestWeights): only accrual takes the
	// failing endpoint out, not a slow first answer.
	c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithPeakEWMA(0, time.Nanosecond),
		balancer.WithFailureAccrual(&balancer.FailureAccrual{
			ConsecutiveFailures: &balancer.ConsecutiveFailures{MaxFailures: 3, Backoff: balancer.Backoff{MinBackoff: time.Hour}}})))
	ctx := callCtx(t)
	var failed []string
	for range 300 {
		if _, err := c.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
			require.Equal(t, codes.Unavailable, status.Code(err))
			failed = append(failed, err.Error())
		}
	}
	assert.Equal(t, int64(3), bad.calls.Load(), "the failing endpoint got calls after it tripped")
	assert.Len(t, failed, 3, "%q", failed)
	assert.Equal(t, int64(297), good.calls.Load())
}

// An endpoint removed from the control plane's store stops getting calls.
func TestEndpointRemoved(t *testing.T) {
	a := startApp(t, &app{}, nil)
	b := startApp(t, &app{}, nil)
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}, {Addr: b.addr}}})
	c := dial(t, serveStore(t, store))
	ctx := callCtx(t)
	require.Eventually(t, func() bool {
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		require.NoError(t, err)
		return b.calls.Load() > 0
	}, testutil.Timeout, time.Millisecond)
	store.PutEndpoints(books, []endpoint.Endpoint{{Addr: a.addr}})
	require.Eventually(t, func() bool {
		before := b.calls.Load()
		for range 50 {
			_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
			require.NoError(t, err)
		}
		return b.calls.Load() == before
	}, testutil.Timeout, 10*time.Millisecond)
}

// A service with no endpoints: a call that waits for ready waits until its
// deadline; one that does not queues for the failfast timeout and then
// fails with DEADLINE_EXCEEDED, saying so, once the empty set is known (the
// embedded control plane sends nothing for it: the destination client's
// first-message deadline and the discovery wait, both 5 s, end at about
// the same moment).
func TestEmptyEndpointSet(t *testing.T) {
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {}})
	c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithQueue(0, testutil.ShortTimeout)))
	ctx := callCtx(t)
	var err error
	require.Eventually(t, func() bool {
		cctx, cancel := context.WithTimeout(ctx, testutil.ShortTimeout)
		defer cancel()
		_, err = c.EmptyCall(cctx, &testgrpc.Empty{})
		return status.Code(err) == codes.DeadlineExceeded && strings.Contains(err.Error(), "failing fast: no endpoints")
	}, testutil.Timeout, 10*time.Millisecond, "last: %v", err)
	assert.NoError(t, ctx.Err())

	wctx, cancel := context.WithTimeout(ctx, testutil.ShortTimeout)
	defer cancel()
	_, err = c.EmptyCall(wctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
}

// A target the Destination client cannot watch (past its bound on
// watched authorities) is a resolver error: calls fail at once with
// UNAVAILABLE saying why. The channel does not spin re-resolving: it tries
// the watch again after a growing delay (a second, then more), so that
// once the bound has room (here, the other channel closed), calls go
// through. Before, a refusal lasted as long as the channel.
func TestWatchRefused(t *testing.T) {
	a := startApp(t, &app{}, nil)
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}, authors: {{Addr: a.addr}}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store).Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	dst, err := destination.Dial(lis.Addr().String(), destination.WithMaxWatches(1))
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })

	first, err := grpc.NewClient(booksTarget, meshgrpc.DialOptions(dst)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Close() })
	_, err = testgrpc.NewTestServiceClient(first).EmptyCall(callCtx(t), &testgrpc.Empty{})
	require.NoError(t, err)

	cc, err := grpc.NewClient("inmesh:///"+authors,
		meshgrpc.DialOptions(dst, meshgrpc.WithLogger(slog.New(slog.DiscardHandler)))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	second := testgrpc.NewTestServiceClient(cc)
	_, err = second.EmptyCall(callCtx(t), &testgrpc.Empty{})
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), authors)

	require.NoError(t, first.Close()) // its watch idles, and gives way at the bound
	_, err = second.EmptyCall(callCtx(t), &testgrpc.Empty{}, grpc.WaitForReady(true))
	require.NoError(t, err, "the refused watch is tried again")
}
