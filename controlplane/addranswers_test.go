package controlplane

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/httproutepb"
	"github.com/inmesh/inmesh/proxyapi/opaqueroutepb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
)

// wantUndefinedPort is the policy Linkerd's policy controller answers for
// a Service's clusterIP on a port the Service does not declare, written
// out field by field from policy-controller/grpc/src/outbound.rs
// undefined_port.
func wantUndefinedPort(ns, name string, port uint32) *outboundpb.OutboundPolicy {
	return &outboundpb.OutboundPolicy{
		Metadata: &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{
			Group: "core", Kind: "Service", Name: name, Namespace: ns, Section: "", Port: port}}},
		Protocol: &outboundpb.ProxyProtocol{Kind: &outboundpb.ProxyProtocol_Opaque_{Opaque: &outboundpb.ProxyProtocol_Opaque{
			Routes: []*outboundpb.OpaqueRoute{{
				Metadata: &pb.Metadata{Kind: &pb.Metadata_Default{Default: "undefined-port"}},
				Rules: []*outboundpb.OpaqueRoute_Rule{{
					Backends: &outboundpb.OpaqueRoute_Distribution{Kind: &outboundpb.OpaqueRoute_Distribution_Empty_{
						Empty: &outboundpb.OpaqueRoute_Distribution_Empty{}}},
					Filters: []*outboundpb.OpaqueRoute_Filter{{Kind: &outboundpb.OpaqueRoute_Filter_Forbidden{
						Forbidden: &opaqueroutepb.Forbidden{}}}},
				}},
			}},
		}}},
	}
}

// wantEgressFallback is the policy Linkerd's policy controller answers for
// an address outside the cluster, written out field by field from
// policy-controller/grpc/src/outbound.rs fallback and default_queue_config.
func wantEgressFallback(t *testing.T, addr string) *outboundpb.OutboundPolicy {
	meta := &pb.Metadata{Kind: &pb.Metadata_Default{Default: "egress-fallback"}}
	backend := &outboundpb.Backend{
		Metadata: meta,
		Queue:    &outboundpb.Queue{Capacity: 100, FailfastTimeout: durationpb.New(3 * time.Second)},
		Kind:     &outboundpb.Backend_Forward{Forward: &pb.WeightedAddr{Addr: tcpAddr(t, addr), Weight: 1}},
	}
	routes := []*outboundpb.HttpRoute{{
		Metadata: meta,
		Rules: []*outboundpb.HttpRoute_Rule{{
			Matches: []*httproutepb.HttpRouteMatch{{}},
			Backends: &outboundpb.HttpRoute_Distribution{Kind: &outboundpb.HttpRoute_Distribution_FirstAvailable_{
				FirstAvailable: &outboundpb.HttpRoute_Distribution_FirstAvailable{
					Backends: []*outboundpb.HttpRoute_RouteBackend{{Backend: backend}}}}},
		}},
	}}
	return &outboundpb.OutboundPolicy{
		Metadata: meta,
		Protocol: &outboundpb.ProxyProtocol{Kind: &outboundpb.ProxyProtocol_Detect_{Detect: &outboundpb.ProxyProtocol_Detect{
			Timeout: durationpb.New(10 * time.Second),
			Opaque: &outboundpb.ProxyProtocol_Opaque{Routes: []*outboundpb.OpaqueRoute{{
				Metadata: meta,
				Rules: []*outboundpb.OpaqueRoute_Rule{{
					Backends: &outboundpb.OpaqueRoute_Distribution{Kind: &outboundpb.OpaqueRoute_Distribution_FirstAvailable_{
						FirstAvailable: &outboundpb.OpaqueRoute_Distribution_FirstAvailable{
							Backends: []*outboundpb.OpaqueRoute_RouteBackend{{Backend: backend}}}}},
				}},
			}}},
			Http1: &outboundpb.ProxyProtocol_Http1{Routes: routes},
			Http2: &outboundpb.ProxyProtocol_Http2{Routes: routes},
		}}},
	}
}

