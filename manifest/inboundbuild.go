package manifest

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/policy"
)

// InboundOptions are the settings of Linkerd's policy controller that shape
// inbound policy.
type InboundOptions struct {
	// TrustDomain of the mesh identities; "" means cluster.local.
	TrustDomain string
	// ControlNamespace is the control plane's namespace; "" means linkerd.
	ControlNamespace string
	// ClusterNetworks are the networks of the cluster-* modes; nil means
	// authz.DefaultClusterNetworks.
	ClusterNetworks []netip.Prefix
	// ProbeNetworks are what the "probe" route admits; none means no probe
	// route (Linkerd's Helm chart sets 0.0.0.0/0 and ::/0).
	ProbeNetworks []netip.Prefix
	// DefaultMode is the policy of a port no Server selects, unless the
	// pod's config.linkerd.io/default-inbound-policy says otherwise; ""
	// means all-unauthenticated.
	DefaultMode authz.Mode
}

func (o *InboundOptions) identity(sa, ns string) string {
	return fmt.Sprintf("%s.%s.serviceaccount.identity.%s.%s", sa, ns, o.ControlNamespace, o.TrustDomain)
}

// Pod returns the pod namespace/name, or nil.
func (r *Resources) Pod(namespace, name string) *Pod {
	return r.index().pod[nsName{namespace, name}]
}

// ErrUnknownPod is what InboundServer wraps for a pod no manifest names.
var ErrUnknownPod = errors.New("unknown pod")

// InboundServer returns the inbound policy of a pod's port as Linkerd's
// policy controller builds it (policy-controller/k8s/index/src/inbound),
// or an error when no Pod manifest names the pod:
//
//   - The Server is the first, by creationTimestamp (those without one
//     before those with one, as Linkerd's index compares them) then name, of the Servers of the pod's
//     namespace whose podSelector matches the pod's labels and whose port
//     is the port or the name of a TCP container port that is it. Its meta
//     is {policy.linkerd.io, server, name}.
//   - Its authorizations are the AuthorizationPolicies targeting it or its
//     namespace, by name, then the authorization of its accessPolicy (none
//     for deny, the default). A policy whose authentication is missing is
//     ignored. A ServiceAccount is the identity
//     sa.ns.serviceaccount.identity.<control namespace>.<trust domain>.
//   - Its routes are the HTTPRoutes (policy.linkerd.io and
//     gateway.networking.k8s.io) whose parentRefs name it, oldest first,
//     each with the AuthorizationPolicies targeting it. With no status
//     written by any controller, a route counts as accepted when its
//     Server exists, as Linkerd's status controller would accept it; a
//     route with a Server parent in another namespace, or with a port or
//     sectionName, is ignored; so are the HTTPRoutes of a Server that has
//     a GRPCRoute (Linkerd marks them Conflicted). Without routes, the
//     Server gets the "default" route and, with probe paths and networks,
//     "probe". A gRPC Server gets its GRPCRoutes (gateway.networking.k8s.io)
//     the same way, else the default gRPC route, and never a probe route.
//   - Its rate limit is the oldest HTTPLocalRateLimitPolicy targeting it;
//     gRPC, opaque and TLS Servers get none.
//   - inmesh.io/max-concurrent-requests on the Server, else on the pod,
//     bounds its requests in flight.
//
// A port that no Server selects gets authz.DefaultServer: the mode of the
// pod's config.linkerd.io/default-inbound-policy annotation, else
// opts.DefaultMode; the authenticated form of an allow mode for ports in
// config.linkerd.io/proxy-require-identity-inbound-ports; the opaque
// protocol for ports in config.linkerd.io/opaque-ports; and the paths of
// the pod's httpGet probes of the port.
func (r *Resources) InboundServer(namespace, pod string, port uint16, opts InboundOptions) (*authz.Server, error) {
	if opts.TrustDomain == "" {
		opts.TrustDomain = "cluster.local"
	}
	if opts.ControlNamespace == "" {
		opts.ControlNamespace = "linkerd"
	}
	if opts.DefaultMode == "" {
		opts.DefaultMode = authz.AllUnauthenticated
	}
	if port == 0 {
		return nil, fmt.Errorf("inbound server %s/%s: port 0", namespace, pod)
	}
	p := r.Pod(namespace, pod)
	if p == nil {
		return nil, fmt.Errorf("inbound server %s/%s:%d: %w", namespace, pod, port, ErrUnknownPod)
	}
	if srv := r.serverFor(p, port); srv != nil {
		return r.namedServer(p, srv, port, &opts)
	}
	return r.defaultServer(p, port, &opts)
}

