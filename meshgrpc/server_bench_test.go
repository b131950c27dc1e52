package meshgrpc_test

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/meshgrpc"
)

// benchServerUnary measures a plaintext unary call to a server with opts.
func benchServerUnary(b *testing.B, opts ...grpc.ServerOption) {
	srv := grpc.NewServer(opts...)
	testgrpc.RegisterTestServiceServer(srv, peerApp{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go srv.Serve(ln)
	defer srv.Stop()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	defer cc.Close()
	c := testgrpc.NewTestServiceClient(cc)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
			b.Fatal(err)
		}
	}
}

// The cost of the mesh on a unary call, client and server in one process:
// a bare grpc.Server, with ServerOptions' metrics, and with an inbound
// policy too.
func BenchmarkServerUnary(b *testing.B) {
	mp := meshgrpc.WithMeterProvider(noop.NewMeterProvider())
	b.Run("bare", func(b *testing.B) { benchServerUnary(b) })
	b.Run("meshgrpc", func(b *testing.B) { benchServerUnary(b, meshgrpc.ServerOptions(mp)...) })
	b.Run("meshgrpc+policy", func(b *testing.B) {
		benchServerUnary(b, meshgrpc.ServerOptions(mp, meshgrpc.WithLogger(quiet), meshgrpc.WithInboundPolicy(authz.WithDefault(booksGRPC())))...)
	})
}