// TestAddressAnswersAsLinkerd: the four answers a client gets for an IP
// address (OutboundPolicies Get and Watch, Destination GetProfile and Get)
// are Linkerd's controllers' for a Service's clusterIP on a port the
// Service does not declare (an opaque policy that refuses the connection,
// an empty profile) and for an address outside the cluster (a policy that
// forwards to the address itself, a profile whose endpoint is the
// address), and stay NotFound for an address in the cluster that is no
// Service's: in the cluster networks, or the IP of a workload of the
// endpoint sets (here on loopback, outside those networks).
func TestAddressAnswersAsLinkerd(t *testing.T) {
	store, cc := answersPlane(t)
	const loopID = "loop.default.serviceaccount.identity.linkerd.cluster.local"
	store.PutEndpoints("loop.default.svc.cluster.local:8080", []endpoint.Endpoint{
		{Addr: netip.MustParseAddrPort("127.0.0.5:8080"), Weight: endpoint.DefaultWeight, Identity: loopID}})
	policies := outboundpb.NewOutboundPoliciesClient(cc)
	dst := pb.NewDestinationClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	budget := &pb.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, Ttl: durationpb.New(10 * time.Second)}
	addrProfile := func(addr string) *pb.DestinationProfile {
		return &pb.DestinationProfile{RetryBudget: budget, Endpoint: &pb.WeightedAddr{Addr: tcpAddr(t, addr), Weight: 10000}}
	}
	const noSuchService = "No such service"

	for _, tc := range []struct {
		name, upstream string
		addr           string
		policy         *outboundpb.OutboundPolicy // nil: NotFound "No such service"
		profile        *pb.DestinationProfile
	}{
		{
			name: "a clusterIP on a port the Service does not declare",
			upstream: "policy-controller/k8s/index/src/outbound/index.rs lookup_service (UndefinedPort), grpc/src/outbound.rs undefined_port; " +
				"controller/api/destination/server.go subscribeToServiceProfile (svcDefinesPort: an empty profile)",
			addr:    "10.96.0.10:7001",
			policy:  wantUndefinedPort("default", "books", 7001),
			profile: &pb.DestinationProfile{},
		},
		{
			name:     "an address outside the cluster",
			upstream: "policy-controller/runtime/src/lib.rs lookup_ip (External), grpc/src/outbound.rs fallback; server_test.go TestGetProfiles \"Return default profile when IP does not map to service or pod\"",
			addr:     "172.0.0.1:80",
			policy:   wantEgressFallback(t, "172.0.0.1:80"),
			profile:  addrProfile("172.0.0.1:80"),
		},
		{
			name:     "the address of policy-test's egress fallback",
			upstream: "policy-test/tests/outbound_api_egress_network.rs fallback_switches_to_egress (watch_ip 1.1.1.1:80: egress-fallback)",
			addr:     "1.1.1.1:80",
			policy:   wantEgressFallback(t, "1.1.1.1:80"),
			profile:  addrProfile("1.1.1.1:80"),
		},
		{
			name:     "an IPv6 address outside the cluster",
			upstream: "policy-controller/runtime/src/lib.rs lookup_ip (External)",
			addr:     "[::1]:8080",
			policy:   wantEgressFallback(t, "[::1]:8080"),
			profile:  addrProfile("[::1]:8080"),
		},
		{
			name:     "an address of the cluster networks that is no Service's",
			upstream: "policy-controller/runtime/src/lib.rs lookup_ip (None: not_found \"No such service\")",
			addr:     "10.8.255.255:4191",
			profile:  addrProfile("10.8.255.255:4191"),
		},
		{
			name:     "a pod's address",
			upstream: "policy-controller/runtime/src/lib.rs lookup_ip (a pod's IP is in the cluster networks)",
			addr:     "10.0.0.5:7000",
			profile: &pb.DestinationProfile{RetryBudget: budget, Endpoint: &pb.WeightedAddr{Addr: tcpAddr(t, "10.0.0.5:7000"), Weight: 10000,
				MetricLabels: map[string]string{"pod": "books-0", "namespace": "default"}, TlsIdentity: tlsID(booksID), ProtocolHint: hintH2()}},
		},
		{
			name:     "a workload's address on loopback",
			upstream: "policy-controller/runtime/src/lib.rs lookup_ip (a pod's IP is in the cluster networks)",
			addr:     "127.0.0.5:8080",
			profile: &pb.DestinationProfile{RetryBudget: budget, Endpoint: &pb.WeightedAddr{Addr: tcpAddr(t, "127.0.0.5:8080"), Weight: 10000,
				MetricLabels: map[string]string{"namespace": "default"}, TlsIdentity: tlsID(loopID)}},
		},
		{
			name:     "another port of a workload's IP on loopback",
			upstream: "policy-controller/runtime/src/lib.rs lookup_ip (a pod's IP is in the cluster networks)",
			addr:     "127.0.0.5:9090",
			profile: &pb.DestinationProfile{RetryBudget: budget, Endpoint: &pb.WeightedAddr{Addr: tcpAddr(t, "127.0.0.5:9090"), Weight: 10000,
				MetricLabels: map[string]string{"namespace": "default"}, TlsIdentity: tlsID(loopID)}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Logf("upstream: %s", tc.upstream)
			ap := netip.MustParseAddrPort(tc.addr)
			spec := &outboundpb.TrafficSpec{SourceWorkload: "default:pod-0", Target: &outboundpb.TrafficSpec_Addr{Addr: tcpAddr(t, tc.addr)}}
			checkPolicy := func(what string, got *outboundpb.OutboundPolicy, err error) {
				if tc.policy == nil {
					require.Equal(t, codes.NotFound, status.Code(err), "%s: %v", what, err)
					assert.Equal(t, noSuchService, status.Convert(err).Message(), what)
					return
				}
				require.NoError(t, err, what)
				assert.Empty(t, cmp.Diff(tc.policy, got, protocmp.Transform()), what)
				// inmesh's client reads it.
				_, err = destination.PolicyFromProto(got)
				require.NoError(t, err, what)
			}
			got, err := policies.Get(ctx, spec)
			checkPolicy("OutboundPolicies.Get", got, err)
			w, err := policies.Watch(ctx, spec)
			require.NoError(t, err)
			got, err = recvTimeout(t, w.Recv)
			checkPolicy("OutboundPolicies.Watch", got, err)

			ps, err := dst.GetProfile(ctx, &pb.GetDestination{Path: tc.addr})
			require.NoError(t, err)
			prof, err := recvTimeout(t, ps.Recv)
			require.NoError(t, err, "GetProfile")
			assert.Empty(t, cmp.Diff(tc.profile, prof, protocmp.Transform()), "GetProfile")

			// Linkerd's controller takes no IP address in Get
			// (controller/api/destination/server.go Get), a clusterIP
			// and an address outside the cluster alike.
			gs, err := dst.Get(ctx, &pb.GetDestination{Path: tc.addr})
			require.NoError(t, err)
			_, err = recvTimeout(t, gs.Recv)
			require.Equal(t, codes.InvalidArgument, status.Code(err), "Get: %v", err)
			assert.Equal(t, "IP queries not supported by Get API: host="+ap.Addr().String(), status.Convert(err).Message(), "Get")
		})
	}

	t.Run("the cluster networks are the inbound options'", func(t *testing.T) {
		t.Log("upstream: policy-controller/runtime/src/args.rs (one --cluster-networks for the inbound and outbound indexes), k8s/index/src/outbound/index.rs is_address_in_cluster")
		store.SetInboundOptions(manifest.InboundOptions{ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("172.0.0.0/16")}})
		defer store.SetInboundOptions(manifest.InboundOptions{})
		spec := func(addr string) *outboundpb.TrafficSpec {
			return &outboundpb.TrafficSpec{SourceWorkload: "default:pod-0", Target: &outboundpb.TrafficSpec_Addr{Addr: tcpAddr(t, addr)}}
		}
		_, err := policies.Get(ctx, spec("172.0.0.1:80"))
		require.Equal(t, codes.NotFound, status.Code(err), "now in the cluster: %v", err)
		got, err := policies.Get(ctx, spec("10.8.255.255:4191"))
		require.NoError(t, err, "now outside the cluster")
		assert.Empty(t, cmp.Diff(wantEgressFallback(t, "10.8.255.255:4191"), got, protocmp.Transform()))
	})
}