// serverFor returns the Server that claims the pod's port, or nil.
func (r *Resources) serverFor(p *Pod, port uint16) *Server {
	// The Servers of the pod's namespace, in the order of compareServers.
	for _, s := range r.index().serversByNS[p.Namespace] {
		if s.PodSelector == nil || !s.PodSelector.Matches(p.Labels) {
			continue
		}
		if s.Port == port || s.PortName != "" && slices.Contains(p.PortsNamed(s.PortName), port) {
			return s
		}
	}
	return nil
}

func (r *Resources) defaultServer(p *Pod, port uint16, opts *InboundOptions) (*authz.Server, error) {
	mode := opts.DefaultMode
	if v, ok := p.Annotations[AnnotationDefaultInboundPolicy]; ok {
		m, err := authz.ParseMode(v)
		if err != nil {
			return nil, annotationErr(AnnotationDefaultInboundPolicy, "%v", err)
		}
		mode = m
	}
	if required, err := portListed(p.Annotations, AnnotationRequireIdentityPorts, port); err != nil {
		return nil, err
	} else if required {
		switch mode {
		case authz.AllUnauthenticated:
			mode = authz.AllAuthenticated
		case authz.ClusterUnauthenticated:
			mode = authz.ClusterAuthenticated
		}
	}
	dopts := authz.DefaultOptions{ClusterNetworks: opts.ClusterNetworks, ProbeNetworks: opts.ProbeNetworks}
	if opaque, err := portListed(p.Annotations, AnnotationOpaquePorts, port); err != nil {
		return nil, err
	} else if opaque {
		dopts.Protocol = authz.ProtocolOpaque
	} else {
		dopts.ProbePaths = probePaths(p, port)
	}
	s, err := authz.DefaultServer(mode, dopts)
	if err != nil {
		return nil, err
	}
	if s.MaxConcurrentRequests, err = authz.MaxConcurrentRequestsFrom(p.Annotations); err != nil {
		return nil, err
	}
	return s, nil
}

