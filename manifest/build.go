package manifest

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/inmesh/inmesh/policy"
	"google.golang.org/grpc/codes"
)

// The values Linkerd's policy controller sends with every backend and
// protocol.
const (
	DefaultRTT             = 30 * time.Millisecond
	DefaultDecay           = 10 * time.Second
	DefaultQueueCapacity   = 100
	DefaultFailFastTimeout = 3 * time.Second
	DefaultDetectTimeout   = 10 * time.Second
	// ClusterDomain is the suffix of the Services' names.
	ClusterDomain = "svc.cluster.local"
)

// Authority returns the Destination path of a Service port,
// name.namespace.svc.cluster.local:port.
func Authority(namespace, name string, port uint16) string {
	return fmt.Sprintf("%s.%s.%s:%d", name, namespace, ClusterDomain, port)
}

// ParseAuthority splits an authority naming a Service port:
// name.namespace.svc.cluster.local:port, with or without a trailing dot, or
// the shorter name.namespace.svc:port and name.namespace:port. ok is false
// for anything else (IP addresses and names outside the cluster).
func ParseAuthority(authority string) (namespace, name string, port uint16, ok bool) {
	i := strings.LastIndexByte(authority, ':')
	if i < 0 {
		return "", "", 0, false
	}
	var p uint64
	if _, err := fmt.Sscanf(authority[i+1:], "%d", &p); err != nil || p == 0 || p > 65535 || fmt.Sprint(p) != authority[i+1:] {
		return "", "", 0, false
	}
	host := strings.TrimSuffix(strings.ToLower(authority[:i]), ".")
	host = strings.TrimSuffix(strings.TrimSuffix(host, ".cluster.local"), ".svc")
	labels := strings.Split(host, ".")
	if len(labels) != 2 || !isDNSLabel(labels[0]) || !isDNSLabel(labels[1]) {
		return "", "", 0, false
	}
	return labels[1], labels[0], uint16(p), true
}

// Service returns the Service namespace/name, or nil.
func (r *Resources) Service(namespace, name string) *Service {
	return r.index().service[nsName{namespace, name}]
}

// Policy returns the outbound policy of a Service port, as Linkerd's policy
// controller builds it, or nil when no Service manifest names that Service
// and port:
//
//   - The parent is the Service (group core, kind Service) and port.
//   - The GRPCRoutes whose parentRefs name the Service (and the port, or no
//     port), in the Service's namespace, make a gRPC policy (see
//     [Resources.PolicyFrom] for routes in other namespaces); otherwise the HTTPRoutes make a detect
//     policy with the same routes for HTTP/1 and HTTP/2. Without routes, the
//     controller's default route "http" sends everything to the Service.
//   - A rule's backendRefs become a random-available distribution by
//     weight (1 when not given); a rule without backendRefs goes to the
//     parent Service. A backendRef to a Service with a manifest is a
//     balancer over name.ns.svc.cluster.local:port (Destination Get); to a
//     Service without one, a backend that fails its requests with 500 and
//     the reason in l5d-proxy-error (gRPC: INTERNAL
//     with the reason in grpc-message).
//   - Retries and timeouts come from the retry.linkerd.io and
//     timeout.linkerd.io annotations. A route that sets a retry of its
//     own protocol (its conditions, or a limit or timeout other than
//     zero) replaces the Service's retry policy; one that sets any
//     timeout annotation replaces its timeouts; a rule's own timeouts field
//     replaces both annotations' timeouts.
//   - A route's hedge.inmesh.io annotations (delay, max-extra-load,
//     idempotent) are the hedging of each of its rules (beyond Linkerd).
//   - The Service's balancer.linkerd.io/failure-accrual annotations
//     (consecutive or unified, with their -max-failures, -min-penalty,
//     -max-penalty, -jitter-ratio and the alpha success-rate ones) are the
//     failure accrual of every protocol of the policy.
//   - A backend Service's outlier.inmesh.io annotations (inmesh only) are
//     the outlier detection of its balancer, wherever it is a backend.
func (r *Resources) Policy(namespace, name string, port uint16) *policy.Policy {
	return r.PolicyFrom(namespace, namespace, name, port)
}

