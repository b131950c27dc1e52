package destination_test

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/linkerdtest"
	"github.com/inmesh/inmesh/policy"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// linkerdAddrs answers for IP addresses as Linkerd's controllers do:
//   - OutboundPolicies.Watch (policy-controller/grpc/src/outbound.rs lookup,
//     lookup_authority; runtime/src/lib.rs lookup_ip): an addr that is a
//     Service's clusterIP gets the Service's policy, any other addr
//     NotFound "No such service"; an authority that is not
//     <name>.<ns>.svc.<domain> (an IP literal included) NotFound;
//   - GetProfile(ip:port) (controller/api/destination/server.go
//     getProfileByIP): the Service's profile for its clusterIP, else the
//     endpoint profile of the address (the pod's identity, hint and labels
//     when a pod has it, the address alone otherwise).
//
// With unimplemented set it is a control plane older than the
// OutboundPolicies API (Linkerd 2.12); unknown changes GetProfile's answer
// for an address that is no Service's and no pod's.
type linkerdAddrs struct {
	pb.UnimplementedDestinationServer
	services      map[netip.AddrPort]*outboundpb.OutboundPolicy
	pods          map[netip.AddrPort]*pb.WeightedAddr
	unimplemented bool
	unknown       linkerdtest.UnknownAnswer

	mu    sync.Mutex
	specs []*outboundpb.TrafficSpec
}

// addrPolicies is the OutboundPolicies service of a linkerdAddrs.
type addrPolicies struct {
	outboundpb.UnimplementedOutboundPoliciesServer
	s *linkerdAddrs
}

func (p addrPolicies) Watch(spec *outboundpb.TrafficSpec, stream grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error {
	s := p.s
	s.mu.Lock()
	s.specs = append(s.specs, spec)
	s.mu.Unlock()
	if s.unimplemented {
		return status.Error(codes.Unimplemented, "unknown service io.linkerd.proxy.outbound.OutboundPolicies")
	}
	a, ok := spec.GetTarget().(*outboundpb.TrafficSpec_Addr)
	if !ok {
		return status.Error(codes.NotFound, "authority must be of the form <name>.<namespace>.svc.cluster.local")
	}
	addr, err := destination.AddrFromProto(a.Addr)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "failed to parse target addr: %v", err)
	}
	svc := s.services[addr]
	if svc == nil {
		return status.Error(codes.NotFound, "No such service")
	}
	if err := stream.Send(svc); err != nil {
		return err
	}
	return block(stream.Context())
}

// Get answers an IP as Linkerd's controller does (server.go Get).
func (s *linkerdAddrs) Get(req *pb.GetDestination, _ grpc.ServerStreamingServer[pb.Update]) error {
	return status.Errorf(codes.InvalidArgument, "IP queries not supported by Get API: host=%s", req.GetPath())
}

func (s *linkerdAddrs) GetProfile(req *pb.GetDestination, stream grpc.ServerStreamingServer[pb.DestinationProfile]) error {
	addr, err := netip.ParseAddrPort(req.GetPath())
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "invalid authority %q", req.GetPath())
	}
	prof := &pb.DestinationProfile{RetryBudget: destination.ProfileToProto(serviceProfile("x").ProfileFor(0)).GetRetryBudget()}
	switch {
	case s.services[addr] != nil:
		prof.FullyQualifiedName = "books.default.svc.cluster.local"
	case s.pods[addr] != nil:
		prof.Endpoint = s.pods[addr]
	case s.unknown == linkerdtest.ProfileNotFound:
		return status.Errorf(codes.NotFound, "no profile for %s", addr)
	case s.unknown == linkerdtest.EndpointProfile:
		prof.Endpoint = &pb.WeightedAddr{Addr: destination.AddrToProto(addr), Weight: 10000}
	}
	if err := stream.Send(prof); err != nil {
		return err
	}
	return block(stream.Context())
}

func (s *linkerdAddrs) sent() []*outboundpb.TrafficSpec {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*outboundpb.TrafficSpec(nil), s.specs...)
}

func serveLinkerdAddrs(t *testing.T, s *linkerdAddrs) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	pb.RegisterDestinationServer(g, s)
	outboundpb.RegisterOutboundPoliciesServer(g, addrPolicies{s: s})
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return lis.Addr().String()
}

