package controlplane

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/inmesh/inmesh/authz"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/policy"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/httproutepb"
	"github.com/inmesh/inmesh/proxyapi/opaqueroutepb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// SetManifests replaces the Services and routes that the OutboundPolicies
// API serves; the open streams whose answer differs get the new one, and
// only those are woken.
func (s *Store) SetManifests(r *manifest.Resources) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	prev := s.manifests
	s.manifests = r
	s.indexClusterIPsLocked(r)
	s.manifestsChangedLocked(prev, s.inbound)
}

// LoadManifests reads Service, HTTPRoute and GRPCRoute manifest files and,
// when all of them are good, makes them what the OutboundPolicies API
// serves. On error the store is unchanged and the error names the file,
// the document and the field.
func (s *Store) LoadManifests(paths ...string) error {
	r, err := manifest.Load(paths...)
	if err != nil {
		return err
	}
	s.SetManifests(r)
	return nil
}

// outboundPolicy returns the policy of a target authority, or nil when it
// names no Service that exists (see Store.serviceLocked). A stream watches
// it under serviceKey of the Service. A Service known only from the endpoint sets,
// or a port it does not declare, gets the default policy, as from
// Linkerd's controller for the Service's authority (its clusterIP on
// such a port gets undeclaredPortPolicy instead, see targetPolicy); one that does not exist has none
// (policy-controller/grpc/src/outbound.rs answers it NotFound "unknown
// target").
//
// source is the client's namespace: routes in another namespace than the
// Service's apply to the clients of theirs alone ([manifest.Resources.PolicyFrom]).
func (s *Store) outboundPolicy(source, authority string) *policy.Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	ns, name, port, ok := manifest.ParseAuthority(authority)
	if !ok {
		return nil
	}
	if _, exists := s.serviceLocked(serviceRef{ns: ns, name: name}); !exists {
		return nil
	}
	r := s.manifests
	if r == nil {
		r = &manifest.Resources{}
	}
	return r.PolicyFrom(source, ns, name, port)
}

// policyServer serves OutboundPolicies from a Store. Targets are
// authorities naming a Service port (name.ns.svc.cluster.local:port, or the
// shorter name.ns.svc:port and name.ns:port; port 80 when none is given),
// or addresses (see addrTarget).
// As Linkerd's policy controller, it serves the default policy for a
// Service it has no manifest of (one the endpoint sets name), or a port the
// Service's authority names that the Service does not declare, and sends
// the Service's policy once a manifest for it is loaded; the Service's
// clusterIP on a port it does not declare gets a policy that refuses the
// connection, and an address outside the cluster one that forwards to
// it; it answers NotFound "unknown target" for a Service
// that does not exist, NotFound for an authority that names no Service or
// an address in the cluster that is no Service's clusterIP, and
// InvalidArgument for a missing target or source workload (see target).
// Its streams end with the Destination streams on [Server.Shutdown].
type policyServer struct {
	outboundpb.UnimplementedOutboundPoliciesServer
	s *Server
}

// policyTarget is what an OutboundPolicies request names, as Linkerd's
// policy controller tells its targets apart
// (policy-controller/core/src/outbound/target.rs OutboundDiscoverTarget):
// a Service port, a Service's clusterIP on a port the Service does not
// declare, or an address outside the cluster.
type policyTarget struct {
	// authority names the Service port (name.ns.svc.cluster.local:port),
	// "" for an address outside the cluster.
	authority string
	// undeclared: the target is the Service's clusterIP on a port the
	// Service does not declare.
	undeclared bool
	// external is the address outside the cluster, when authority is "".
	external netip.AddrPort
}