// PolicyFrom is [Resources.Policy] as a client in namespace source sees
// it. As in Linkerd's policy controller
// (policy-controller/k8s/index/src/outbound/index.rs), the routes in the
// Service's own namespace (producer routes) apply to every client, and a
// route in another namespace (a consumer route) only to the clients of its
// own namespace.
func (r *Resources) PolicyFrom(source, namespace, name string, port uint16) (p *policy.Policy) {
	defer func() { r.withOutliers(p) }() // outlier.go
	sees := func(o *Object) bool { return o.Namespace == namespace || o.Namespace == source }
	x := r.index()
	svc := x.service[nsName{namespace, name}]
	if svc == nil {
		// As Linkerd's controller: a Service it does not know yet gets
		// the default policy, whose backend finds no endpoints until the
		// Service appears.
		svc = &Service{Object: Object{Group: "core", Kind: "Service", Namespace: namespace, Name: name}}
	}
	parent := policy.Metadata{Group: "core", Kind: "Service", Namespace: namespace, Name: name, Port: port}
	lb, _ := loadBiaser(svc.Annotations)
	self := serviceBackend(namespace, name, port, lb)
	svcHTTPRetry, _ := httpRetry(svc.Annotations)
	svcGRPCRetry, _ := grpcRetry(svc.Annotations)
	svcTimeouts, _ := timeouts(svc.Annotations)
	accrual, _ := failureAccrual(svc.Annotations)

	var grpcRoutes []policy.GRPCRoute
	for _, g := range byAge(x.grpcByParent[nsName{namespace, name}], func(g *GRPCRoute) *Object { return &g.Object }) {
		if !attached(g.ParentRefs, namespace, name, port) || !sees(&g.Object) {
			continue
		}
		retry := svcGRPCRetry
		if own, _ := grpcRetry(g.Annotations); own != nil {
			retry = own
		}
		routeTimeouts, _ := timeouts(g.Annotations)
		routeHedge, _ := hedgePolicy(g.Annotations)
		route := policy.GRPCRoute{Meta: routeMeta(&g.Object), Hosts: hostMatches(g.Hostnames)}
		for _, rule := range g.Rules {
			route.Rules = append(route.Rules, policy.GRPCRule{
				Matches:  rule.Matches,
				Filters:  rule.Filters,
				Backends: r.distribution(rule.BackendRefs, self, port, true, lb),
				Timeouts: ruleTimeouts(nil, routeTimeouts, svcTimeouts),
				Retry:    retry,
				Hedge:    routeHedge,
				Mirrors:  r.mirrors(rule.Mirrors),
			})
		}
		grpcRoutes = append(grpcRoutes, route)
	}
	app := strings.ToLower(svc.appProtocol(port))
	if app == "" {
		if opaque, _ := opaquePort(svc.Annotations, svc.Ports, port); opaque {
			app = "linkerd.io/opaque"
		}
	}
	switch app {
	case "", "http", "kubernetes.io/h2c":
	default:
		// linkerd.io/opaque, linkerd.io/tcp, an opaque port, or an
		// appProtocol Linkerd does not know: opaque, to the Service.
		return &policy.Policy{Parent: parent, Protocol: policy.ProtocolOpaque,
			Opaque: policy.OpaqueProtocol{Routes: []policy.OpaqueRoute{policy.DefaultOpaqueRoute(self)}}}
	}
	if len(grpcRoutes) > 0 && app != "http" {
		return &policy.Policy{Parent: parent, Protocol: policy.ProtocolGRPC,
			GRPC: policy.GRPCProtocol{Routes: grpcRoutes, FailureAccrual: accrual}}
	}

	var httpRoutes []policy.HTTPRoute
	for _, h := range byAge(x.httpByParent[nsName{namespace, name}], func(h *HTTPRoute) *Object { return &h.Object }) {
		if !attached(h.ParentRefs, namespace, name, port) || !sees(&h.Object) {
			continue
		}
		retry := svcHTTPRetry
		if own, _ := httpRetry(h.Annotations); own != nil {
			retry = own
		}
		routeTimeouts, _ := timeouts(h.Annotations)
		routeHedge, _ := hedgePolicy(h.Annotations)
		route := policy.HTTPRoute{Meta: routeMeta(&h.Object), Hosts: hostMatches(h.Hostnames)}
		for _, rule := range h.Rules {
			route.Rules = append(route.Rules, policy.HTTPRule{
				Matches:  rule.Matches,
				Filters:  rule.Filters,
				Backends: r.distribution(rule.BackendRefs, self, port, false, lb),
				Timeouts: ruleTimeouts(rule.Timeouts, routeTimeouts, svcTimeouts),
				Retry:    retry,
				Hedge:    routeHedge,
				Mirrors:  r.mirrors(rule.Mirrors),
			})
		}
		httpRoutes = append(httpRoutes, route)
	}
	if len(httpRoutes) == 0 {
		var tos policy.Timeouts
		if svcTimeouts != nil {
			tos = *svcTimeouts
		}
		httpRoutes = []policy.HTTPRoute{policy.DefaultHTTPRoute(self, svcHTTPRetry, tos)}
	}
	routes := policy.HTTPProtocol{Routes: httpRoutes, FailureAccrual: accrual}
	switch app {
	case "http":
		return &policy.Policy{Parent: parent, Protocol: policy.ProtocolHTTP1, HTTP1: routes}
	case "kubernetes.io/h2c":
		return &policy.Policy{Parent: parent, Protocol: policy.ProtocolHTTP2, HTTP2: routes}
	}
	return &policy.Policy{
		Parent:        parent,
		Protocol:      policy.ProtocolDetect,
		DetectTimeout: DefaultDetectTimeout,
		HTTP1:         routes,
		HTTP2:         routes,
		// What detection finds is not HTTP goes to the Service.
		Opaque: policy.OpaqueProtocol{Routes: []policy.OpaqueRoute{policy.DefaultOpaqueRoute(self)}},
	}
}

