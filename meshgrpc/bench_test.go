package meshgrpc_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// BenchmarkUnaryPlain and BenchmarkUnaryMesh call the same loopback
// server, the first on a plain channel, the second through the mesh
// (resolver, balancer, route interceptor with a GRPCRoute policy): the
// difference per call is the mesh's cost.
func BenchmarkUnaryPlain(b *testing.B) {
	a := startApp(b, &app{}, nil)
	cc, err := grpc.NewClient("passthrough:///"+a.addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	defer cc.Close()
	benchUnary(b, testgrpc.NewTestServiceClient(cc))
}

func BenchmarkUnaryMesh(b *testing.B) {
	a := startApp(b, &app{}, nil)
	store := controlplane.NewStore()
	manifests(b, store, booksService+retryRoute+probeRoute)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	m := testutil.NewMetrics(b)
	c := dial(b, serveStore(b, store), meshgrpc.WithMeterProvider(m.Provider))
	routed(b, c, m)
	benchUnary(b, c)
}

func benchUnary(b *testing.B, c testgrpc.TestServiceClient) {
	ctx := context.Background()
	for range 100 { // warm up: connections, the policy
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		require.NoError(b, err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
			b.Fatal(err)
		}
	}
}
