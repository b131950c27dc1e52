package meshgrpc_test

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// The balancer's queue on a gRPC channel, as the HTTP balancer's
// (linkerd2-proxy's linkerd/proxy/balance/queue): a call that finds no
// endpoint of its backend in rotation waits for one, at most the failfast
// timeout, instead of failing at once.

// A call made while the only endpoint serves its failure-accrual penalty
// waits for the penalty's end and is the endpoint's probe, rather than
// failing UNAVAILABLE at once.
func TestCallWaitsForPenaltyEnd(t *testing.T) {
	const failures = 2
	a := startApp(t, &app{handle: func(_ context.Context, n int64) error {
		if n <= failures {
			return status.Error(codes.Unavailable, "not yet")
		}
		return nil
	}}, nil)
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	// The penalty is short beside the failfast timeout (the default 3 s),
	// and far longer than a call to loopback.
	penalty := 200 * time.Millisecond
	c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithFailureAccrual(&balancer.FailureAccrual{
		ConsecutiveFailures: &balancer.ConsecutiveFailures{MaxFailures: failures,
			Backoff: balancer.Backoff{MinBackoff: penalty, MaxBackoff: penalty}}})))
	ctx := callCtx(t)
	for i := range failures {
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		require.Equal(t, codes.Unavailable, status.Code(err), "call %d: %v", i, err)
	}
	// The endpoint is now out of rotation for the penalty.
	start := time.Now()
	_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
	require.NoError(t, err, "the call made during the penalty")
	assert.GreaterOrEqual(t, time.Since(start), penalty/2, "the call did not wait for the penalty's end")
	assert.Equal(t, int64(failures+1), a.calls.Load())
}

// Calls that find every endpoint out of rotation wait the failfast
// timeout and fail DEADLINE_EXCEEDED saying so; from then on the backend fails
// fast (calls fail without waiting) until a call finds an endpoint, and a
// call that waits for ready keeps waiting through it and is answered once
// an endpoint is back.
func TestQueueFailsFast(t *testing.T) {
	bad := startApp(t, &app{handle: func(context.Context, int64) error { return status.Error(codes.Unavailable, "down") }}, nil)
	good := startApp(t, &app{}, nil)
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: bad.addr}}})
	failfast := testutil.ShortTimeout
	c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(
		balancer.WithQueue(0, failfast),
		balancer.WithFailureAccrual(&balancer.FailureAccrual{ConsecutiveFailures: &balancer.ConsecutiveFailures{
			MaxFailures: 1, Backoff: balancer.Backoff{MinBackoff: time.Hour, MaxBackoff: time.Hour}}})))
	ctx := callCtx(t)
	_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Equal(t, "down", status.Convert(err).Message())

	start := time.Now()
	_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
	assert.GreaterOrEqual(t, time.Since(start), failfast, "the call failed before the failfast timeout")
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "failing fast: no endpoint of "+books+" ready within")
	_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "failing fast")

	var wg sync.WaitGroup
	var waited error
	wg.Go(func() { _, waited = c.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true)) })
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: bad.addr}, {Addr: good.addr}}})
	wg.Wait()
	require.NoError(t, waited, "the call waiting for ready")
	_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
	require.NoError(t, err, "a call after one found an endpoint")
	assert.Equal(t, int64(1), bad.calls.Load(), "a call went to the endpoint out of rotation")
}

// A target whose endpoint set becomes empty queues its calls as the HTTP
// balancer does for an empty set: a call made then waits for an endpoint
// up to the failfast timeout, rather than failing at once.
func TestEmptySetQueues(t *testing.T) {
	a := &app{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := make(chan struct{}, 16)
	g := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(g, a)
	go func() { _ = g.Serve(&closeListener{Listener: lis, closed: closed}) }()
	t.Cleanup(g.Stop)
	a.addr = netip.MustParseAddrPort(lis.Addr().String())

	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithQueue(0, testutil.Timeout)))
	ctx := callCtx(t)
	_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
	require.NoError(t, err)

	// The channel closes its connection once it has the empty set.
	store.PutEndpoints(books, []endpoint.Endpoint{})
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("the channel kept its connection to the removed endpoint")
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		done <- err
	}()
	store.PutEndpoints(books, []endpoint.Endpoint{{Addr: a.addr}})
	require.NoError(t, <-done, "the call made while the set was empty")
}

// A call made while the target's only endpoint cannot be connected to
// (its connection attempts refused, or closed before the HTTP/2
// handshake, so that its sub-channel is in TRANSIENT_FAILURE) waits in
// the queue for the endpoint's next attempt, at most the failfast
// timeout, as a request waits in Linkerd's balancer for an endpoint to
// become ready, rather than failing UNAVAILABLE at once because one
// connection attempt failed.
func TestUnreachableEndpointQueues(t *testing.T) {
	for _, tc := range []struct {
		name string
		// start returns the endpoint's address, failing to connect until
		// serve is called.
		start func(t *testing.T, a *app) (addr netip.AddrPort, serve func())
	}{
		{name: "refused until it listens", start: func(t *testing.T, a *app) (netip.AddrPort, func()) {
			addr, listen := testutil.RefusedUntilListen(t)
			return addr, func() { serveOn(t, a, listen()) }
		}},
		{name: "closed at once until it serves", start: func(t *testing.T, a *app) (netip.AddrPort, func()) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			g := &gateListener{Listener: lis}
			serveOn(t, a, g)
			return netip.MustParseAddrPort(lis.Addr().String()), func() { g.open.Store(true) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &app{}
			addr, serve := tc.start(t, a)
			store := controlplane.NewStore()
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: addr}}})
			cc, err := grpc.NewClient(booksTarget, meshgrpc.DialOptions(serveStore(t, store),
				meshgrpc.WithBalancerOptions(balancer.WithQueue(0, testutil.Timeout)))...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = cc.Close() })
			ctx := callCtx(t)
			cc.Connect()
			for s := cc.GetState(); s != connectivity.TransientFailure; s = cc.GetState() {
				require.True(t, cc.WaitForStateChange(ctx, s), "the endpoint's first connection attempt never failed")
			}
			// The endpoint comes up; the sub-channel tries again after its
			// backoff (about a second), well within the failfast timeout.
			serve()
			_, err = testgrpc.NewTestServiceClient(cc).EmptyCall(ctx, &testgrpc.Empty{})
			require.NoError(t, err, "the call made while the endpoint could not be reached")
			assert.Equal(t, int64(1), a.calls.Load())
		})
	}
}

// serveOn serves a as the TestService on lis until the test ends.
func serveOn(t *testing.T, a *app, lis net.Listener) {
	g := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(g, a)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
}

// gateListener closes every connection it accepts until open, and then
// hands them to its server.
type gateListener struct {
	net.Listener
	open atomic.Bool
}

func (l *gateListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.open.Load() {
			return c, err
		}
		c.Close()
	}
}

// closeListener signals each accepted connection's close.
type closeListener struct {
	net.Listener
	closed chan struct{}
}

func (l *closeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &closeConn{Conn: c, closed: l.closed}, nil
}

type closeConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeConn) Close() error {
	c.once.Do(func() {
		select {
		case c.closed <- struct{}{}:
		default:
		}
	})
	return c.Conn.Close()
}
