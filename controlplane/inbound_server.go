package controlplane

import (
	"context"
	"errors"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// inboundServer serves InboundServerPolicies from a Store: the Server of a
// pod's port, as Linkerd's controller computes it from the Pod, Server,
// AuthorizationPolicy, authentication, route and rate-limit manifests
// (manifest.Resources.InboundServer), with Linkerd's defaults. The
// workload is "ns:pod" or Linkerd's JSON form; an unknown pod is NotFound,
// a bad workload or port InvalidArgument.
type inboundServer struct {
	inboundpb.UnimplementedInboundServerPoliciesServer
	s *Server
}

func portSpec(spec *inboundpb.PortSpec) (ns, pod string, port uint16, err error) {
	ns, pod, ok := parseWorkload(spec.GetWorkload())
	if !ok {
		return "", "", 0, status.Error(codes.InvalidArgument, "Invalid workload: "+spec.GetWorkload())
	}
	if spec.GetPort() == 0 || spec.GetPort() > 0xffff {
		return "", "", 0, status.Error(codes.InvalidArgument, "port outside valid range")
	}
	return ns, pod, uint16(spec.GetPort()), nil
}

// SetInboundOptions sets the cluster's settings the InboundServerPolicies
// API computes Servers with (Linkerd's controller flags: the default
// inbound policy, the cluster and probe networks, the trust domain and
// control-plane namespace of identities); the open streams whose Server
// differs get the new one, and only those are woken.
func (s *Store) SetInboundOptions(o manifest.InboundOptions) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	prev := s.inbound
	s.inbound = o
	s.manifestsChangedLocked(s.manifests, prev)
}

// inboundPolicy returns the Server of a pod port. A stream watches it under
// inboundKey(ns, pod, port).
func (s *Store) inboundPolicy(ns, pod string, port uint16) (*authz.Server, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	r := s.manifests
	if r == nil {
		r = &manifest.Resources{}
	}
	srv, err := r.InboundServer(ns, pod, port, s.inbound)
	return srv, err
}

func inboundError(err error) error {
	if errors.Is(err, manifest.ErrUnknownPod) {
		return status.Error(codes.NotFound, err.Error())
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

// GetPort returns the current Server of the port.
func (s *inboundServer) GetPort(_ context.Context, spec *inboundpb.PortSpec) (*inboundpb.Server, error) {
	ns, pod, port, err := portSpec(spec)
	if err != nil {
		return nil, err
	}
	srv, err := s.s.store.inboundPolicy(ns, pod, port)
	if err != nil {
		return nil, inboundError(err)
	}
	return destination.ServerToProto(srv), nil
}

// WatchPort streams the Server of the port: the current one at once, then
// each change of the Store that changes it.
func (s *inboundServer) WatchPort(spec *inboundpb.PortSpec, stream grpc.ServerStreamingServer[inboundpb.Server]) error {
	ns, pod, port, err := portSpec(spec)
	if err != nil {
		return err
	}
	return serveFeed(s.s, stream, feed{keys: []watchKey{inboundKey(ns, pod, port)}, next: latest(func() (proto.Message, error) {
		srv, err := s.s.store.inboundPolicy(ns, pod, port)
		if err != nil {
			return nil, inboundError(err)
		}
		return destination.ServerToProto(srv), nil
	})})
}
