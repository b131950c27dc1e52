package controlplane

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/policy"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
// Linkerd's controller; one that does not exist has none
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
// shorter name.ns.svc:port and name.ns:port; port 80 when none is given).
// As Linkerd's policy controller, it serves the default policy for a
// Service it has no manifest of (one the endpoint sets name), or a port the
// Service does not declare, and sends the Service's policy once a manifest
// for it is loaded; it answers NotFound "unknown target" for a Service
// that does not exist, NotFound for an authority that names no Service, and
// InvalidArgument for a missing target or source workload (see target).
// Its streams end with the Destination streams on [Server.Shutdown].
type policyServer struct {
	outboundpb.UnimplementedOutboundPoliciesServer
	s *Server
}

// target checks a TrafficSpec as Linkerd's policy controller does
// (policy-controller/grpc/src/outbound.rs lookup and workload.rs), with its
// codes and messages, and returns the authority of the Service it names:
// the target is required, the source workload must be "ns:pod" or JSON
// naming ns and a pod or an external_workload, and an authority must name
// a Service, port 80 when it has none. An addr target is a Service's
// clusterIP and port (see addrTarget).
func (s *Server) target(spec *outboundpb.TrafficSpec) (string, error) {
	if spec.GetTarget() == nil {
		return "", status.Error(codes.InvalidArgument, "target is required")
	}
	if !validWorkload(spec.GetSourceWorkload()) {
		return "", status.Error(codes.InvalidArgument, "Invalid workload: "+spec.GetSourceWorkload())
	}
	switch t := spec.GetTarget().(type) {
	case *outboundpb.TrafficSpec_Authority:
		authority := t.Authority
		host, port, err := net.SplitHostPort(authority)
		if err != nil {
			host, port = strings.TrimSuffix(authority, ":"), "80"
		}
		if host == "" {
			return "", status.Error(codes.InvalidArgument, "authority must have a host")
		}
		authority = net.JoinHostPort(host, port)
		svcHost := strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(host), "."), ".cluster.local")
		if _, _, _, ok := manifest.ParseAuthority(authority); !ok || !strings.HasSuffix(svcHost, ".svc") {
			return "", status.Error(codes.NotFound, "authority must be of the form <name>.<namespace>.svc.cluster.local")
		}
		return authority, nil
	case *outboundpb.TrafficSpec_Addr:
		return s.addrTarget(t.Addr)
	}
	return "", status.Error(codes.InvalidArgument, "target is required")
}

// addrTarget returns the authority of the Service whose clusterIP (from
// its manifest's spec.clusterIP) an addr target names, as Linkerd's policy
// controller looks an address up (policy-controller/grpc/src/outbound.rs
// lookup, runtime/src/lib.rs lookup_ip): the port must be 1-65535 and the
// IP set; an address that is no Service's clusterIP is NotFound "No such
// service". A port the Service does not declare gets the policy its
// authority gets (the default one), where Linkerd's controller answers an
// opaque policy that refuses the connection ("undefined-port"), which the
// policy model cannot say. Linkerd's controller serves a fallback policy (forward to the
// address) for one outside the cluster's networks, which the embedded
// control plane does not know; a client that gets NotFound sends the
// request to the address all the same. The Service is looked up when the
// stream opens; one that goes away ends the stream (see policyFeed).
func (s *Server) addrTarget(addr *pb.TcpAddress) (string, error) {
	if addr.GetPort() > 0xffff {
		return "", status.Error(codes.InvalidArgument, "port outside valid range")
	}
	if addr.GetPort() == 0 {
		return "", status.Error(codes.InvalidArgument, "port cannot be zero")
	}
	if addr.GetIp() == nil {
		return "", status.Error(codes.InvalidArgument, "traffic target must have an IP")
	}
	ap, err := destination.AddrFromProto(addr)
	if err != nil {
		return "", status.Errorf(codes.InvalidArgument, "failed to parse target addr: %v", err)
	}
	ref, ok, err := s.store.serviceOfIP(ap.Addr().Unmap())
	if err != nil {
		return "", err
	}
	if !ok {
		return "", status.Error(codes.NotFound, "No such service")
	}
	return net.JoinHostPort(ref.fqdn(), strconv.Itoa(int(ap.Port()))), nil
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
	authority, err := s.s.target(spec)
	if err != nil {
		return nil, err
	}
	source, _, _ := parseWorkload(spec.GetSourceWorkload())
	p := s.s.store.outboundPolicy(source, authority)
	if p == nil {
		return nil, status.Error(codes.NotFound, "unknown target")
	}
	return destination.PolicyToProto(p), nil
}

// Watch streams the policy of the target: the current one at once, then
// each change of the Store that changes it. A Service that goes away ends
// the stream with NotFound.
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
	authority, err := s.target(spec)
	if err != nil {
		return feed{}, err
	}
	source, _, _ := parseWorkload(spec.GetSourceWorkload())
	var keys []watchKey
	if ns, name, port, ok := manifest.ParseAuthority(authority); ok {
		keys = append(keys, serviceKey(serviceRef{ns: ns, name: name}), policyKey(source, ns, name, port))
	}
	return feed{keys: keys, next: latest(func() (proto.Message, error) {
		p := s.store.outboundPolicy(source, authority)
		if p == nil {
			return nil, status.Error(codes.NotFound, "unknown target")
		}
		return destination.PolicyToProto(p), nil
	})}, nil
}
