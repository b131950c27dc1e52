package destination

import (
	"context"
	"fmt"

	"github.com/inmesh/inmesh/destination/outboundpb"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/policy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// SetManifests replaces the Services and routes that the OutboundPolicies
// API serves; every open stream gets the new policy of its target.
func (s *Store) SetManifests(r *manifest.Resources) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.manifests = r
	s.notifyLocked()
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
// names no known Service port, and a channel closed on the next change.
func (s *Store) outboundPolicy(authority string) (*policy.Policy, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	ns, name, port, ok := manifest.ParseAuthority(authority)
	if !ok || s.manifests == nil {
		return nil, s.changed
	}
	return s.manifests.Policy(ns, name, port), s.changed
}

// policyServer serves OutboundPolicies from a Store. Targets are
// authorities naming a Service port (name.ns.svc.cluster.local:port, or the
// shorter name.ns.svc:port and name.ns:port). As Linkerd's policy
// controller, it answers NotFound for an authority that names no known
// Service port: the client then keeps its default route, and the watch
// finds the Service once a manifest for it is loaded. An addr target (an
// IP address) is not served (InvalidArgument): the embedded control plane
// knows no Service IPs.
// Its streams end with the Destination streams on [Server.Shutdown].
type policyServer struct {
	outboundpb.UnimplementedOutboundPoliciesServer
	s *Server
}

func target(spec *outboundpb.TrafficSpec) (string, error) {
	switch t := spec.GetTarget().(type) {
	case *outboundpb.TrafficSpec_Authority:
		return t.Authority, nil
	case *outboundpb.TrafficSpec_Addr:
		return "", status.Error(codes.InvalidArgument, "addr targets are not served; name a Service by authority")
	}
	return "", status.Error(codes.InvalidArgument, "target: required")
}

func notFound(authority string) error {
	return status.Error(codes.NotFound, fmt.Sprintf("no policy for %q: no Service manifest names this Service and port", authority))
}

// Get returns the current policy of the target.
func (s *policyServer) Get(_ context.Context, spec *outboundpb.TrafficSpec) (*outboundpb.OutboundPolicy, error) {
	authority, err := target(spec)
	if err != nil {
		return nil, err
	}
	p, _ := s.s.store.outboundPolicy(authority)
	if p == nil {
		return nil, notFound(authority)
	}
	return PolicyToProto(p), nil
}

// Watch streams the policy of the target: the current one at once, then
// each change of the Store that changes it. A Service that goes away ends
// the stream with NotFound.
func (s *policyServer) Watch(spec *outboundpb.TrafficSpec, stream grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error {
	authority, err := target(spec)
	if err != nil {
		return err
	}
	if err := s.s.begin(); err != nil {
		return err
	}
	defer s.s.streams.Done()
	var last *outboundpb.OutboundPolicy
	for {
		p, changed := s.s.store.outboundPolicy(authority)
		if p == nil {
			return notFound(authority)
		}
		msg := PolicyToProto(p)
		if last == nil || !proto.Equal(msg, last) {
			if err := stream.Send(msg); err != nil {
				return err
			}
			last = msg
		}
		select {
		case <-changed:
		case <-s.s.shutdown:
			return errShuttingDown
		case <-stream.Context().Done():
			return nil
		}
	}
}