// An OutboundPolicies stream of a Service's clusterIP on a port the
// Service does not declare follows the Service: once its manifest declares
// the port, the stream sends the Service's policy, and a Service that goes
// away ends it with NotFound "unknown target", as any Service's stream.
func TestUndeclaredPortStreamFollowsTheService(t *testing.T) {
	store := NewStore()
	store.SetManifests(resources(t, authorsServiceYAML))
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	cc, err := grpc.NewClient(cp.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	policies := outboundpb.NewOutboundPoliciesClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	w, err := policies.Watch(ctx, &outboundpb.TrafficSpec{SourceWorkload: "default:web-0",
		Target: &outboundpb.TrafficSpec_Addr{Addr: tcpAddr(t, "10.96.0.71:7002")}})
	require.NoError(t, err)
	got, err := recvTimeout(t, w.Recv)
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(wantUndefinedPort("default", "authors", 7002), got, protocmp.Transform()))

	store.SetManifests(resources(t, `
apiVersion: v1
kind: Service
metadata: {name: authors, namespace: default}
spec:
  clusterIP: 10.96.0.71
  ports: [{name: a, port: 7001}, {name: b, port: 7002}]
`))
	got, err = recvTimeout(t, w.Recv)
	require.NoError(t, err)
	require.NotNil(t, got.GetProtocol().GetDetect(), "the Service's policy: %v", got.GetProtocol())
	assert.Equal(t, uint32(7002), got.GetMetadata().GetResource().GetPort())
	assert.NotEmpty(t, got.GetProtocol().GetDetect().GetHttp1().GetRoutes())

	store.SetManifests(resources(t))
	_, err = recvTimeout(t, w.Recv)
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	assert.Equal(t, "unknown target", status.Convert(err).Message())
}