// probePaths returns the paths of the pod's httpGet probes of port, their
// queries dropped, in order and without duplicates as Linkerd's controller
// keeps them.
func probePaths(p *Pod, port uint16) []string {
	var out []string
	for _, pr := range p.Probes {
		if pr.Port == port {
			path, _, _ := strings.Cut(pr.Path, "?")
			if path == "" {
				path = "/"
			}
			out = append(out, path)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (r *Resources) namedServer(p *Pod, srv *Server, port uint16, opts *InboundOptions) (*authz.Server, error) {
	out := &authz.Server{
		Meta:     authz.Meta{Group: linkerdPolicyGroup, Kind: "server", Name: srv.Name},
		Protocol: srv.Protocol,
	}
	var err error
	if out.MaxConcurrentRequests, err = authz.MaxConcurrentRequestsFrom(srv.Annotations); err != nil {
		return nil, err
	}
	if out.MaxConcurrentRequests == 0 {
		if out.MaxConcurrentRequests, err = authz.MaxConcurrentRequestsFrom(p.Annotations); err != nil {
			return nil, err
		}
	}
	serverRef := func(t Ref) bool {
		return t.is(linkerdPolicyGroup, "Server") && t.Namespace == srv.Namespace && strings.EqualFold(t.Name, srv.Name)
	}
	for _, ap := range r.index().policiesByNS[srv.Namespace] {
		if !serverRef(ap.TargetRef) && !(ap.TargetRef.is("", "Namespace") && ap.TargetRef.Name == srv.Namespace) {
			continue
		}
		if a, ok := r.policyAuthz(ap, opts); ok {
			out.Authorizations = append(out.Authorizations, a)
		}
	}
	mode, err := authz.DefaultServer(srv.AccessPolicy, authz.DefaultOptions{ClusterNetworks: opts.ClusterNetworks})
	if err != nil {
		return nil, err
	}
	out.Authorizations = append(out.Authorizations, mode.Authorizations...)

	switch srv.Protocol {
	case authz.ProtocolGRPC:
		// Its GRPCRoutes, else the default gRPC route; no rate limit.
		out.GRPCRoutes = r.inboundGRPCRoutes(srv, opts)
		return out, nil
	case authz.ProtocolOpaque, authz.ProtocolTLS:
		// No HTTP, so no routes and no rate limit.
		return out, nil
	}
	out.Routes = r.inboundRoutes(srv, opts)
	if len(out.Routes) == 0 {
		out.Routes = authz.DefaultRoutes(probePaths(p, port), opts.ProbeNetworks)
	}
	out.RateLimit = r.rateLimit(srv, opts)
	return out, nil
}

// policyAuthz returns the authorization of an AuthorizationPolicy; false
// when an authentication it requires does not exist.
func (r *Resources) policyAuthz(ap *AuthorizationPolicy, opts *InboundOptions) (authz.Authz, bool) {
	a := authz.Authz{Meta: authz.Meta{Group: linkerdPolicyGroup, Kind: "authorizationpolicy", Name: ap.Name}}
	for _, ref := range ap.RequiredAuthenticationRefs {
		switch {
		case ref.is("", "ServiceAccount"):
			a.Authentication.MeshTLS = &authz.MeshTLS{Identities: []string{opts.identity(ref.Name, ref.Namespace)}}
		case ref.is(linkerdPolicyGroup, "MeshTLSAuthentication"):
			m := r.meshTLS(ref.Namespace, ref.Name)
			if m == nil {
				return a, false
			}
			a.Authentication.MeshTLS = meshTLSOf(m, opts)
		case ref.is(linkerdPolicyGroup, "NetworkAuthentication"):
			n := r.networkAuthentication(ref.Namespace, ref.Name)
			if n == nil {
				return a, false
			}
			a.Networks = slices.Clone(n.Networks)
		}
	}
	if a.Networks == nil {
		for _, p := range authz.AllNetworks {
			a.Networks = append(a.Networks, authz.Network{Net: p})
		}
	}
	return a, true
}

func (r *Resources) meshTLS(namespace, name string) *MeshTLSAuthentication {
	return r.index().meshTLSByName[nsName{namespace, name}]
}

func (r *Resources) networkAuthentication(namespace, name string) *NetworkAuthentication {
	return r.index().networkByName[nsName{namespace, name}]
}

// meshTLSOf returns the identities a MeshTLSAuthentication admits: "*" is
// any identity, "*.a.b" the suffix a.b, anything else exact; a
// ServiceAccount its identity, a Namespace the suffix of its identities.
func meshTLSOf(m *MeshTLSAuthentication, opts *InboundOptions) *authz.MeshTLS {
	out := &authz.MeshTLS{}
	for _, id := range m.Identities {
		switch {
		case id == "*":
			out.Suffixes = append(out.Suffixes, []string{})
		case strings.HasPrefix(id, "*.") && len(id) > 2:
			out.Suffixes = append(out.Suffixes, strings.Split(id[2:], "."))
		default:
			out.Identities = append(out.Identities, id)
		}
	}
	for _, ref := range m.IdentityRefs {
		if ref.is("", "Namespace") {
			suffix := fmt.Sprintf("%s.serviceaccount.identity.%s.%s", ref.Name, opts.ControlNamespace, opts.TrustDomain)
			out.Suffixes = append(out.Suffixes, strings.Split(suffix, "."))
			continue
		}
		out.Identities = append(out.Identities, opts.identity(ref.Name, ref.Namespace))
	}
	return out
}

// inboundRoutes returns the accepted HTTPRoutes of srv, in the order
// Linkerd's controller sends them: oldest first, then by name and group.
func (r *Resources) inboundRoutes(srv *Server, opts *InboundOptions) []authz.Route {
	// A route's Server parent is in the route's namespace: the routes of
	// srv's namespace are all that may name it.
	x := r.index()
	for _, g := range x.grpcByNS[srv.Namespace] {
		if serverParent(g.ParentRefs, g.Namespace, srv) {
			// Linkerd's status controller marks the HTTPRoutes of a
			// Server that has a GRPCRoute Conflicted, so none is accepted.
			return nil
		}
	}
	var attachedRoutes []*HTTPRoute
	for _, h := range x.httpByNS[srv.Namespace] {
		if serverParent(h.ParentRefs, h.Namespace, srv) {
			attachedRoutes = append(attachedRoutes, h)
		}
	}
	slices.SortStableFunc(attachedRoutes, func(a, b *HTTPRoute) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Group, b.Group)
	})
	var out []authz.Route
	for _, h := range byAge(attachedRoutes, func(h *HTTPRoute) *Object { return &h.Object }) {
		route := authz.Route{
			Meta:  authz.Meta{Group: h.Group, Kind: "HTTPRoute", Name: h.Name},
			Hosts: hostMatches(h.Hostnames),
		}
		for _, rule := range h.Rules {
			ar := authz.Rule{Matches: rule.Matches}
			for _, f := range rule.Filters {
				// Response header modifiers do not apply inbound.
				if f.ResponseHeaders == nil {
					ar.Filters = append(ar.Filters, f)
				}
			}
			route.Rules = append(route.Rules, ar)
		}
		route.Authorizations = r.routeAuthzs(&h.Object, opts)
		out = append(out, route)
	}
	return out
}

// routeAuthzs returns the authorizations of the AuthorizationPolicies that
// target a route (group, kind and name compared in any case).
func (r *Resources) routeAuthzs(route *Object, opts *InboundOptions) []authz.Authz {
	var out []authz.Authz
	for _, ap := range r.index().policiesByNS[route.Namespace] {
		t := ap.TargetRef
		if t.is(route.Group, route.Kind) && strings.EqualFold(t.Name, route.Name) {
			if a, ok := r.policyAuthz(ap, opts); ok {
				out = append(out, a)
			}
		}
	}
	return out
}

// inboundGRPCRoutes returns the GRPCRoutes of a gRPC Server, ordered as
// its HTTPRoutes are; without any, Linkerd's default gRPC route "default",
// one rule matching every call (policy-controller/core/src/inbound.rs
// InboundRoute<GrpcRouteMatch>::default, k8s/index/src/inbound/index.rs
// grpc_routes).
func (r *Resources) inboundGRPCRoutes(srv *Server, opts *InboundOptions) []authz.GRPCRoute {
	var attachedRoutes []*GRPCRoute
	for _, g := range r.index().grpcByNS[srv.Namespace] {
		if serverParent(g.ParentRefs, g.Namespace, srv) {
			attachedRoutes = append(attachedRoutes, g)
		}
	}
	slices.SortStableFunc(attachedRoutes, func(a, b *GRPCRoute) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Group, b.Group)
	})
	var out []authz.GRPCRoute
	for _, g := range byAge(attachedRoutes, func(g *GRPCRoute) *Object { return &g.Object }) {
		route := authz.GRPCRoute{
			Meta:  authz.Meta{Group: g.Group, Kind: "GRPCRoute", Name: g.Name},
			Hosts: hostMatches(g.Hostnames),
		}
		for _, rule := range g.Rules {
			route.Rules = append(route.Rules, authz.GRPCRule{Matches: rule.Matches, Filters: rule.Filters})
		}
		route.Authorizations = r.routeAuthzs(&g.Object, opts)
		out = append(out, route)
	}
	if len(out) == 0 {
		out = []authz.GRPCRoute{{Meta: authz.DefaultMeta("default"),
			Rules: []authz.GRPCRule{{Matches: []policy.GRPCRouteMatch{{}}}}}}
	}
	return out
}

