package controlplane

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/profiles"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// serviceRef names a Service.
type serviceRef struct{ ns, name string }

func (r serviceRef) fqdn() string { return r.name + "." + r.ns + "." + manifest.ClusterDomain }

// hostAndPort splits a GetDestination path as Linkerd's controller does
// (controller/api/destination/server.go getHostAndPort): a path without a
// colon is a host on port 80; otherwise host:port with a port from 1 to
// 65535. The host is lower-cased, without a trailing dot, and an IPv6
// address loses its brackets.
func hostAndPort(path string) (string, uint32, error) {
	if !strings.Contains(path, ":") {
		return strings.TrimSuffix(strings.ToLower(path), "."), 80, nil
	}
	host, sport, err := net.SplitHostPort(path)
	if err != nil {
		return "", 0, fmt.Errorf("invalid destination: %w", err)
	}
	port, err := strconv.Atoi(sport)
	if err != nil {
		return "", 0, fmt.Errorf("invalid port %s: %w", sport, err)
	}
	if port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("invalid port %d", port)
	}
	return strings.TrimSuffix(strings.ToLower(host), "."), uint32(port), nil
}

// clusterService reads a host as Linkerd's controller does
// (controller/api/destination/server.go parseK8sServiceName):
// name.ns.svc.cluster.local, or instance.name.ns.svc.cluster.local for
// one pod of a Service (instance is then its hostname). A trailing dot has
// been removed already (inmesh's clients may send one).
func clusterService(host string) (svc serviceRef, instance string, err error) {
	labels := strings.Split(host, ".")
	suffix := strings.Split(manifest.ClusterDomain, ".")
	if len(labels) < len(suffix) || strings.Join(labels[len(labels)-len(suffix):], ".") != manifest.ClusterDomain {
		return serviceRef{}, "", fmt.Errorf("name %s does not match cluster domain %s", host, strings.TrimPrefix(manifest.ClusterDomain, "svc."))
	}
	switch len(labels) - len(suffix) {
	case 2:
		return serviceRef{ns: labels[1], name: labels[0]}, "", nil
	case 3:
		return serviceRef{ns: labels[2], name: labels[1]}, labels[0], nil
	}
	return serviceRef{}, "", fmt.Errorf("invalid k8s service %s", host)
}

// serviceLocked returns the manifest of a Service (nil when it has none)
// and whether the Service exists: a Service manifest names it, or an
// endpoint set names one of its ports. The caller holds s.mu.
func (s *Store) serviceLocked(ref serviceRef) (*manifest.Service, bool) {
	if s.manifests != nil {
		if svc := s.manifests.Service(ref.ns, ref.name); svc != nil {
			return svc, true
		}
	}
	_, ok := s.endpointServices[ref]
	return nil, ok
}

// serviceExists reports whether the Service exists (see serviceLocked).
func (s *Store) serviceExists(ref serviceRef) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	_, ok := s.serviceLocked(ref)
	return ok
}

// definesPortLocked reports whether a Service that exists defines port:
// its manifest lists it (a manifest without ports defines every port), or,
// without a manifest, an endpoint set names that port.
func (s *Store) definesPortLocked(ref serviceRef, svc *manifest.Service, port uint32) bool {
	if svc != nil {
		return port <= 0xffff && svc.HasPort(uint16(port))
	}
	_, ok := s.endpoints[ref.fqdn()+":"+strconv.FormatUint(uint64(port), 10)]
	return ok
}

// serviceProfile returns the profile of a Service port, as Linkerd's
// controller serves it (controller/api/destination/server.go
// subscribeToServiceProfile): nil when the Service no longer exists, an
// empty profile for a port it does not define, else its ServiceProfile's
// (or the default one) whose opaque_protocol says whether the Service's
// config.linkerd.io/opaque-ports annotation, or Linkerd's default opaque
// ports when it has none, lists the port
// (controller/api/destination/opaque_ports_adaptor.go); a port the
// ServiceProfile's own opaquePorts lists is opaque too.
//
// The ServiceProfile is the one in the client's namespace clientNS (its
// context token's) when there is one, else the one in the Service's
// namespace, as Linkerd's controller falls back from the one to the other
// (controller/api/destination/server.go subscribeToServicesWithContext).
//
// A stream watches it under serviceKey(ref) and profileKey(fqn).
func (s *Store) serviceProfile(ref serviceRef, fqn, clientNS string, port uint32) (p *profiles.Profile, sp *profiles.ServiceProfile, empty bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	svc, ok := s.serviceLocked(ref)
	if !ok {
		return nil, nil, false
	}
	if !s.definesPortLocked(ref, svc, port) {
		return &profiles.Profile{}, nil, true
	}
	if clientNS != "" {
		sp = s.profiles[profileID{clientNS, fqn}]
	}
	if sp == nil {
		sp = s.profiles[profileID{ref.ns, fqn}]
	}
	if sp != nil {
		p = sp.ProfileFor(port)
	} else {
		budget := profiles.DefaultRetryBudget()
		p = &profiles.Profile{RetryBudget: &budget, FullyQualifiedName: fqn}
	}
	if port <= 0xffff && svc.OpaquePort(uint16(port)) {
		p.OpaqueProtocol = true
	}
	return p, sp, false
}