// byAge returns routes in the order a policy lists them, which decides
// between routes whose matches tie: the oldest by creationTimestamp first,
// routes without one after those with one, then by namespace and name (the
// order of Resources). Linkerd's policy controller orders them the same way
// (policy-controller/grpc/src/outbound.rs, timestamp_then_name).
func byAge[T any](routes []T, obj func(T) *Object) []T {
	out := slices.Clone(routes)
	slices.SortStableFunc(out, func(a, b T) int {
		ta, tb := obj(a).Created, obj(b).Created
		switch {
		case ta.IsZero() != tb.IsZero():
			if ta.IsZero() {
				return 1
			}
			return -1
		case !ta.Equal(tb):
			return ta.Compare(tb)
		}
		return 0
	})
	return out
}

func attached(parents []ParentRef, namespace, name string, port uint16) bool {
	for _, p := range parents {
		if p.IsService() && p.Namespace == namespace && p.Name == name && (p.Port == 0 || p.Port == port) {
			return true
		}
	}
	return false
}

func routeMeta(o *Object) policy.Metadata {
	return policy.Metadata{Group: o.Group, Kind: o.Kind, Namespace: o.Namespace, Name: o.Name}
}

func hostMatches(hosts []string) []policy.HostMatch {
	var out []policy.HostMatch
	for _, h := range hosts {
		out = append(out, policy.ParseHostMatch(h))
	}
	return out
}