// An OutboundPolicies stream of an address outside the cluster forwards to
// the address alone while no workload is there. When a workload appears
// at it (written into the endpoints, as a registration writes it), the
// stream sends the fallback again with the workload's identity on its
// forward, the endpoint its profile has: a client that watched the
// address before the workload came reaches it over mTLS, as one that asks
// afterwards does through the profile. When the workload goes, the
// stream forwards to the address alone again.
func TestFallbackStreamFollowsAWorkloadAtItsAddress(t *testing.T) {
	const addr = "127.0.0.1:7081"
	store := NewStore()
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	cc, err := grpc.NewClient(cp.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	policies := outboundpb.NewOutboundPoliciesClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	w, err := policies.Watch(ctx, &outboundpb.TrafficSpec{SourceWorkload: "default:web-0",
		Target: &outboundpb.TrafficSpec_Addr{Addr: tcpAddr(t, addr)}})
	require.NoError(t, err)
	got, err := recvTimeout(t, w.Recv)
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(wantEgressFallback(t, addr), got, protocmp.Transform()), "before the workload")

	const id = "books.default.serviceaccount.identity.linkerd.cluster.local"
	store.PutEndpoints("books.default.svc.cluster.local:7081",
		[]endpoint.Endpoint{{Addr: netip.MustParseAddrPort(addr), Identity: id}})
	got, err = recvTimeout(t, w.Recv)
	require.NoError(t, err)
	for _, route := range [][]*outboundpb.HttpRoute{got.GetProtocol().GetDetect().GetHttp1().GetRoutes(), got.GetProtocol().GetDetect().GetHttp2().GetRoutes()} {
		require.Len(t, route, 1)
		fwd := route[0].GetRules()[0].GetBackends().GetFirstAvailable().GetBackends()[0].GetBackend().GetForward()
		assert.Equal(t, id, fwd.GetTlsIdentity().GetDnsLikeIdentity().GetName(), "the workload's identity on the forward")
		assert.Equal(t, tcpAddr(t, addr).String(), fwd.GetAddr().String())
	}
	fwd := got.GetProtocol().GetDetect().GetOpaque().GetRoutes()[0].GetRules()[0].GetBackends().GetFirstAvailable().GetBackends()[0].GetBackend().GetForward()
	assert.Equal(t, id, fwd.GetTlsIdentity().GetDnsLikeIdentity().GetName(), "the opaque route's forward too")

	// A new lookup of the address is now in the cluster: NotFound, and the
	// profile's endpoint carries the identity.
	_, err = policies.Get(ctx, &outboundpb.TrafficSpec{SourceWorkload: "default:web-0",
		Target: &outboundpb.TrafficSpec_Addr{Addr: tcpAddr(t, addr)}})
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)

	store.PutEndpoints("books.default.svc.cluster.local:7081", nil)
	got, err = recvTimeout(t, w.Recv)
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(wantEgressFallback(t, addr), got, protocmp.Transform()), "after the workload")
}