// serviceOfIP returns the Service whose clusterIP is ip, as Linkerd's
// controller finds it (controller/api/destination/server.go getSvcID):
// when several Services have that clusterIP (a mistake that
// manifest.Resources.Problems names), FailedPrecondition "found N
// services with conflicting cluster IP ...", never the first of them.
func (s *Store) serviceOfIP(ip netip.Addr) (serviceRef, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	found := s.clusterIPs[ip]
	switch len(found) {
	case 0:
		return serviceRef{}, false, nil
	case 1:
		return found[0], true, nil
	}
	return serviceRef{}, false, status.Errorf(codes.FailedPrecondition, "found %d services with conflicting cluster IP %s", len(found), ip)
}

// endpointProfile returns the profile of a workload's address, as Linkerd's
// controller answers a GetProfile of a pod IP
// (controller/api/destination/endpoint_profile_translator.go): the default
// retry budget, the endpoint (the address asked, with the labels, identity
// and protocol hint an endpoint set gives that IP, and its namespace
// label), and opaque_protocol when the endpoint is opaque or, outside the
// mesh (no identity), its port is one of Linkerd's default opaque ports;
// an address no set knows gets an endpoint with the address alone.
//
// The endpoints at the address asked (ip:port) must agree on one
// identity: two workloads that claim one address (an endpoints file and a
// registration, or registrations on two replicas, with different
// identities) are FailedPrecondition, as Linkerd's controller answers an
// IP that two pods claim (controller/api/destination/watcher/
// workload_watcher.go getPodByPodIP), never the first found. Without an
// endpoint at that port, the endpoints of the IP's other ports give the
// identity only when they agree on one: an IP that several workloads
// share (loopback, a host) says nothing of an unknown port.
//
// A stream watches it under addrKey(ip).
func (s *Store) endpointProfile(ip netip.Addr, port uint32) (*profiles.Profile, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	addr := netip.AddrPortFrom(ip, uint16(port))
	if ids := s.addressClaimsLocked(map[netip.AddrPort]bool{addr: true})[addr]; len(ids) > 1 {
		claims := slices.SortedFunc(maps.Values(ids), func(a, b claim) int {
			if a.before(b) {
				return -1
			}
			return 1
		})
		names := make([]string, len(claims))
		for i, c := range claims {
			names[i] = c.String()
		}
		return nil, status.Errorf(codes.FailedPrecondition, "found %d workloads with a conflicting address %s: %s",
			len(ids), addr, strings.Join(names, ", "))
	}
	// The endpoint of the port asked wins over the same IP's other
	// ports; among equals, the first authority by name.
	var (
		e            endpoint.Endpoint
		ns           string
		found, exact bool
		identities   = make(map[string]bool)
	)
	var served []servedEndpoint
	if x := s.atIPLocked(ip.Unmap()); x != nil {
		served = x.served // by authority, then address
	}
	for _, se := range served {
		cand := se.e
		if cand.Addr.Addr() != ip || exact {
			continue
		}
		if cand.Addr != addr {
			identities[cand.Identity] = true
			if found {
				continue
			}
		}
		e, found, exact = cand, true, cand.Addr == addr
		ns, _, _, _ = manifest.ParseAuthority(se.authority)
	}
	if found && !exact && len(identities) > 1 {
		// Several workloads on this IP, none on this port.
		found, ns = false, ""
	}
	switch {
	case !found:
		e = endpoint.Endpoint{Weight: endpoint.DefaultWeight}
	case !exact:
		// Another port's hint says nothing of this one.
		e.Opaque = e.Identity != "" && isDefaultOpaque(port)
	}
	e.Addr = addr
	budget := profiles.DefaultRetryBudget()
	// The port's protocol is opaque by the endpoint's hint, or, for a
	// workload outside the mesh (which gets no hint), by Linkerd's default
	// opaque ports.
	p := &profiles.Profile{RetryBudget: &budget, OpaqueProtocol: e.Opaque || e.Identity == "" && isDefaultOpaque(port)}
	e = wireEndpoint(e)
	if found && ns != "" {
		labels := maps.Clone(e.Labels)
		if labels == nil {
			labels = make(map[string]string, 1)
		}
		labels["namespace"] = ns
		e.Labels = labels
	}
	p.Endpoint = &e
	return p, nil
}

func isDefaultOpaque(port uint32) bool {
	return port <= 0xffff && slices.Contains(manifest.DefaultOpaquePorts, uint16(port))
}

// wireEndpoint is an endpoint as Linkerd's controller sends it
// (controller/api/destination/endpoint_translator.go createWeightedAddr):
// a TLS identity is also the server name to send, and an opaque endpoint
// is hinted opaque, not h2.
func wireEndpoint(e endpoint.Endpoint) endpoint.Endpoint {
	if e.Identity != "" && e.ServerName == "" {
		e.ServerName = e.Identity
	}
	if e.Opaque {
		e.H2 = false
	}
	return e
}

// The errors of the Destination API, with Linkerd's codes and messages
// (controller/api/destination/server.go).
func errInvalidAuthority(path string) error {
	return status.Errorf(codes.InvalidArgument, "Invalid authority: %s", path)
}
