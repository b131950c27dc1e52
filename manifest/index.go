package manifest

import (
	"slices"
	"strings"
)

// The lookups that the control plane makes for each stream it opens or
// wakes (a Service by name, the routes whose parentRefs name a Service,
// a Pod by name, the Pods, Servers, routes, AuthorizationPolicies and
// rate limits of a namespace, an authentication by name) read an index of
// the Resources, not every resource: with thousands of Services, a
// lookup costs what it finds. LoadFiles builds the index as it loads;
// a Resources made by hand gets one on its first lookup, and a new one
// when one of its slices is replaced (assigned or appended to).

// nsName names a namespaced resource.
type nsName struct{ ns, name string }

// index is what the lookups read, with the slices it was built from.
type index struct {
	services   []*Service
	httpRoutes []*HTTPRoute
	grpcRoutes []*GRPCRoute
	pods       []*Pod
	servers    []*Server
	policies   []*AuthorizationPolicy
	meshTLS    []*MeshTLSAuthentication
	networks   []*NetworkAuthentication
	rateLimits []*HTTPLocalRateLimitPolicy

	// service and pod are the first of each name, as a scan finds it.
	service map[nsName]*Service
	pod     map[nsName]*Pod
	// httpByParent and grpcByParent are the routes whose parentRefs name
	// a Service, each once, in the order of Resources.
	httpByParent map[nsName][]*HTTPRoute
	grpcByParent map[nsName][]*GRPCRoute
	// podsByNS are the Pods of each namespace in the order of Resources;
	// serversByNS the Servers of each namespace in serverFor's order.
	podsByNS    map[string][]*Pod
	serversByNS map[string][]*Server
	// The inbound policy reads the resources of the Server's namespace
	// alone: its routes, AuthorizationPolicies and rate limits, each in
	// the order of Resources; and authentications by name.
	httpByNS       map[string][]*HTTPRoute
	grpcByNS       map[string][]*GRPCRoute
	policiesByNS   map[string][]*AuthorizationPolicy
	rateLimitsByNS map[string][]*HTTPLocalRateLimitPolicy
	meshTLSByName  map[nsName]*MeshTLSAuthentication
	networkByName  map[nsName]*NetworkAuthentication
}

// sameSlice reports whether a and b are the same slice: one array, one
// length.
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// index returns the index of r, built now when r has none or one of its
// slices was replaced since.
func (r *Resources) index() *index {
	x := r.idx.Load()
	if x != nil && sameSlice(x.services, r.Services) && sameSlice(x.httpRoutes, r.HTTPRoutes) &&
		sameSlice(x.grpcRoutes, r.GRPCRoutes) && sameSlice(x.pods, r.Pods) && sameSlice(x.servers, r.Servers) &&
		sameSlice(x.policies, r.AuthorizationPolicies) && sameSlice(x.meshTLS, r.MeshTLSAuthentications) &&
		sameSlice(x.networks, r.NetworkAuthentications) && sameSlice(x.rateLimits, r.HTTPLocalRateLimitPolicies) {
		return x
	}
	x = r.buildIndex()
	r.idx.Store(x)
	return x
}

func (r *Resources) buildIndex() *index {
	x := &index{
		services:     r.Services,
		httpRoutes:   r.HTTPRoutes,
		grpcRoutes:   r.GRPCRoutes,
		pods:         r.Pods,
		servers:      r.Servers,
		policies:     r.AuthorizationPolicies,
		meshTLS:      r.MeshTLSAuthentications,
		networks:     r.NetworkAuthentications,
		rateLimits:   r.HTTPLocalRateLimitPolicies,
		service:      make(map[nsName]*Service, len(r.Services)),
		pod:          make(map[nsName]*Pod, len(r.Pods)),
		httpByParent: make(map[nsName][]*HTTPRoute),
		grpcByParent: make(map[nsName][]*GRPCRoute),
		podsByNS:     make(map[string][]*Pod),
		serversByNS:  make(map[string][]*Server),

		httpByNS:       make(map[string][]*HTTPRoute),
		grpcByNS:       make(map[string][]*GRPCRoute),
		policiesByNS:   make(map[string][]*AuthorizationPolicy),
		rateLimitsByNS: make(map[string][]*HTTPLocalRateLimitPolicy),
		meshTLSByName:  make(map[nsName]*MeshTLSAuthentication),
		networkByName:  make(map[nsName]*NetworkAuthentication),
	}
	for _, s := range r.Services {
		k := nsName{s.Namespace, s.Name}
		if _, ok := x.service[k]; !ok {
			x.service[k] = s
		}
	}
	for _, h := range r.HTTPRoutes {
		for _, k := range parentServices(h.ParentRefs) {
			x.httpByParent[k] = append(x.httpByParent[k], h)
		}
		x.httpByNS[h.Namespace] = append(x.httpByNS[h.Namespace], h)
	}
	for _, g := range r.GRPCRoutes {
		for _, k := range parentServices(g.ParentRefs) {
			x.grpcByParent[k] = append(x.grpcByParent[k], g)
		}
		x.grpcByNS[g.Namespace] = append(x.grpcByNS[g.Namespace], g)
	}
	for _, p := range r.Pods {
		k := nsName{p.Namespace, p.Name}
		if _, ok := x.pod[k]; !ok {
			x.pod[k] = p
		}
		x.podsByNS[p.Namespace] = append(x.podsByNS[p.Namespace], p)
	}
	for _, s := range r.Servers {
		x.serversByNS[s.Namespace] = append(x.serversByNS[s.Namespace], s)
	}
	for _, ap := range r.AuthorizationPolicies {
		x.policiesByNS[ap.Namespace] = append(x.policiesByNS[ap.Namespace], ap)
	}
	for _, l := range r.HTTPLocalRateLimitPolicies {
		x.rateLimitsByNS[l.Namespace] = append(x.rateLimitsByNS[l.Namespace], l)
	}
	for _, m := range r.MeshTLSAuthentications {
		if k := (nsName{m.Namespace, m.Name}); x.meshTLSByName[k] == nil {
			x.meshTLSByName[k] = m
		}
	}
	for _, n := range r.NetworkAuthentications {
		if k := (nsName{n.Namespace, n.Name}); x.networkByName[k] == nil {
			x.networkByName[k] = n
		}
	}
	for _, servers := range x.serversByNS {
		slices.SortStableFunc(servers, compareServers)
	}
	return x
}

// parentServices returns the Services that parents name, each once.
func parentServices(parents []ParentRef) []nsName {
	var out []nsName
	for _, p := range parents {
		if k := (nsName{p.Namespace, p.Name}); p.IsService() && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// compareServers orders Servers as Linkerd's index compares them: by
// creationTimestamp, an absent one before any, then by name.
func compareServers(a, b *Server) int {
	if a.Created.IsZero() != b.Created.IsZero() {
		if a.Created.IsZero() {
			return -1
		}
		return 1
	}
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}
