package meshgrpc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/meshgrpc"
)

// stallApp is a real gRPC server that answers EmptyCall at once until it
// stalls; then it answers no call before its caller gives it up.
type stallApp struct {
	testgrpc.UnimplementedTestServiceServer
	calls atomic.Int64
	stall atomic.Bool
}

func (a *stallApp) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	a.calls.Add(1)
	if a.stall.Load() {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &testgrpc.Empty{}, nil
}

// A call its caller cancels before the response is a sample of the time it
// waited in the endpoint's load, as Linkerd's load biaser records the
// elapsed time of a request dropped in flight (linkerd/load-biaser/src/
// lib.rs, test_cancellation_records_measurement): an endpoint that stalls
// until its callers give up looks slow, and the next calls go to the one
// that answers. Without the sample it would keep the fast RTT it had.
func TestCanceledCallsMakeEndpointSlow(t *testing.T) {
	// Long enough that a call to the endpoint that answers is not given
	// up on a loaded machine; the time constant is long beside it, so
	// that the stalled endpoint's estimate stays high while the last
	// calls are made.
	const giveUp = 500 * time.Millisecond
	const tau = 10 * time.Second
	slow, fast := &stallApp{}, &stallApp{}
	store := controlplane.NewStore()
	manifests(t, store, booksService)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: serveTestService(t, slow)}, {Addr: serveTestService(t, fast)}}})
	// A default RTT below any real one: the first answers set each
	// endpoint's estimate.
	c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithPeakEWMA(time.Microsecond, tau)))
	// call makes one call its caller cancels after giveUp.
	call := func() error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		timer := time.AfterFunc(giveUp, cancel)
		defer timer.Stop()
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		return err
	}
	// Both endpoints answer fast until each has answered.
	for slow.calls.Load() == 0 || fast.calls.Load() == 0 {
		require.Less(t, slow.calls.Load()+fast.calls.Load(), int64(1000), "an endpoint got no call")
		require.NoError(t, call())
	}
	// Calls go to both while their estimates are alike, until one
	// reaches the stalled endpoint and is given up.
	slow.stall.Store(true)
	for answered, sent := slow.calls.Load(), 0; slow.calls.Load() == answered; sent++ {
		require.Less(t, sent, 100_000, "no call went to the stalled endpoint")
		if err := call(); err != nil {
			require.Equal(t, codes.Canceled, status.Code(err))
		}
	}
	const n = 100
	before := fast.calls.Load()
	canceled := 0
	for range n {
		if call() != nil {
			canceled++
		}
	}
	assert.Greater(t, fast.calls.Load()-before, int64(n*9/10), "calls to the endpoint that answers, of %d (given up: %d)", n, canceled)
}
