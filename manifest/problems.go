package manifest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Problems returns the mistakes of resources that load but cannot work as
// written, each naming the file, the document and the field, in a stable
// order. Linkerd's policy controller takes them as this package does (it
// ignores an AuthorizationPolicy whose authentication does not exist, and a
// Server port that names no container port selects nothing), without a
// word; a control plane logs these so that the mistake is seen:
//
//   - an AuthorizationPolicy whose requiredAuthenticationRefs names a
//     MeshTLSAuthentication or NetworkAuthentication that no manifest
//     defines: the policy authorizes no one;
//   - a Server whose port matches no container port of the Pods it
//     selects: a port name that none of them declares (their ports keep
//     the default policy), or a number that none of them declares when
//     they declare ports;
//   - Services that share one spec.clusterIP (a copied manifest whose
//     clusterIP was left as it was): a GetProfile of that address is
//     refused, as Linkerd's controller refuses it (FailedPrecondition
//     "found 2 services with conflicting cluster IP ...");
//   - an annotation of a Service, HTTPRoute or GRPCRoute under
//     retry.linkerd.io/ or timeout.linkerd.io/ that is none of Linkerd's
//     (a typo such as retry.linkerd.io/limt): it is ignored, as Linkerd's
//     controller ignores it, and the retry or timeout it meant is not
//     set.
func (r *Resources) Problems() []error {
	var out []error
	for _, ap := range r.AuthorizationPolicies {
		for i, ref := range ap.RequiredAuthenticationRefs {
			missing := false
			switch {
			case ref.is(linkerdPolicyGroup, "MeshTLSAuthentication"):
				missing = r.meshTLS(ref.Namespace, ref.Name) == nil
			case ref.is(linkerdPolicyGroup, "NetworkAuthentication"):
				missing = r.networkAuthentication(ref.Namespace, ref.Name) == nil
			}
			if missing {
				out = append(out, fmt.Errorf("%s: spec.requiredAuthenticationRefs[%d]: %s %s/%s is not defined in any file; the policy authorizes no one until it is",
					ap.where(), i, ref.Kind, ref.Namespace, ref.Name))
			}
		}
	}
	for _, s := range r.Servers {
		if err := r.serverPortProblem(s); err != nil {
			out = append(out, err)
		}
	}
	out = append(out, r.clusterIPProblems()...)
	return append(out, r.annotationProblems()...)
}

// linkerdRouteAnnotations are the retry and timeout annotations Linkerd's
// policy controller reads on Services and routes.
var linkerdRouteAnnotations = map[string]bool{
	AnnotationRetryHTTP: true, AnnotationRetryGRPC: true, AnnotationRetryLimit: true, AnnotationRetryTimeout: true,
	AnnotationTimeoutRequest: true, AnnotationTimeoutResponse: true, AnnotationTimeoutIdle: true,
}

// annotationProblems reports the unknown retry.linkerd.io/ and
// timeout.linkerd.io/ annotations of Services and routes.
func (r *Resources) annotationProblems() []error {
	var out []error
	check := func(o *Object) {
		keys := make([]string, 0, len(o.Annotations))
		for k := range o.Annotations {
			if (strings.HasPrefix(k, "retry.linkerd.io/") || strings.HasPrefix(k, "timeout.linkerd.io/")) && !linkerdRouteAnnotations[k] {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			out = append(out, fmt.Errorf("%s: metadata.annotations[%q]: not an annotation Linkerd reads (retry.linkerd.io/http, /grpc, /limit, /timeout; timeout.linkerd.io/request, /response, /idle); it is ignored",
				o.where(), k))
		}
	}
	for _, s := range r.Services {
		check(&s.Object)
	}
	for _, h := range r.HTTPRoutes {
		check(&h.Object)
	}
	for _, g := range r.GRPCRoutes {
		check(&g.Object)
	}
	return out
}

// serverPortProblem reports a Server whose port matches no container port
// of the Pods it selects; nil when it selects no Pod.
func (r *Resources) serverPortProblem(s *Server) error {
	if s.PodSelector == nil {
		return nil
	}
	var pods []string
	var declared []uint16
	for _, p := range r.Pods {
		if p.Namespace != s.Namespace || !s.PodSelector.Matches(p.Labels) {
			continue
		}
		if s.PortName != "" && len(p.PortsNamed(s.PortName)) > 0 {
			return nil
		}
		pods = append(pods, p.key())
		for _, cp := range p.Ports {
			if cp.Protocol != "TCP" {
				continue
			}
			if s.PortName == "" && cp.Port == s.Port {
				return nil
			}
			if !slices.Contains(declared, cp.Port) {
				declared = append(declared, cp.Port)
			}
		}
	}
	if len(pods) == 0 {
		return nil
	}
	slices.Sort(declared)
	ports := "none"
	if len(declared) > 0 {
		ports = strings.Trim(strings.Join(strings.Fields(fmt.Sprint(declared)), ", "), "[]")
	}
	if s.PortName != "" {
		return fmt.Errorf("%s: spec.port: no Pod it selects (%s) has a TCP container port named %q (their TCP ports: %s); their ports keep the default policy",
			s.where(), strings.Join(pods, ", "), s.PortName, ports)
	}
	if len(declared) == 0 {
		// Pods that declare no port: as with Linkerd, the number applies
		// to whatever the pod serves on it.
		return nil
	}
	return fmt.Errorf("%s: spec.port: %d is no TCP container port of the Pods it selects (%s, which declare %s); the ports they serve keep the default policy",
		s.where(), s.Port, strings.Join(pods, ", "), ports)
}

// clusterIPProblems reports each clusterIP that several Services have,
// naming every one of them.
func (r *Resources) clusterIPProblems() []error {
	byIP := make(map[netip.Addr][]*Service)
	var ips []netip.Addr
	for _, s := range r.Services {
		if !s.ClusterIP.IsValid() {
			continue
		}
		if byIP[s.ClusterIP] == nil {
			ips = append(ips, s.ClusterIP)
		}
		byIP[s.ClusterIP] = append(byIP[s.ClusterIP], s)
	}
	var out []error
	for _, ip := range ips {
		svcs := byIP[ip]
		if len(svcs) < 2 {
			continue
		}
		others := make([]string, len(svcs)-1)
		for i, s := range svcs[1:] {
			others[i] = s.where()
		}
		out = append(out, fmt.Errorf("%s: spec.clusterIP: %s is also the clusterIP of %s; a GetProfile or an OutboundPolicies lookup of %s is refused (FailedPrecondition) until one Service alone has it",
			svcs[0].where(), ip, strings.Join(others, " and "), ip))
	}
	return out
}