// target checks a TrafficSpec as Linkerd's policy controller does
// (policy-controller/grpc/src/outbound.rs lookup and workload.rs), with its
// codes and messages, and returns what it names: the target is required,
// the source workload must be "ns:pod" or JSON naming ns and a pod or an
// external_workload, and an authority must name a Service, port 80 when it
// has none. An addr target is looked up by address (see addrTarget).
func (s *Server) target(spec *outboundpb.TrafficSpec) (policyTarget, error) {
	if spec.GetTarget() == nil {
		return policyTarget{}, status.Error(codes.InvalidArgument, "target is required")
	}
	if !validWorkload(spec.GetSourceWorkload()) {
		return policyTarget{}, status.Error(codes.InvalidArgument, "Invalid workload: "+spec.GetSourceWorkload())
	}
	switch t := spec.GetTarget().(type) {
	case *outboundpb.TrafficSpec_Authority:
		authority := t.Authority
		host, port, err := net.SplitHostPort(authority)
		if err != nil {
			host, port = strings.TrimSuffix(authority, ":"), "80"
		}
		if host == "" {
			return policyTarget{}, status.Error(codes.InvalidArgument, "authority must have a host")
		}
		authority = net.JoinHostPort(host, port)
		svcHost := strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(host), "."), ".cluster.local")
		if _, _, _, ok := manifest.ParseAuthority(authority); !ok || !strings.HasSuffix(svcHost, ".svc") {
			return policyTarget{}, status.Error(codes.NotFound, "authority must be of the form <name>.<namespace>.svc.cluster.local")
		}
		return policyTarget{authority: authority}, nil
	case *outboundpb.TrafficSpec_Addr:
		return s.addrTarget(t.Addr)
	}
	return policyTarget{}, status.Error(codes.InvalidArgument, "target is required")
}

// addrTarget looks an addr target up as Linkerd's policy controller does
// (policy-controller/grpc/src/outbound.rs lookup, runtime/src/lib.rs
// lookup_ip, k8s/index/src/outbound/index.rs lookup_service and
// is_address_in_cluster): the port must be 1-65535 and the IP set. The
// clusterIP of a Service (its manifest's spec.clusterIP) names that
// Service's port, or, on a port the Service does not declare, the
// undeclared port (see undeclaredPortPolicy). Any other address in the
// cluster is NotFound "No such service"; an address outside the cluster
// gets the policy that forwards to it (see egressFallbackPolicy). The
// cluster is the cluster networks (the inbound options'
// ClusterNetworks, Linkerd's default ones when none are set) and, beyond
// Linkerd's controller, whose pods are all in those networks, every IP
// at which an endpoint set or a registration has a workload (on
// loopback, say), so that its workloads are found by their profile's
// endpoint as pods are, with their identity. The Service is looked up
// when the stream opens; one that goes away ends the stream (see
// policyFeed).
func (s *Server) addrTarget(addr *pb.TcpAddress) (policyTarget, error) {
	if addr.GetPort() > 0xffff {
		return policyTarget{}, status.Error(codes.InvalidArgument, "port outside valid range")
	}
	if addr.GetPort() == 0 {
		return policyTarget{}, status.Error(codes.InvalidArgument, "port cannot be zero")
	}
	if addr.GetIp() == nil {
		return policyTarget{}, status.Error(codes.InvalidArgument, "traffic target must have an IP")
	}
	ap, err := destination.AddrFromProto(addr)
	if err != nil {
		return policyTarget{}, status.Errorf(codes.InvalidArgument, "failed to parse target addr: %v", err)
	}
	ip := ap.Addr().Unmap()
	ref, ok, err := s.store.serviceOfIP(ip)
	if err != nil {
		return policyTarget{}, err
	}
	if ok {
		return policyTarget{authority: net.JoinHostPort(ref.fqdn(), strconv.Itoa(int(ap.Port()))),
			undeclared: s.store.undeclaredPort(ref, uint32(ap.Port()))}, nil
	}
	if !s.store.inCluster(ip) {
		return policyTarget{external: ap}, nil
	}
	return policyTarget{}, status.Error(codes.NotFound, "No such service")
}

// inCluster reports whether ip is in the cluster (see addrTarget): in
// the cluster networks, or the IP of a workload of the endpoint sets or
// registrations.
func (s *Store) inCluster(ip netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	networks := s.inbound.ClusterNetworks
	if networks == nil {
		networks = authz.DefaultClusterNetworks
	}
	for _, n := range networks {
		if n.Contains(ip) {
			return true
		}
	}
	x := s.atIPLocked(ip)
	return x != nil && len(x.served) > 0
}

// undeclaredPort reports whether the Service ref exists and does not
// define port (see definesPortLocked), as GetProfile finds it.
func (s *Store) undeclaredPort(ref serviceRef, port uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	svc, ok := s.serviceLocked(ref)
	return ok && !s.definesPortLocked(ref, svc, port)
}

// undeclaredPortPolicy is the policy of a Service's clusterIP on a port
// the Service does not declare, as Linkerd's policy controller answers it
// (policy-controller/grpc/src/outbound.rs undefined_port): the Service
// port as its parent, and the opaque protocol (no detection, so no
// timeout) with one route, "undefined-port" (default metadata), of one
// rule with no backend (an empty distribution) and a Forbidden filter:
// Linkerd's proxy refuses the connection.
func undeclaredPortPolicy(ref serviceRef, port uint32) *outboundpb.OutboundPolicy {
	return &outboundpb.OutboundPolicy{
		Metadata: &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{
			Group: "core", Kind: "Service", Name: ref.name, Namespace: ref.ns, Port: port}}},
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

