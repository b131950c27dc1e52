// Package linkerdtest serves, for tests, a control plane that answers for
// IP addresses as Linkerd's controllers do.
package linkerdtest

import (
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// IPControlPlane answers for IP addresses as Linkerd's controllers do, for
// one Service (books, whose clusterIP is VIP) and the pods it is told of:
//   - OutboundPolicies.Watch (policy-controller/grpc/src/outbound.rs
//     lookup, lookup_authority; runtime/src/lib.rs lookup_ip): an addr
//     that is the clusterIP gets the Service's policy, any other addr
//     NotFound "No such service", as from a controller whose cluster
//     networks hold loopback (outside them Linkerd's answers the
//     "egress-fallback" policy); an authority NotFound (no IP literal is
//     a <name>.<ns>.svc.<domain>);
//   - GetProfile(ip:port) (controller/api/destination/server.go
//     getProfileByIP): the endpoint profile of a pod's address (its
//     identity, hint and labels), the Service's profile for the clusterIP
//     (fully_qualified_name set), else the endpoint profile of the address
//     alone;
//   - Get: the Service's endpoints by name; an IP InvalidArgument "IP
//     queries not supported by Get API".
//
// Unknown changes GetProfile's answer for an address that is neither a
// pod's nor the clusterIP, as a controller that knows nothing of it may
// answer. While Gate is open (not closed), GetProfile answers nothing;
// Asked receives the path of each GetProfile call; Gets returns the path
// of each Get call received.
type IPControlPlane struct {
	pb.UnimplementedDestinationServer
	VIP       netip.AddrPort
	Name      string // the Service's authority, books.default.svc.cluster.local:port
	Policy    *outboundpb.OutboundPolicy
	Endpoints []endpoint.Endpoint
	Pods      map[netip.AddrPort]endpoint.Endpoint
	// Profile is the Service's ServiceProfile (its routes), given for the
	// clusterIP with the Service's name when set.
	Profile *profiles.Profile
	Unknown UnknownAnswer
	Gate    chan struct{}
	Asked   chan string

	mu   sync.Mutex
	gets []string
}

// UnknownAnswer is how an IPControlPlane's GetProfile answers an address
// it knows nothing of.
type UnknownAnswer int

const (
	// EndpointProfile is the endpoint profile of the address alone, as
	// Linkerd's controller answers (the zero value).
	EndpointProfile UnknownAnswer = iota
	// ProfileWithoutEndpoint is a profile that names no endpoint.
	ProfileWithoutEndpoint
	// ProfileNotFound ends the stream with NotFound.
	ProfileNotFound
)

// Gets returns the path of each Get call received so far, in order.
func (c *IPControlPlane) Gets() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.gets...)
}

// GetProfile implements the Destination service.
func (c *IPControlPlane) GetProfile(req *pb.GetDestination, s grpc.ServerStreamingServer[pb.DestinationProfile]) error {
	select {
	case c.Asked <- req.GetPath():
	default:
	}
	if c.Gate != nil {
		select {
		case <-c.Gate:
		case <-s.Context().Done():
			return nil
		}
	}
	addr, err := netip.ParseAddrPort(req.GetPath())
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "invalid authority %q", req.GetPath())
	}
	prof := &pb.DestinationProfile{}
	if ep, ok := c.Pods[addr]; ok {
		prof.Endpoint = destination.EndpointToProto(ep)
	} else if addr == c.VIP {
		if c.Profile != nil {
			prof = destination.ProfileToProto(c.Profile)
		}
		prof.FullyQualifiedName = "books.default.svc.cluster.local"
	} else {
		switch c.Unknown {
		case ProfileNotFound:
			return status.Errorf(codes.NotFound, "no profile for %s", addr)
		case EndpointProfile:
			prof.Endpoint = destination.EndpointToProto(endpoint.Endpoint{Addr: addr, Weight: endpoint.DefaultWeight})
		}
	}
	if err := s.Send(prof); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// Get implements the Destination service.
func (c *IPControlPlane) Get(req *pb.GetDestination, s grpc.ServerStreamingServer[pb.Update]) error {
	c.mu.Lock()
	c.gets = append(c.gets, req.GetPath())
	c.mu.Unlock()
	if req.GetPath() != c.Name {
		host, _, _ := net.SplitHostPort(req.GetPath())
		return status.Errorf(codes.InvalidArgument, "IP queries not supported by Get API: host=%s", host)
	}
	set := &pb.WeightedAddrSet{MetricLabels: map[string]string{"namespace": "default", "service": "books"}}
	for _, e := range c.Endpoints {
		set.Addrs = append(set.Addrs, destination.EndpointToProto(e))
	}
	if err := s.Send(&pb.Update{Update: &pb.Update_Add{Add: set}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// policies is the OutboundPolicies service of an IPControlPlane.
type policies struct {
	outboundpb.UnimplementedOutboundPoliciesServer
	c *IPControlPlane
}

func (p policies) Watch(spec *outboundpb.TrafficSpec, s grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error {
	a, ok := spec.GetTarget().(*outboundpb.TrafficSpec_Addr)
	if !ok {
		return status.Error(codes.NotFound, "authority must be of the form <name>.<namespace>.svc.cluster.local")
	}
	if addr, err := destination.AddrFromProto(a.Addr); err != nil || addr != p.c.VIP || p.c.Policy == nil {
		return status.Error(codes.NotFound, "No such service")
	}
	if err := s.Send(p.c.Policy); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// Serve serves the control plane's Destination and OutboundPolicies on a
// loopback port the kernel picks, until the test ends, and returns its
// address.
func (c *IPControlPlane) Serve(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c.ServeOn(t, lis)
	return lis.Addr().String()
}

// ServeOn serves the control plane on lis until the test ends.
func (c *IPControlPlane) ServeOn(t testing.TB, lis net.Listener) {
	if c.Asked == nil {
		c.Asked = make(chan string, 16)
	}
	g := grpc.NewServer()
	pb.RegisterDestinationServer(g, c)
	outboundpb.RegisterOutboundPoliciesServer(g, policies{c: c})
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
}
