package controlplane_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
)

// fleetStore is a store of n Services (10,000 is the scale of the fleet
// issue), each with a manifest that gives it a clusterIP and an
// endpoint set of three pods, each pod at an IP of its own, with the
// Service's identity.
func fleetStore(b *testing.B, n int) (*controlplane.Store, map[string][]endpoint.Endpoint) {
	b.Helper()
	var yaml strings.Builder
	sets := make(map[string][]endpoint.Endpoint, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		fmt.Fprintf(&yaml, "---\napiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: default}\nspec: {clusterIP: 10.96.%d.%d, ports: [{name: http, port: 8080}]}\n",
			name, i/250, i%250+1)
		id := name + ".default.serviceaccount.identity.linkerd.cluster.local"
		for pod := range 3 {
			k := 3*i + pod
			sets[name+".default.svc.cluster.local:8080"] = append(sets[name+".default.svc.cluster.local:8080"], endpoint.Endpoint{
				Addr:     netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(k / 250), byte(k%250 + 1)}), 8080),
				Weight:   endpoint.DefaultWeight,
				Identity: id,
			})
		}
	}
	r, err := manifest.LoadFiles(manifest.File{Name: "fleet.yaml", Data: []byte(yaml.String())})
	require.NoError(b, err)
	store := controlplane.NewStore()
	store.SetManifests(r)
	store.SetEndpoints(sets)
	return store, sets
}

// BenchmarkAddressLookups measures what a peer that opens address streams
// costs a control plane of 10,000 Services: a GetProfile stream of a
// pod's IP (to its first answer), and the OutboundPolicies of an address
// outside the cluster, each over a real gRPC connection; and what keeping
// the index costs a reload of the endpoints file that changes nothing.
func BenchmarkAddressLookups(b *testing.B) {
	store, sets := fleetStore(b, 10000)
	conn, err := grpc.NewClient(serveStore(b, store), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*testutil.Timeout)
	b.Cleanup(cancel)

	b.Run("GetProfile of a pod IP", func(b *testing.B) {
		dst := pb.NewDestinationClient(conn)
		b.ReportAllocs()
		for b.Loop() {
			sctx, scancel := context.WithCancel(ctx)
			st, err := dst.GetProfile(sctx, &pb.GetDestination{Path: "10.1.58.101:8080"})
			if err != nil {
				b.Fatal(err)
			}
			p, err := st.Recv()
			if err != nil || p.GetEndpoint().GetTlsIdentity() == nil {
				b.Fatalf("answered %v, %v", p, err)
			}
			scancel()
		}
	})
	b.Run("policy of an outside address", func(b *testing.B) {
		pol := outboundpb.NewOutboundPoliciesClient(conn)
		spec := &outboundpb.TrafficSpec{SourceWorkload: "default:web-0",
			Target: &outboundpb.TrafficSpec_Addr{Addr: destination.AddrToProto(netip.MustParseAddrPort("127.0.0.9:80"))}}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := pol.Get(ctx, spec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reload of the same endpoint sets", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			store.SetEndpoints(sets)
		}
	})
}