// The detection timeout and the backend's queue of the egress fallback
// policy (policy-controller/grpc/src/outbound.rs fallback and
// default_queue_config).
const (
	fallbackDetectTimeout   = 10 * time.Second
	fallbackQueueCapacity   = 100
	fallbackFailFastTimeout = 3 * time.Second
)

// egressFallbackPolicy is the policy of an address outside the cluster,
// as Linkerd's policy controller answers it
// (policy-controller/grpc/src/outbound.rs fallback): "egress-fallback"
// (default metadata) as the parent, every route and the backend; the
// detected protocol (timeout 10 s) whose opaque route and whose one HTTP
// route for HTTP/1 and HTTP/2 (no hosts, one rule that matches every
// request, no filters, timeouts or retry) go to one backend that forwards
// to the address itself (weight 1, no identity nor hint), with a queue of
// 100 requests that fails fast after 3 s.
//
// to is the address's endpoint: the address alone, or, on the stream of an
// address where a workload has appeared since (see
// [Store.fallbackEndpoint]), the workload with its identity.
func egressFallbackPolicy(to *pb.WeightedAddr) *outboundpb.OutboundPolicy {
	meta := func() *pb.Metadata { return &pb.Metadata{Kind: &pb.Metadata_Default{Default: "egress-fallback"}} }
	backend := func() *outboundpb.Backend {
		return &outboundpb.Backend{
			Metadata: meta(),
			Queue:    &outboundpb.Queue{Capacity: fallbackQueueCapacity, FailfastTimeout: durationpb.New(fallbackFailFastTimeout)},
			Kind:     &outboundpb.Backend_Forward{Forward: proto.CloneOf(to)},
		}
	}
	httpRoutes := func() []*outboundpb.HttpRoute {
		return []*outboundpb.HttpRoute{{
			Metadata: meta(),
			Rules: []*outboundpb.HttpRoute_Rule{{
				Matches: []*httproutepb.HttpRouteMatch{{}},
				Backends: &outboundpb.HttpRoute_Distribution{Kind: &outboundpb.HttpRoute_Distribution_FirstAvailable_{
					FirstAvailable: &outboundpb.HttpRoute_Distribution_FirstAvailable{
						Backends: []*outboundpb.HttpRoute_RouteBackend{{Backend: backend()}}}}},
			}},
		}}
	}
	return &outboundpb.OutboundPolicy{
		Metadata: meta(),
		Protocol: &outboundpb.ProxyProtocol{Kind: &outboundpb.ProxyProtocol_Detect_{Detect: &outboundpb.ProxyProtocol_Detect{
			Timeout: durationpb.New(fallbackDetectTimeout),
			Opaque: &outboundpb.ProxyProtocol_Opaque{Routes: []*outboundpb.OpaqueRoute{{
				Metadata: meta(),
				Rules: []*outboundpb.OpaqueRoute_Rule{{
					Backends: &outboundpb.OpaqueRoute_Distribution{Kind: &outboundpb.OpaqueRoute_Distribution_FirstAvailable_{
						FirstAvailable: &outboundpb.OpaqueRoute_Distribution_FirstAvailable{
							Backends: []*outboundpb.OpaqueRoute_RouteBackend{{Backend: backend()}}}}},
				}},
			}}},
			Http1: &outboundpb.ProxyProtocol_Http1{Routes: httpRoutes()},
			Http2: &outboundpb.ProxyProtocol_Http2{Routes: httpRoutes()},
		}}},
	}
}

// fallbackEndpoint is the endpoint that the egress fallback of addr
// forwards to: the address itself, with no identity, while no workload is
// there. A stream of the fallback opened before a workload registered at
// the address, or was written into the endpoints, sends the workload with
// its identity (as its profile's endpoint has it) once it is there, so
// that a client that watched the address first reaches the workload over
// mTLS, as a client that looks the address up afterwards does (that one
// is answered NotFound and takes the profile's endpoint). Linkerd's
// controller, all of whose workloads are in the cluster networks, never
// sees an address leave the outside.
func (s *Store) fallbackEndpoint(addr netip.AddrPort) *pb.WeightedAddr {
	if p, err := s.endpointProfile(addr.Addr(), uint32(addr.Port())); err == nil && p.Endpoint != nil && p.Endpoint.Identity != "" {
		return destination.EndpointToProto(*p.Endpoint)
	}
	return &pb.WeightedAddr{Addr: destination.AddrToProto(addr), Weight: 1}
}

