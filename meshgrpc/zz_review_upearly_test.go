package meshgrpc_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// reviewSplitRoute sends every EmptyCall of books to the authors backend.
const reviewSplitRoute = `
---
apiVersion: v1
kind: Service
metadata: {name: authors, namespace: default}
spec: {ports: [{port: 7000}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: to-authors, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: authors, port: 7000}]
`

// TestReviewControlPlaneUpWithinDiscoveryWait: the control plane is not
// up yet when a brand-new channel makes its first call (a fail-fast
// EmptyCall, 20s deadline, discovery wait 10s); it comes up a moment
// later, well within the discovery wait, with books' GRPCRoute sending
// EmptyCall to authors. The call reaches an endpoint only after the
// control plane answered, within the wait: it must be routed like every
// later call (to authors), not sent to books as if there were no policy.
func TestReviewControlPlaneUpWithinDiscoveryWait(t *testing.T) {
	t.Run("watches", func(t *testing.T) { reviewUpEarly(t) })
	t.Run("linkerd streams", func(t *testing.T) { reviewUpEarly(t, destination.WithLinkerdStreams()) })
}

func reviewUpEarly(t *testing.T, opts ...destination.Option) {
	booksApp := startApp(t, &app{}, nil)
	authorsApp := startApp(t, &app{}, nil)
	reserve, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := reserve.Addr().String()
	require.NoError(t, reserve.Close())

	dst, err := destination.Dial(addr, append(opts, destination.WithLogger(quiet),
		destination.WithBackoff(backoff.Policy{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	// An interceptor after the mesh's: it runs once the mesh has routed
	// the call, and says so.
	routed := make(chan struct{}, 1)
	after := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
		select {
		case routed <- struct{}{}:
		default:
		}
		return invoker(ctx, method, req, reply, cc, o...)
	})
	cc, err := grpc.NewClient(booksTarget, append(meshgrpc.DialOptions(dst, meshgrpc.WithLogger(quiet),
		meshgrpc.WithDiscoveryWait(testutil.Timeout)), after)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	c := testgrpc.NewTestServiceClient(cc)

	done := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*testutil.Timeout)
		defer cancel()
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		done <- err
	}()
	select {
	case <-routed:
	case <-time.After(testutil.Timeout):
		t.Fatal("the call was never routed")
	}
	// The mesh routed the call; only now does the control plane come up.
	store := controlplane.NewStore()
	manifests(t, store, booksService+reviewSplitRoute)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: booksApp.addr}}, authors: {{Addr: authorsApp.addr}}})
	var lis net.Listener
	require.Eventually(t, func() bool {
		lis, err = net.Listen("tcp", addr)
		return err == nil
	}, testutil.Timeout, 10*time.Millisecond)
	g := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)

	select {
	case err := <-done:
		took := time.Since(start)
		require.NoError(t, err)
		assert.Less(t, took, testutil.Timeout, "the call ended within the discovery wait")
		assert.Equal(t, int64(1), authorsApp.calls.Load(), "the first call went to the route's backend, authors (books got %d, after %v)", booksApp.calls.Load(), took)
	case <-time.After(3 * testutil.Timeout):
		t.Fatal("the call never ended")
	}
	// The channel recovers: later calls do go to authors.
	assert.Eventually(t, func() bool {
		before := authorsApp.calls.Load()
		_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
		return err == nil && authorsApp.calls.Load() == before+1
	}, testutil.Timeout, 10*time.Millisecond, "later calls never reach authors")
}