// The policy of an IP literal is looked up by address, and where the
// control plane has none the address's profile decides, as in Linkerd's
// proxy (linkerd/app/outbound/src/policy/api.rs Api::call: a socket
// address is sent as TrafficSpec.addr; linkerd/app/outbound/src/discover.rs
// resolver: policy NotFound or Unimplemented -> a forward policy to the
// profile's endpoint with its metadata).
func TestPolicyOfAnIPAddress(t *testing.T) {
	clusterIP := netip.MustParseAddrPort("10.96.0.10:8080")
	pod := netip.MustParseAddrPort("10.42.0.7:8080")
	unknown := netip.MustParseAddrPort("10.42.0.99:8080")
	outside := netip.MustParseAddrPort("192.0.2.1:8080")
	const podID = "books.default.serviceaccount.identity.linkerd.cluster.local"
	podEndpoint := endpoint.Endpoint{
		Addr: pod, Weight: 10000, Identity: podID, H2: true,
		Labels: map[string]string{"namespace": "default", "pod": "books-0", "serviceaccount": "books"},
	}
	svcPolicy := resources(t, authorsServiceYAML).Policy("default", "authors", 7001)

	for _, tc := range []struct {
		name, upstream string
		target         netip.AddrPort
		unimplemented  bool
		unknown        linkerdtest.UnknownAnswer
		// wantParent is the parent of the policy delivered; "" for none.
		wantParent string
		// wantForward is the endpoint the delivered policy forwards to.
		wantForward *endpoint.Endpoint
		// wantAsked: the control plane was asked, by address.
		wantAsked bool
	}{
		{
			name: "a Service's clusterIP gets the Service's policy", upstream: "outbound.rs lookup_ip; api.rs Addr::Socket",
			target: clusterIP, wantParent: "authors", wantAsked: true,
		},
		{
			name: "a pod's address forwards to the profile's endpoint", upstream: "discover.rs: NotFound -> spawn_synthesized_profile_policy",
			target: pod, wantParent: "endpoint", wantForward: &podEndpoint, wantAsked: true,
		},
		{
			name: "a control plane without the API: the profile's endpoint", upstream: "discover.rs: Unimplemented -> spawn_synthesized_profile_policy",
			target: pod, unimplemented: true, wantParent: "endpoint", wantForward: &podEndpoint, wantAsked: true,
		},
		{
			name: "an address no workload has: its endpoint is the address alone", upstream: "server.go getProfileByIP -> subscribeToEndpointProfile(nil)",
			target: unknown, wantParent: "endpoint", wantForward: &endpoint.Endpoint{Addr: unknown, Weight: 10000}, wantAsked: true,
		},
		{
			name: "an address whose profile names no endpoint: the address itself", upstream: "discover.rs: profile.endpoint None -> (orig_dst, default metadata)",
			target: unknown, unknown: linkerdtest.ProfileWithoutEndpoint, wantParent: "endpoint", wantForward: &endpoint.Endpoint{Addr: unknown, Weight: 10000}, wantAsked: true,
		},
		{
			name: "an address without a profile: the address itself", upstream: "discover.rs: no profile -> spawn_synthesized_origdst_policy",
			target: unknown, unknown: linkerdtest.ProfileNotFound, wantParent: "endpoint", wantForward: &endpoint.Endpoint{Addr: unknown, Weight: 10000}, wantAsked: true,
		},
		{
			name: "a control plane without the API, no endpoint: the address itself", upstream: "discover.rs: Unimplemented, profile.endpoint None -> orig_dst",
			target: unknown, unimplemented: true, unknown: linkerdtest.ProfileWithoutEndpoint, wantParent: "endpoint", wantForward: &endpoint.Endpoint{Addr: unknown, Weight: 10000}, wantAsked: true,
		},
		{
			name: "an address outside the search networks is not asked for", upstream: "LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS",
			target: outside,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &linkerdAddrs{
				services:      map[netip.AddrPort]*outboundpb.OutboundPolicy{clusterIP: destination.PolicyToProto(svcPolicy)},
				pods:          map[netip.AddrPort]*pb.WeightedAddr{pod: destination.EndpointToProto(podEndpoint)},
				unimplemented: tc.unimplemented,
				unknown:       tc.unknown,
			}
			c := newTestClient(t, serveLinkerdAddrs(t, srv), destination.WithLinkerdStreams(),
				destination.WithSearchNetworks(netip.MustParsePrefix("10.0.0.0/8")))
			rec := newRecorder[policy.Update]()
			stop, err := c.Policies().Watch(context.Background(), tc.target.String(), rec.update)
			require.NoError(t, err)
			defer stop()
			u := rec.waitFor(t, "the first update", func(policy.Update) bool { return true })

			if tc.wantParent == "" {
				assert.Nil(t, u.Policy)
			} else {
				require.NotNil(t, u.Policy, "%+v (%s)", u, tc.upstream)
				assert.Equal(t, tc.wantParent, u.Policy.Parent.Name, tc.upstream)
			}
			if tc.wantForward != nil {
				assert.Equal(t, policy.DefaultMetadata("endpoint"), u.Policy.Parent)
				for _, p := range []policy.HTTPProtocol{u.Policy.HTTP1, u.Policy.HTTP2} {
					require.Len(t, p.Routes, 1)
					require.Len(t, p.Routes[0].Rules, 1)
					r := p.Routes[0].Rules[0]
					assert.Empty(t, r.Matches, "every request")
					assert.Empty(t, r.Filters)
					require.Len(t, r.Backends.Backends, 1)
					b := r.Backends.Backends[0].Backend
					assert.Nil(t, b.Balancer)
					require.NotNil(t, b.Forward)
					assert.Equal(t, *tc.wantForward, *b.Forward, tc.upstream)
				}
				_, err := policy.Compile(u.Policy, policy.Options{})
				assert.NoError(t, err)
			}

			specs := srv.sent()
			if !tc.wantAsked {
				assert.Empty(t, specs)
				return
			}
			require.NotEmpty(t, specs)
			for _, s := range specs {
				assert.Empty(t, s.GetAuthority(), "an IP is asked for as an addr")
				got, err := destination.AddrFromProto(s.GetAddr())
				require.NoError(t, err)
				assert.Equal(t, tc.target, got)
			}
		})
	}
}