// validWorkload reports whether s is a source workload Linkerd's controller
// accepts.
func validWorkload(s string) bool {
	_, _, ok := parseWorkload(s)
	return ok
}

// parseWorkload splits a workload string as Linkerd's controller reads it
// (policy-controller/grpc/src/workload.rs): "ns:pod", or JSON naming ns
// and a pod or an external_workload; name is the pod or the external
// workload.
func parseWorkload(s string) (ns, name string, ok bool) {
	if strings.HasPrefix(s, "{") {
		var w struct {
			NS       *string `json:"ns"`
			Pod      *string `json:"pod"`
			External *string `json:"external_workload"`
		}
		if json.Unmarshal([]byte(s), &w) != nil || w.NS == nil || (w.Pod != nil) == (w.External != nil) {
			return "", "", false
		}
		if w.Pod != nil {
			return *w.NS, *w.Pod, true
		}
		return *w.NS, *w.External, true
	}
	ns, name, ok = strings.Cut(s, ":")
	return ns, name, ok && ns != "" && name != ""
}

// Get returns the current policy of the target.
func (s *policyServer) Get(_ context.Context, spec *outboundpb.TrafficSpec) (*outboundpb.OutboundPolicy, error) {
	t, err := s.s.target(spec)
	if err != nil {
		return nil, err
	}
	source, _, _ := parseWorkload(spec.GetSourceWorkload())
	return s.s.store.targetPolicy(source, t)
}

// targetPolicy is the current policy of t as the clients of the namespace
// source see it: an address outside the cluster gets the egress
// fallback; the clusterIP of a Service on a port that it does not declare
// (still) the undeclared port's policy; a Service port its policy. A
// Service that does not exist (any more) is NotFound "unknown target".
func (s *Store) targetPolicy(source string, t policyTarget) (*outboundpb.OutboundPolicy, error) {
	if t.authority == "" {
		return egressFallbackPolicy(s.fallbackEndpoint(t.external)), nil
	}
	ns, name, port, ok := manifest.ParseAuthority(t.authority)
	ref := serviceRef{ns: ns, name: name}
	if ok && t.undeclared && s.undeclaredPort(ref, uint32(port)) {
		return undeclaredPortPolicy(ref, uint32(port)), nil
	}
	p := s.outboundPolicy(source, t.authority)
	if p == nil {
		return nil, status.Error(codes.NotFound, "unknown target")
	}
	return destination.PolicyToProto(p), nil
}

// Watch streams the policy of the target: the current one at once, then
// each change of the Store that changes it. A Service that goes away ends
// the stream with NotFound. The stream of a Service's clusterIP on a port
// that the Service does not declare follows the Service's ports: once it
// declares the port, the stream sends the Service's policy, where
// Linkerd's controller keeps its first answer until the stream ends. An
// address outside the cluster keeps its answer, as in Linkerd's
// controller, where only a change of its EgressNetworks (which the
// embedded control plane does not have) ends such a stream.
func (s *policyServer) Watch(spec *outboundpb.TrafficSpec, stream grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error {
	f, err := s.s.policyFeed(spec)
	if err != nil {
		return err
	}
	return serveFeed(s.s, stream, f)
}

// policyFeed is the answer of an OutboundPolicies.Watch request (see
// [policyServer.Watch]), or the status that refuses it.
func (s *Server) policyFeed(spec *outboundpb.TrafficSpec) (feed, error) {
	t, err := s.target(spec)
	if err != nil {
		return feed{}, err
	}
	source, _, _ := parseWorkload(spec.GetSourceWorkload())
	var keys []watchKey
	if ns, name, port, ok := manifest.ParseAuthority(t.authority); ok {
		keys = append(keys, serviceKey(serviceRef{ns: ns, name: name}), policyKey(source, ns, name, port))
	}
	if t.authority == "" {
		// The workloads at the address (see fallbackEndpoint).
		keys = append(keys, addrKey(t.external.Addr()))
	}
	return feed{keys: keys, next: latest(func() (proto.Message, error) {
		return s.store.targetPolicy(source, t)
	})}, nil
}
