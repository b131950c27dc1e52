package controlplane_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
)

// BenchmarkFleetChanges measures, with 10,000 Services each with a
// manifest and an endpoint set and one workload registered, what a
// stream opened for a Service name costs (GetProfile to its first answer,
// and the OutboundPolicies of the Service, over a real gRPC connection),
// and what one endpoint change costs: a set of the endpoints file
// replaced, and a registration's set replaced.
func BenchmarkFleetChanges(b *testing.B) {
	store, _ := fleetStore(b, 10000)
	const (
		name      = "svc-5000.default.svc.cluster.local:8080"
		file      = "svc-6000.default.svc.cluster.local:8080"
		registers = "svc-7000.default.svc.cluster.local:8080"
	)
	at := func(i int) []endpoint.Endpoint {
		return []endpoint.Endpoint{{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), 8080), Weight: endpoint.DefaultWeight}}
	}
	store.PutRegistered("fleet-0", map[string][]endpoint.Endpoint{registers: at(0)})
	conn, err := grpc.NewClient(serveStore(b, store), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*testutil.Timeout)
	b.Cleanup(cancel)

	b.Run("GetProfile of a Service name", func(b *testing.B) {
		dst := pb.NewDestinationClient(conn)
		b.ReportAllocs()
		for b.Loop() {
			sctx, scancel := context.WithCancel(ctx)
			st, err := dst.GetProfile(sctx, &pb.GetDestination{Path: name})
			if err != nil {
				b.Fatal(err)
			}
			if p, err := st.Recv(); err != nil || p.GetFullyQualifiedName() == "" {
				b.Fatalf("answered %v, %v", p, err)
			}
			scancel()
		}
	})
	b.Run("policy of a Service name", func(b *testing.B) {
		pol := outboundpb.NewOutboundPoliciesClient(conn)
		spec := &outboundpb.TrafficSpec{SourceWorkload: "default:web-0", Target: &outboundpb.TrafficSpec_Authority{Authority: name}}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := pol.Get(ctx, spec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("PutEndpoints of one set", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			store.PutEndpoints(file, at(i))
		}
	})
	b.Run("PutRegistered of one set", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			store.PutRegistered("fleet-0", map[string][]endpoint.Endpoint{registers: at(i)})
		}
	})
}