// ruleTimeouts combines the timeouts of a rule as Linkerd's policy
// controller does (policy-controller/k8s/index/src/outbound/index/http.rs
// and grpc/src/outbound/http.rs): the route's timeout annotations, field by
// field; the rule's timeouts.request where the annotations set no request
// timeout (zero meaning none, as GEP-1742 says); and, when that leaves no
// timeout at all, the Service's annotations. A rule's backendRequest is
// read but not applied, as the controller does not apply it.
func ruleTimeouts(rule, route, service *policy.Timeouts) policy.Timeouts {
	var t policy.Timeouts
	if route != nil {
		t = *route
	}
	if t.Request == 0 && rule != nil {
		t.Request = rule.Request
	}
	if t == (policy.Timeouts{}) && service != nil {
		t = *service
	}
	return t
}

// backend returns the backend of a Service port: a balancer when the
// Service is known (with the parent Service's load biaser lb, if any),
// else a backend that fails its requests.
func (r *Resources) backend(namespace, name string, port uint16, lb *policy.LoadPenalty) policy.Backend {
	if r.Service(namespace, name) == nil {
		return policy.Backend{
			Meta:  policy.Metadata{Group: "core", Kind: "Service", Namespace: namespace, Name: name, Port: port},
			Queue: policy.Queue{Capacity: DefaultQueueCapacity, FailFastTimeout: DefaultFailFastTimeout},
		}
	}
	return serviceBackend(namespace, name, port, lb)
}

// serviceBackend is the balancer over a Service port's endpoints.
func serviceBackend(namespace, name string, port uint16, lb *policy.LoadPenalty) policy.Backend {
	return policy.Backend{
		Meta:     policy.Metadata{Group: "core", Kind: "Service", Namespace: namespace, Name: name, Port: port},
		Queue:    policy.Queue{Capacity: DefaultQueueCapacity, FailFastTimeout: DefaultFailFastTimeout},
		Balancer: &policy.Balancer{Authority: Authority(namespace, name, port), DefaultRTT: DefaultRTT, Decay: DefaultDecay, Penalty: lb},
	}
}

// invalidBackend fails its requests with msg: a 500 on HTTP routes, the
// gRPC status INTERNAL on gRPC routes. The messages are those of Linkerd's
// policy controller ("Service not found NAME", "missing port for backend
// Service NAME"); where it sends the gRPC code 500, outside gRPC's codes,
// INTERNAL is sent.
func invalidBackend(msg string, grpc bool) policy.Filter {
	if grpc {
		return policy.Filter{GRPCFailureInjector: &policy.GRPCFailureInjector{Code: codes.Internal, Message: msg}}
	}
	return policy.Filter{FailureInjector: &policy.FailureInjector{Status: 500, Message: msg}}
}

func (r *Resources) distribution(refs []BackendRef, self policy.Backend, parentPort uint16, grpc bool, lb *policy.LoadPenalty) policy.Distribution {
	if len(refs) == 0 {
		return policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{Backend: self}}}
	}
	d := policy.Distribution{Kind: policy.DistributionRandomAvailable}
	for _, ref := range refs {
		if ref.Port == 0 {
			// The Gateway API requires a port on a Service backendRef.
			d.Backends = append(d.Backends, policy.RouteBackend{
				Backend: policy.Backend{Meta: policy.DefaultMetadata("invalid"),
					Queue: policy.Queue{Capacity: DefaultQueueCapacity, FailFastTimeout: DefaultFailFastTimeout}},
				Weight:  ref.Weight,
				Filters: []policy.Filter{invalidBackend("missing port for backend Service "+ref.Name, grpc)},
			})
			continue
		}
		b := r.backend(ref.Namespace, ref.Name, ref.Port, lb)
		rb := policy.RouteBackend{Backend: b, Weight: ref.Weight, Filters: ref.Filters}
		if b.Balancer == nil {
			rb.Filters = []policy.Filter{invalidBackend("Service not found "+ref.Name, grpc)}
		}
		d.Backends = append(d.Backends, rb)
	}
	return d
}