// Against the embedded control plane, a Service's clusterIP (from its
// manifest) gets the Service's policy, and an address no Service has gets
// a policy that forwards to its endpoint, with the identity of the
// workload registered at it.
func TestPolicyOfAnIPAddressEmbedded(t *testing.T) {
	store := controlplane.NewStore()
	store.SetManifests(resources(t, `
apiVersion: v1
kind: Service
metadata: {name: authors, namespace: default}
spec:
  clusterIP: 10.96.0.71
  ports: [{port: 7001}]
`))
	const id = "authors.default.serviceaccount.identity.linkerd.cluster.local"
	store.PutEndpoints(authorsAuthority, []endpoint.Endpoint{{Addr: netip.MustParseAddrPort("10.42.0.8:7001"), Weight: 10000, Identity: id}})
	cp := servePolicies(t, holdListener(t), store)
	c := newTestClient(t, cp.addr, destination.WithLinkerdStreams(), destination.WithSearchNetworks(netip.MustParsePrefix("10.0.0.0/8")))

	rec := newRecorder[policy.Update]()
	stop, err := c.Policies().Watch(context.Background(), "10.96.0.71:7001", rec.update)
	require.NoError(t, err)
	defer stop()
	u := rec.waitFor(t, "the Service's policy", func(u policy.Update) bool { return u.Policy != nil })
	assert.Equal(t, policy.Metadata{Group: "core", Kind: "Service", Namespace: "default", Name: "authors", Port: 7001}, u.Policy.Parent)

	rec = newRecorder[policy.Update]()
	stop, err = c.Policies().Watch(context.Background(), "10.42.0.8:7001", rec.update)
	require.NoError(t, err)
	defer stop()
	u = rec.waitFor(t, "the endpoint's policy", func(u policy.Update) bool { return u.Policy != nil })
	assert.Equal(t, policy.DefaultMetadata("endpoint"), u.Policy.Parent)
	f := u.Policy.HTTP1.Routes[0].Rules[0].Backends.Backends[0].Backend.Forward
	require.NotNil(t, f)
	assert.Equal(t, netip.MustParseAddrPort("10.42.0.8:7001"), f.Addr)
	assert.Equal(t, id, f.Identity)
}

// The forward policy of a pod's address follows the pod's profile: a new
// identity in its endpoint gives a new policy, a profile that repeats the
// endpoint none, as Linkerd's proxy synthesizes a policy on each profile
// change (discover.rs spawn_synthesized_profile_policy).
func TestPolicyOfAPodFollowsItsProfile(t *testing.T) {
	pod := netip.MustParseAddrPort("10.42.0.7:8080")
	ep := func(id string) *pb.DestinationProfile {
		return &pb.DestinationProfile{Endpoint: destination.EndpointToProto(endpoint.Endpoint{Addr: pod, Weight: 10000, Identity: id})}
	}
	next := make(chan *pb.DestinationProfile)
	dst := newScripted()
	dst.profile = func(_ int, _ *pb.GetDestination, s grpc.ServerStreamingServer[pb.DestinationProfile]) error {
		for {
			select {
			case m := <-next:
				if err := s.Send(m); err != nil {
					return err
				}
			case <-s.Context().Done():
				return nil
			}
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	pb.RegisterDestinationServer(g, dst)
	outboundpb.RegisterOutboundPoliciesServer(g, addrPolicies{s: &linkerdAddrs{}})
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	defer func() { g.Stop(); <-done }()

	c := newTestClient(t, lis.Addr().String(), destination.WithLinkerdStreams(),
		destination.WithSearchNetworks(netip.MustParsePrefix("10.0.0.0/8")))
	rec := newRecorder[policy.Update]()
	stop, err := c.Policies().Watch(context.Background(), pod.String(), rec.update)
	require.NoError(t, err)
	defer stop()
	forwardsTo := func(id string) func(policy.Update) bool {
		return func(u policy.Update) bool {
			if u.Policy == nil || len(u.Policy.HTTP1.Routes) == 0 {
				return false
			}
			f := u.Policy.HTTP1.Routes[0].Rules[0].Backends.Backends[0].Backend.Forward
			return f != nil && f.Identity == id
		}
	}
	const a, b = "a.default.serviceaccount.identity.linkerd.cluster.local", "b.default.serviceaccount.identity.linkerd.cluster.local"
	next <- ep(a)
	rec.waitFor(t, "the policy forwarding to a", forwardsTo(a))
	next <- ep(a)
	next <- ep(b)
	rec.waitFor(t, "the policy forwarding to b", forwardsTo(b))
	assert.Len(t, rec.all(), 2, "the repeated endpoint gave no update")
}
