package meshgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/linkerdtest"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// A channel made while its control plane cannot be reached, whose control
// plane then comes up and answers as Linkerd's does for a Service without
// a policy of its own (OutboundPolicies NotFound for the name; its
// endpoints by Get): the first call goes out once the control plane has
// answered, not at the end of the discovery wait, which here outlasts the
// call's deadline.
func TestFirstCallAfterTheControlPlaneCameUp(t *testing.T) {
	booksApp := startApp(t, &app{}, nil)
	addr, listen := testutil.RefusedUntilListen(t)
	dst, refused := dialRefusedCounted(t, addr.String(), destination.WithLinkerdStreams())
	cc, err := grpc.NewClient(booksTarget, meshgrpc.DialOptions(dst, meshgrpc.WithLogger(quiet),
		meshgrpc.WithDiscoveryWait(time.Hour))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	cc.Connect() // the resolver's watches start now
	// A few refused dials: the watches have found the control plane
	// unreachable and said so.
	deadline := time.After(testutil.Timeout)
	for range 5 {
		select {
		case <-refused:
		case <-deadline:
			t.Fatal("the control plane was never dialled")
		}
	}
	cp := &linkerdtest.IPControlPlane{Name: books, Endpoints: []endpoint.Endpoint{{Addr: booksApp.addr, Weight: endpoint.DefaultWeight}}}
	cp.ServeOn(t, listen())

	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	_, err = testgrpc.NewTestServiceClient(cc).EmptyCall(ctx, &testgrpc.Empty{})
	require.NoError(t, err, "the first call waited for the discovery wait although the control plane had answered")
}
