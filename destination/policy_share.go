package destination

import "github.com/inmesh/inmesh/policy"

// A decoded policy is held for each of thousands of watched names, and
// most of its strings and matches repeat: the default policies of
// Linkerd's controllers name the parent Service again in every backend
// and carry one route matching every path. The functions below let the
// repeats share one copy. A policy is immutable once decoded, so sharing
// changes nothing a reader can see.

// matchEverything is the match of Linkerd's default HTTP routes: every
// path.
var matchEverything = []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/"}}}

// shareMatches returns matchEverything when ms is equal to it, ms
// otherwise.
func shareMatches(ms []policy.HTTPRouteMatch) []policy.HTTPRouteMatch {
	if len(ms) != 1 {
		return ms
	}
	m := ms[0]
	if m.Path == nil || *m.Path != *matchEverything[0].Path || len(m.Headers) > 0 || len(m.QueryParams) > 0 || m.Method != "" {
		return ms
	}
	return matchEverything
}

// knownName returns the program's copy of s when s is one of the names
// that nearly every policy carries, s otherwise.
func knownName(s string) string {
	for _, k := range [...]string{"core", "Service", "http", "grpc", "opaq", "policy.linkerd.io", "gateway.networking.k8s.io", "HTTPRoute", "GRPCRoute", "EgressNetwork"} {
		if s == k {
			return k
		}
	}
	return s
}

// shareStrings makes the strings of p that equal those of its parent, or
// authority (the target watched, "" for none), share them.
func shareStrings(p *policy.Policy, authority string) {
	parent := &p.Parent
	meta := func(m *policy.Metadata) {
		m.Group = same(m.Group, parent.Group)
		m.Kind = same(m.Kind, parent.Kind)
		m.Namespace = same(m.Namespace, parent.Namespace)
		m.Name = same(m.Name, parent.Name)
	}
	dist := func(d *policy.Distribution) {
		for i := range d.Backends {
			b := &d.Backends[i].Backend
			meta(&b.Meta)
			if b.Balancer != nil && authority != "" {
				b.Balancer.Authority = same(b.Balancer.Authority, authority)
			}
		}
	}
	for _, rs := range [][]policy.HTTPRoute{p.HTTP1.Routes, p.HTTP2.Routes} {
		for i := range rs {
			meta(&rs[i].Meta)
			for j := range rs[i].Rules {
				dist(&rs[i].Rules[j].Backends)
			}
		}
	}
	for i := range p.GRPC.Routes {
		r := &p.GRPC.Routes[i]
		meta(&r.Meta)
		for j := range r.Rules {
			dist(&r.Rules[j].Backends)
		}
	}
	for i := range p.Opaque.Routes {
		r := &p.Opaque.Routes[i]
		meta(&r.Meta)
		dist(&r.Backends)
	}
}

// same returns ref when s is equal to it, s otherwise.
func same(s, ref string) string {
	if s == ref {
		return ref
	}
	return s
}
