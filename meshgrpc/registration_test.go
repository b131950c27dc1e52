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

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/regtest"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/inmesh/inmesh/registration"
)

// A meshed grpc-go server that registers itself is reachable by name on a
// fresh channel's first call, over mTLS; GracefulStop deregisters it before
// the server stops: the peer's watch has lost it when GracefulStop returns.
func TestRegisteredGRPCServer(t *testing.T) {
	c := regtest.Start(t, regtest.Manifests)
	local := c.Certify(t, regtest.BooksID)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithIdentity(local))...)
	a := &app{}
	testgrpc.RegisterTestServiceServer(srv, a)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	reg, err := meshgrpc.Register(lis, local, c.Dial(t, local), []registration.Endpoint{{Authority: books}})
	require.NoError(t, err)
	select {
	case <-reg.Accepted():
	case <-time.After(testutil.Timeout):
		t.Fatalf("not accepted: %v", reg.Err())
	}

	dst, err := destination.Dial(c.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	sizes := make(chan int, 16)
	stop, err := dst.WatchEndpoints(context.Background(), books, func(u endpoint.Update) {
		if u.Set != nil {
			sizes <- len(u.Set.Endpoints)
		}
	})
	require.NoError(t, err)
	defer stop()
	client := dial(t, dst, meshgrpc.WithIdentity(c.Certify(t, regtest.WebID)))
	_, err = client.EmptyCall(callCtx(t), &testgrpc.Empty{})
	require.NoError(t, err, "the first call reaches the registered server")
	assert.EqualValues(t, 1, a.calls.Load())

	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	meshgrpc.GracefulStop(ctx, srv, reg)
	for {
		select {
		case n := <-sizes:
			if n == 0 {
				return
			}
		default:
			t.Fatal("the peer's watch still had the server when GracefulStop returned")
		}
	}
}