// serverParent reports whether the parents of a route in namespace attach
// it to srv: a Server parent (policy.linkerd.io) named srv, both in the
// route's namespace. A Server parent in another namespace, or with a port
// or sectionName, makes the route invalid.
func serverParent(parents []ParentRef, namespace string, srv *Server) bool {
	found := false
	for _, p := range parents {
		if p.Kind != "Server" || p.Group != linkerdPolicyGroup {
			continue
		}
		if p.Namespace != namespace || p.Port != 0 || p.SectionName != "" {
			return false
		}
		if p.Name == srv.Name && namespace == srv.Namespace {
			found = true
		}
	}
	return found
}

// rateLimit returns the rate limit of srv: the oldest (then first by name)
// HTTPLocalRateLimitPolicy targeting it, as Linkerd's status controller
// accepts one per Server.
func (r *Resources) rateLimit(srv *Server, opts *InboundOptions) *authz.RateLimit {
	var targeting []*HTTPLocalRateLimitPolicy
	for _, l := range r.index().rateLimitsByNS[srv.Namespace] {
		if strings.EqualFold(l.TargetRef.Name, srv.Name) {
			targeting = append(targeting, l)
		}
	}
	targeting = byAge(targeting, func(l *HTTPLocalRateLimitPolicy) *Object { return &l.Object })
	if len(targeting) == 0 {
		return nil
	}
	l := targeting[0]
	out := &authz.RateLimit{
		Meta:     authz.Meta{Group: linkerdPolicyGroup, Kind: "HTTPLocalRateLimitPolicy", Name: l.Name},
		Total:    l.Total,
		Identity: l.Identity,
	}
	for _, o := range l.Overrides {
		ov := authz.Override{RPS: o.RPS}
		for _, c := range o.ClientRefs {
			ov.Identities = append(ov.Identities, opts.identity(c.Name, c.Namespace))
		}
		if len(ov.Identities) == 0 || ov.RPS == 0 {
			continue // it limits nobody, as Linkerd's proxy reads it
		}
		out.Overrides = append(out.Overrides, ov)
	}
	return out
}
