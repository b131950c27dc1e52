package manifest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/internal/yamltree"
)

// The inbound kinds, as they are listed in errors.
const inboundKinds = "policy.linkerd.io/v1beta3 (or v1beta1, v1beta2) Server; policy.linkerd.io/v1alpha1 " +
	"AuthorizationPolicy, MeshTLSAuthentication, NetworkAuthentication and HTTPLocalRateLimitPolicy"

const (
	linkerdPolicyGroup = "policy.linkerd.io"
	linkerdV1alpha1    = "policy.linkerd.io/v1alpha1"
)

// Pod is a v1 Pod manifest: what inbound policy needs of it.
type Pod struct {
	Object
	// ServiceAccountName is spec.serviceAccountName ("default" when absent).
	ServiceAccountName string
	// Ports are the ports of its containers and init containers.
	Ports []ContainerPort
	// Probes are the httpGet liveness, readiness and startup probes of its
	// containers and init containers.
	Probes []HTTPProbe
}

// ContainerPort is one port a container declares.
type ContainerPort struct {
	Name string
	Port uint16
	// Protocol is TCP (the default), UDP or SCTP.
	Protocol string
}

// HTTPProbe is an httpGet probe: its path ("/" when absent, the query
// kept) and its port. A port name is resolved, as Linkerd's controller
// does, through the TCP ports of the probe's own container (the first of
// that name, any case); Port is zero when none has it.
type HTTPProbe struct {
	Path     string
	Port     uint16
	PortName string
}

// PortsNamed returns the TCP ports the pod's containers declare under name
// (one per container that declares it).
func (p *Pod) PortsNamed(name string) []uint16 {
	var out []uint16
	for _, cp := range p.Ports {
		if cp.Name == name && cp.Protocol == "TCP" && !slices.Contains(out, cp.Port) {
			out = append(out, cp.Port)
		}
	}
	return out
}

// LabelSelector is a Kubernetes label selector: every matchLabels pair and
// every matchExpressions requirement must hold; an empty selector selects
// everything.
type LabelSelector struct {
	MatchLabels      map[string]string
	MatchExpressions []LabelRequirement
}

// LabelRequirement is one matchExpressions entry. Operator is In, NotIn,
// Exists or DoesNotExist.
type LabelRequirement struct {
	Key, Operator string
	Values        []string
}

// Matches reports whether labels satisfy s.
func (s *LabelSelector) Matches(labels map[string]string) bool {
	for k, v := range s.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	for _, r := range s.MatchExpressions {
		v, ok := labels[r.Key]
		switch r.Operator {
		case "In":
			if !ok || !slices.Contains(r.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(r.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		}
	}
	return true
}

// Server is a policy.linkerd.io Server: the inbound policy of the pod
// ports it selects.
type Server struct {
	Object
	// PodSelector selects the pods; nil when the Server selects external
	// workloads instead (which no manifest describes).
	PodSelector *LabelSelector
	// Port is the port number, or zero with PortName naming container ports.
	Port     uint16
	PortName string
	// Protocol is spec.proxyProtocol (absent or unknown: detect).
	Protocol authz.Protocol
	// AccessPolicy is spec.accessPolicy; deny when absent, as the CRD's
	// schema default has it for every version of the resource.
	AccessPolicy authz.Mode
}

// Ref is a reference to a resource (a targetRef, an authentication ref,
// a client ref). Namespace is filled in with the referrer's when absent
// and the kind is namespaced.
type Ref struct {
	Group, Kind, Name, Namespace string
}

func (r Ref) is(group, kind string) bool {
	g := strings.ToLower(r.Group)
	if g == "core" {
		g = ""
	}
	return g == strings.ToLower(group) && strings.EqualFold(r.Kind, kind)
}

func (r Ref) String() string {
	if r.Group == "" {
		return r.Kind + " " + r.Namespace + "/" + r.Name
	}
	return r.Kind + "." + r.Group + " " + r.Namespace + "/" + r.Name
}

// AuthorizationPolicy is a policy.linkerd.io/v1alpha1 AuthorizationPolicy.
type AuthorizationPolicy struct {
	Object
	// TargetRef is a Server, an HTTPRoute, a GRPCRoute or the policy's own
	// Namespace.
	TargetRef Ref
	// RequiredAuthenticationRefs hold at most one MeshTLSAuthentication or
	// ServiceAccount and at most one NetworkAuthentication.
	RequiredAuthenticationRefs []Ref
}

// MeshTLSAuthentication is a policy.linkerd.io/v1alpha1
// MeshTLSAuthentication.
type MeshTLSAuthentication struct {
	Object
	// Identities are exact identities, "*" (any) or "*.suffix".
	Identities []string
	// IdentityRefs are ServiceAccounts and Namespaces.
	IdentityRefs []Ref
}

// NetworkAuthentication is a policy.linkerd.io/v1alpha1
// NetworkAuthentication.
type NetworkAuthentication struct {
	Object
	Networks []authz.Network
}

// HTTPLocalRateLimitPolicy is a policy.linkerd.io/v1alpha1
// HTTPLocalRateLimitPolicy.
type HTTPLocalRateLimitPolicy struct {
	Object
	// TargetRef is the Server limited.
	TargetRef Ref
	// Total and Identity are requests per second; zero is no limit.
	Total, Identity uint32
	Overrides       []RateLimitOverride
}

// RateLimitOverride is a rate shared by the ServiceAccounts it lists.
type RateLimitOverride struct {
	RPS        uint32
	ClientRefs []Ref
}

func (r *Resources) appendInbound(o *Resources) {
	r.Pods = append(r.Pods, o.Pods...)
	r.Servers = append(r.Servers, o.Servers...)
	r.AuthorizationPolicies = append(r.AuthorizationPolicies, o.AuthorizationPolicies...)
	r.MeshTLSAuthentications = append(r.MeshTLSAuthentications, o.MeshTLSAuthentications...)
	r.NetworkAuthentications = append(r.NetworkAuthentications, o.NetworkAuthentications...)
	r.HTTPLocalRateLimitPolicies = append(r.HTTPLocalRateLimitPolicies, o.HTTPLocalRateLimitPolicies...)
}

func (r *Resources) inboundObjects() []*Object {
	var out []*Object
	for _, x := range r.Pods {
		out = append(out, &x.Object)
	}
	for _, x := range r.Servers {
		out = append(out, &x.Object)
	}
	for _, x := range r.AuthorizationPolicies {
		out = append(out, &x.Object)
	}
	for _, x := range r.MeshTLSAuthentications {
		out = append(out, &x.Object)
	}
	for _, x := range r.NetworkAuthentications {
		out = append(out, &x.Object)
	}
	for _, x := range r.HTTPLocalRateLimitPolicies {
		out = append(out, &x.Object)
	}
	return out
}

func sortByKey[T any](s []T, obj func(T) *Object) {
	slices.SortStableFunc(s, func(a, b T) int { return strings.Compare(obj(a).key(), obj(b).key()) })
}

func (r *Resources) sortInbound() {
	sortByKey(r.Pods, func(x *Pod) *Object { return &x.Object })
	sortByKey(r.Servers, func(x *Server) *Object { return &x.Object })
	sortByKey(r.AuthorizationPolicies, func(x *AuthorizationPolicy) *Object { return &x.Object })
	sortByKey(r.MeshTLSAuthentications, func(x *MeshTLSAuthentication) *Object { return &x.Object })
	sortByKey(r.NetworkAuthentications, func(x *NetworkAuthentication) *Object { return &x.Object })
	sortByKey(r.HTTPLocalRateLimitPolicies, func(x *HTTPLocalRateLimitPolicy) *Object { return &x.Object })
}

// parseInbound reads the inbound kinds; known is false for any other.
func parseInbound(apiVersion, kind string, obj *Object, spec yamltree.Node, out *Resources) (known bool, err error) {
	switch {
	case kind == "Pod" && apiVersion == "v1":
		p := &Pod{Object: *obj}
		if err := p.parseSpec(spec); err != nil {
			return true, err
		}
		if err := checkPodAnnotations(p.Annotations); err != nil {
			return true, err
		}
		out.Pods = append(out.Pods, p)
	case kind == "Server" && (apiVersion == linkerdV1beta3 || apiVersion == "policy.linkerd.io/v1beta2" || apiVersion == "policy.linkerd.io/v1beta1"):
		obj.Group = linkerdPolicyGroup
		s := &Server{Object: *obj}
		if err := s.parseSpec(spec, apiVersion); err != nil {
			return true, err
		}
		if _, err := authz.MaxConcurrentRequestsFrom(s.Annotations); err != nil {
			return true, fmt.Errorf("metadata.%w", err)
		}
		out.Servers = append(out.Servers, s)
	case kind == "AuthorizationPolicy" && apiVersion == linkerdV1alpha1:
		obj.Group = linkerdPolicyGroup
		a := &AuthorizationPolicy{Object: *obj}
		if err := a.parseSpec(spec); err != nil {
			return true, err
		}
		out.AuthorizationPolicies = append(out.AuthorizationPolicies, a)
	case kind == "MeshTLSAuthentication" && apiVersion == linkerdV1alpha1:
		obj.Group = linkerdPolicyGroup
		m := &MeshTLSAuthentication{Object: *obj}
		if err := m.parseSpec(spec); err != nil {
			return true, err
		}
		out.MeshTLSAuthentications = append(out.MeshTLSAuthentications, m)
	case kind == "NetworkAuthentication" && apiVersion == linkerdV1alpha1:
		obj.Group = linkerdPolicyGroup
		n := &NetworkAuthentication{Object: *obj}
		if err := n.parseSpec(spec); err != nil {
			return true, err
		}
		out.NetworkAuthentications = append(out.NetworkAuthentications, n)
	case kind == "HTTPLocalRateLimitPolicy" && apiVersion == linkerdV1alpha1:
		obj.Group = linkerdPolicyGroup
		l := &HTTPLocalRateLimitPolicy{Object: *obj}
		if err := l.parseSpec(spec); err != nil {
			return true, err
		}
		out.HTTPLocalRateLimitPolicies = append(out.HTTPLocalRateLimitPolicies, l)
	default:
		return false, nil
	}
	return true, nil
}

var podSpecFields = []string{"containers", "initContainers", "ephemeralContainers", "serviceAccountName",
	"serviceAccount", "automountServiceAccountToken", "volumes", "nodeSelector", "nodeName", "affinity",
	"tolerations", "restartPolicy", "terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy",
	"dnsConfig", "hostNetwork", "hostPID", "hostIPC", "hostUsers", "shareProcessNamespace", "securityContext",
	"imagePullSecrets", "hostname", "subdomain", "schedulerName", "priorityClassName", "priority",
	"preemptionPolicy", "readinessGates", "runtimeClassName", "enableServiceLinks", "overhead",
	"topologySpreadConstraints", "setHostnameAsFQDN", "os", "schedulingGates", "resourceClaims", "hostAliases",
	"resources"}

var containerFields = []string{"name", "image", "command", "args", "env", "envFrom", "ports", "resources",
	"volumeMounts", "volumeDevices", "livenessProbe", "readinessProbe", "startupProbe", "imagePullPolicy",
	"securityContext", "workingDir", "lifecycle", "terminationMessagePath", "terminationMessagePolicy",
	"stdin", "stdinOnce", "tty", "resizePolicy", "restartPolicy"}

var probeFields = []string{"httpGet", "tcpSocket", "exec", "grpc", "initialDelaySeconds", "periodSeconds",
	"timeoutSeconds", "successThreshold", "failureThreshold", "terminationGracePeriodSeconds"}

func (p *Pod) parseSpec(spec yamltree.Node) error {
	obj, err := spec.Object(podSpecFields...)
	if err != nil {
		return err
	}
	if p.ServiceAccountName, err = optionalString(obj, "serviceAccountName"); err != nil {
		return err
	}
	if p.ServiceAccountName == "" {
		p.ServiceAccountName = "default"
	}
	for _, field := range []string{"containers", "initContainers"} {
		cn, ok := obj[field]
		if !ok || cn.Value == nil {
			continue
		}
		items, err := cn.List()
		if err != nil {
			return err
		}
		for _, item := range items {
			if err := p.parseContainer(item); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *Pod) parseContainer(n yamltree.Node) error {
	obj, err := n.Object(containerFields...)
	if err != nil {
		return err
	}
	first := len(p.Ports)
	if pn, ok := obj["ports"]; ok && pn.Value != nil {
		items, err := pn.List()
		if err != nil {
			return err
		}
		for _, item := range items {
			po, err := item.Object("name", "containerPort", "protocol", "hostPort", "hostIP")
			if err != nil {
				return err
			}
			var cp ContainerPort
			if cp.Name, err = optionalString(po, "name"); err != nil {
				return err
			}
			cn, ok := po["containerPort"]
			if !ok {
				return yamltree.Node{Path: item.Child("containerPort")}.Errorf("required")
			}
			if cp.Port, err = port(cn); err != nil {
				return err
			}
			if cp.Protocol, err = optionalString(po, "protocol"); err != nil {
				return err
			}
			switch cp.Protocol {
			case "":
				cp.Protocol = "TCP"
			case "TCP", "UDP", "SCTP":
			default:
				return po["protocol"].Errorf("%q is not TCP, UDP or SCTP", cp.Protocol)
			}
			p.Ports = append(p.Ports, cp)
		}
	}
	for _, field := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
		pn, ok := obj[field]
		if !ok || pn.Value == nil {
			continue
		}
		po, err := pn.Object(probeFields...)
		if err != nil {
			return err
		}
		hn, ok := po["httpGet"]
		if !ok || hn.Value == nil {
			continue
		}
		ho, err := hn.Object("path", "port", "host", "scheme", "httpHeaders")
		if err != nil {
			return err
		}
		var probe HTTPProbe
		if probe.Path, err = optionalString(ho, "path"); err != nil {
			return err
		}
		if probe.Path == "" {
			probe.Path = "/"
		}
		if probe.Port, probe.PortName, err = portOrName(hn, ho); err != nil {
			return err
		}
		if probe.PortName != "" {
			for _, cp := range p.Ports[first:] {
				if cp.Protocol == "TCP" && strings.EqualFold(cp.Name, probe.PortName) {
					probe.Port = cp.Port
					break
				}
			}
		}
		p.Probes = append(p.Probes, probe)
	}
	return nil
}

// portOrName reads a required port field that is a number or a name.
func portOrName(parent yamltree.Node, obj map[string]yamltree.Node) (uint16, string, error) {
	pn, ok := obj["port"]
	if !ok {
		return 0, "", yamltree.Node{Path: parent.Child("port")}.Errorf("required")
	}
	if s, ok := pn.Value.(string); ok {
		if s == "" || len(s) > 15 || !isDNSLabel(s) {
			return 0, "", pn.Errorf("%q is not a port name (up to 15 lower case letters, digits and '-')", s)
		}
		return 0, s, nil
	}
	p, err := port(pn)
	return p, "", err
}

// The pod annotations read for its ports that no Server selects.
const (
	AnnotationDefaultInboundPolicy = "config.linkerd.io/default-inbound-policy"
	AnnotationRequireIdentityPorts = "config.linkerd.io/proxy-require-identity-inbound-ports"
)

func checkPodAnnotations(a map[string]string) error {
	if v, ok := a[AnnotationDefaultInboundPolicy]; ok {
		if _, err := authz.ParseMode(v); err != nil {
			return annotationErr(AnnotationDefaultInboundPolicy, "%v", err)
		}
	}
	if _, err := portListed(a, AnnotationRequireIdentityPorts, 0); err != nil {
		return err
	}
	if _, err := authz.MaxConcurrentRequestsFrom(a); err != nil {
		return fmt.Errorf("metadata.%w", err)
	}
	return nil
}

// portListed reports whether port is in the port list of annotation key
// ("8080,9000-9010"); false when the annotation is absent.
func portListed(a map[string]string, key string, port uint16) (bool, error) {
	v, ok := a[key]
	if !ok {
		return false, nil
	}
	return portsContain(key, v, port, nil)
}

var serverSpecFields = []string{"podSelector", "port", "proxyProtocol"}

func (s *Server) parseSpec(spec yamltree.Node, apiVersion string) error {
	fields := serverSpecFields
	switch apiVersion {
	case "policy.linkerd.io/v1beta2":
		fields = append(slices.Clone(fields), "externalWorkloadSelector")
	case linkerdV1beta3:
		fields = append(slices.Clone(fields), "externalWorkloadSelector", "accessPolicy")
	}
	obj, err := spec.Object(fields...)
	if err != nil {
		return err
	}
	pn, hasPods := obj["podSelector"]
	wn, hasWorkloads := obj["externalWorkloadSelector"]
	switch {
	case hasPods && hasWorkloads:
		return spec.Errorf("podSelector and externalWorkloadSelector are exclusive")
	case hasPods:
		if s.PodSelector, err = parseSelector(pn); err != nil {
			return err
		}
	case hasWorkloads:
		if _, err = parseSelector(wn); err != nil {
			return err
		}
	default:
		return yamltree.Node{Path: spec.Child("podSelector")}.Errorf("required (or externalWorkloadSelector)")
	}
	if s.Port, s.PortName, err = portOrName(spec, obj); err != nil {
		return err
	}
	proto, err := optionalString(obj, "proxyProtocol")
	if err != nil {
		return err
	}
	switch proto {
	case "", "unknown":
		s.Protocol = authz.ProtocolDetect
	case "HTTP/1":
		s.Protocol = authz.ProtocolHTTP1
	case "HTTP/2":
		s.Protocol = authz.ProtocolHTTP2
	case "gRPC":
		s.Protocol = authz.ProtocolGRPC
	case "opaque":
		s.Protocol = authz.ProtocolOpaque
	case "TLS":
		s.Protocol = authz.ProtocolTLS
	default:
		return obj["proxyProtocol"].Errorf("%q is not unknown, HTTP/1, HTTP/2, gRPC, opaque or TLS", proto)
	}
	s.AccessPolicy = authz.Deny
	if an, ok := obj["accessPolicy"]; ok && an.Value != nil {
		v, err := an.Str()
		if err != nil {
			return err
		}
		if s.AccessPolicy, err = authz.ParseMode(v); err != nil {
			return an.Errorf("%v", err)
		}
	}
	return nil
}

func parseSelector(n yamltree.Node) (*LabelSelector, error) {
	sel := &LabelSelector{}
	if n.Value == nil {
		return sel, nil
	}
	obj, err := n.Object("matchLabels", "matchExpressions")
	if err != nil {
		return nil, err
	}
	if ln, ok := obj["matchLabels"]; ok && ln.Value != nil {
		if sel.MatchLabels, err = stringMap(ln); err != nil {
			return nil, err
		}
	}
	if en, ok := obj["matchExpressions"]; ok && en.Value != nil {
		items, err := en.List()
		if err != nil {
			return nil, err
		}
		for _, item := range items {
			eo, err := item.Object("key", "operator", "values")
			if err != nil {
				return nil, err
			}
			var r LabelRequirement
			if r.Key, err = requiredString(item, eo, "key"); err != nil {
				return nil, err
			}
			if r.Operator, err = requiredString(item, eo, "operator"); err != nil {
				return nil, err
			}
			if vn, ok := eo["values"]; ok && vn.Value != nil {
				vs, err := vn.List()
				if err != nil {
					return nil, err
				}
				for _, v := range vs {
					s, err := v.Scalar()
					if err != nil {
						return nil, err
					}
					r.Values = append(r.Values, s)
				}
			}
			switch r.Operator {
			case "In", "NotIn":
				if len(r.Values) == 0 {
					return nil, yamltree.Node{Path: item.Child("values")}.Errorf("required, not empty, with operator %s", r.Operator)
				}
			case "Exists", "DoesNotExist":
				if len(r.Values) != 0 {
					return nil, eo["values"].Errorf("must be empty with operator %s", r.Operator)
				}
			default:
				return nil, eo["operator"].Errorf("%q is not In, NotIn, Exists or DoesNotExist", r.Operator)
			}
			sel.MatchExpressions = append(sel.MatchExpressions, r)
		}
	}
	return sel, nil
}

// parseRef reads a reference; namespace is the referrer's, filled in when
// the reference gives none.
func parseRef(n yamltree.Node, namespace string) (Ref, error) {
	obj, err := n.Object("group", "kind", "name", "namespace", "sectionName", "port")
	if err != nil {
		return Ref{}, err
	}
	if sn, ok := obj["sectionName"]; ok {
		return Ref{}, sn.Errorf("not supported on this reference")
	}
	if pn, ok := obj["port"]; ok {
		return Ref{}, pn.Errorf("not supported on this reference")
	}
	var r Ref
	if r.Group, err = optionalString(obj, "group"); err != nil {
		return r, err
	}
	if r.Kind, err = requiredString(n, obj, "kind"); err != nil {
		return r, err
	}
	if r.Name, err = requiredString(n, obj, "name"); err != nil {
		return r, err
	}
	if r.Namespace, err = optionalString(obj, "namespace"); err != nil {
		return r, err
	}
	if r.Namespace == "" && !r.is("", "Namespace") {
		r.Namespace = namespace
	}
	return r, nil
}

func parseRefs(n yamltree.Node, namespace string) ([]Ref, []yamltree.Node, error) {
	if n.Value == nil {
		return nil, nil, nil
	}
	items, err := n.List()
	if err != nil {
		return nil, nil, err
	}
	var out []Ref
	for _, item := range items {
		r, err := parseRef(item, namespace)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, r)
	}
	return out, items, nil
}

func (a *AuthorizationPolicy) parseSpec(spec yamltree.Node) error {
	obj, err := spec.Object("targetRef", "requiredAuthenticationRefs")
	if err != nil {
		return err
	}
	tn, ok := obj["targetRef"]
	if !ok {
		return yamltree.Node{Path: spec.Child("targetRef")}.Errorf("required")
	}
	if a.TargetRef, err = parseRef(tn, a.Namespace); err != nil {
		return err
	}
	t := a.TargetRef
	switch {
	case t.is(linkerdPolicyGroup, "Server"), t.is(linkerdPolicyGroup, "HTTPRoute"),
		t.is("gateway.networking.k8s.io", "HTTPRoute"), t.is("gateway.networking.k8s.io", "GRPCRoute"):
		if t.Namespace != a.Namespace {
			return yamltree.Node{Path: tn.Child("namespace")}.Errorf("%q is not the policy's namespace %q", t.Namespace, a.Namespace)
		}
	case t.is("", "Namespace"):
		if t.Name != a.Namespace {
			return yamltree.Node{Path: tn.Child("name")}.Errorf("%q is not the policy's namespace %q", t.Name, a.Namespace)
		}
	default:
		return tn.Errorf("%s is not a target (a Server or HTTPRoute of policy.linkerd.io, an HTTPRoute or GRPCRoute of gateway.networking.k8s.io, or the policy's Namespace)", t)
	}
	rn, ok := obj["requiredAuthenticationRefs"]
	if !ok {
		return yamltree.Node{Path: spec.Child("requiredAuthenticationRefs")}.Errorf("required (an empty list admits every client)")
	}
	refs, items, err := parseRefs(rn, a.Namespace)
	if err != nil {
		return err
	}
	var mtls, net int
	for i, r := range refs {
		switch {
		case r.is(linkerdPolicyGroup, "MeshTLSAuthentication"), r.is("", "ServiceAccount"):
			mtls++
			if mtls > 1 {
				return items[i].Errorf("at most one MeshTLSAuthentication or ServiceAccount may be required")
			}
		case r.is(linkerdPolicyGroup, "NetworkAuthentication"):
			net++
			if net > 1 {
				return items[i].Errorf("at most one NetworkAuthentication may be required")
			}
		default:
			return items[i].Errorf("%s is not a MeshTLSAuthentication, NetworkAuthentication or ServiceAccount", r)
		}
	}
	a.RequiredAuthenticationRefs = refs
	return nil
}

func (m *MeshTLSAuthentication) parseSpec(spec yamltree.Node) error {
	obj, err := spec.Object("identities", "identityRefs")
	if err != nil {
		return err
	}
	in, hasIDs := obj["identities"]
	hasIDs = hasIDs && in.Value != nil
	if rn, ok := obj["identityRefs"]; ok && rn.Value != nil && hasIDs {
		// The CRD's schema takes one of the two (oneOf).
		return rn.Errorf("set beside identities: a MeshTLSAuthentication takes identities or identityRefs, not both")
	}
	if hasIDs {
		items, err := in.List()
		if err != nil {
			return err
		}
		for _, item := range items {
			s, err := item.Str()
			if err != nil {
				return err
			}
			if s == "" {
				return item.Errorf("must not be empty")
			}
			if why := identityProblem(s); why != "" {
				return item.Errorf("identity %q is invalid: %s", s, why)
			}
			m.Identities = append(m.Identities, s)
		}
	}
	refs, items, err := parseRefs(obj["identityRefs"], m.Namespace)
	if err != nil {
		return err
	}
	for i, r := range refs {
		switch {
		case r.is("", "ServiceAccount"):
		case r.is("", "Namespace"):
			if r.Namespace != "" {
				return yamltree.Node{Path: items[i].Child("namespace")}.Errorf("a Namespace reference takes no namespace")
			}
		default:
			return items[i].Errorf("%s is not a ServiceAccount or a Namespace", r)
		}
	}
	m.IdentityRefs = refs
	if len(m.Identities) == 0 && len(m.IdentityRefs) == 0 {
		return spec.Errorf("identities or identityRefs must name at least one identity")
	}
	return nil
}

// identityProblem says why id is not an identity a MeshTLSAuthentication
// may list, "" when it is one. As Linkerd's policy admission checks it
// (policy-controller/runtime/src/validation.rs, validate_identity), an
// identity is a SPIFFE ID or a DNS-like name. A SPIFFE ID is spiffe://,
// a trust domain of lowercase letters, digits, dots, dashes and
// underscores, and an optional path whose segments hold letters, digits,
// dots, dashes and underscores, none empty, none "." or "..", with no
// trailing slash. A DNS-like name is dot-separated labels of lowercase
// letters, digits and inner dashes; its first label may be "*" instead.
func identityProblem(id string) string {
	rest, spiffe := strings.CutPrefix(id, "spiffe://")
	if !spiffe {
		for i, label := range strings.Split(id, ".") {
			if !(i == 0 && label == "*") && !dnsLabel(label) {
				return "not a SPIFFE ID nor a DNS-like name (dot-separated labels of lowercase letters, digits and inner dashes, the first of which may be *)"
			}
		}
		return ""
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		i = len(rest)
	}
	if i == 0 {
		return "the SPIFFE trust domain is missing"
	}
	for _, c := range []byte(rest[:i]) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return "a SPIFFE trust domain holds only lowercase letters, digits, dots, dashes and underscores"
		}
	}
	path := rest[i:]
	if path == "" {
		return ""
	}
	// Each segment from its slash on: checked as a scan meets it, so that
	// the first mistake from the left is the one named.
	segment := func(s string) string {
		switch s {
		case "/":
			return "a SPIFFE path has no empty segments"
		case "/.", "/..":
			return "a SPIFFE path has no . or .. segments"
		}
		return ""
	}
	start := 0
	for j := 0; j < len(path); j++ {
		c := path[j]
		if c == '/' {
			if why := segment(path[start:j]); why != "" {
				return why
			}
			start = j
			continue
		}
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return "a SPIFFE path segment holds only letters, digits, dots, dashes and underscores"
		}
	}
	if path[start:] == "/" {
		return "a SPIFFE path ends with no slash"
	}
	return segment(path[start:])
}

// dnsLabel reports whether s is a label of a DNS-like identity: lowercase
// letters, digits and dashes, starting and ending with a letter or digit.
func dnsLabel(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func (n *NetworkAuthentication) parseSpec(spec yamltree.Node) error {
	obj, err := spec.Object("networks")
	if err != nil {
		return err
	}
	nn, ok := obj["networks"]
	if !ok || nn.Value == nil {
		return yamltree.Node{Path: spec.Child("networks")}.Errorf("required")
	}
	items, err := nn.List()
	if err != nil {
		return err
	}
	if len(items) == 0 {
		return nn.Errorf("must list at least one network")
	}
	for _, item := range items {
		no, err := item.Object("cidr", "except")
		if err != nil {
			return err
		}
		cn, ok := no["cidr"]
		if !ok {
			return yamltree.Node{Path: item.Child("cidr")}.Errorf("required")
		}
		var network authz.Network
		if network.Net, err = parseCIDR(cn); err != nil {
			return err
		}
		if en, ok := no["except"]; ok && en.Value != nil {
			excepts, err := en.List()
			if err != nil {
				return err
			}
			for _, x := range excepts {
				e, err := parseCIDR(x)
				if err != nil {
					return err
				}
				if e.Addr().Is4() != network.Net.Addr().Is4() || e.Bits() < network.Net.Bits() || !network.Net.Contains(e.Addr()) {
					return x.Errorf("%s is not inside %s", e, network.Net)
				}
				if e.Bits() == network.Net.Bits() {
					return x.Errorf("%s excludes all of %s", e, network.Net)
				}
				network.Except = append(network.Except, e)
			}
		}
		n.Networks = append(n.Networks, network)
	}
	return nil
}

// parseCIDR reads a network, or one address as a network of one address.
func parseCIDR(n yamltree.Node) (netip.Prefix, error) {
	s, err := n.Str()
	if err != nil {
		return netip.Prefix{}, err
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, n.Errorf("%q is not a network (such as 10.0.0.0/8) or an address", s)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, n.Errorf("%q is not a network (such as 10.0.0.0/8) or an address", s)
	}
	return p.Masked(), nil
}

func (l *HTTPLocalRateLimitPolicy) parseSpec(spec yamltree.Node) error {
	obj, err := spec.Object("targetRef", "total", "identity", "overrides")
	if err != nil {
		return err
	}
	tn, ok := obj["targetRef"]
	if !ok {
		return yamltree.Node{Path: spec.Child("targetRef")}.Errorf("required")
	}
	if l.TargetRef, err = parseRef(tn, l.Namespace); err != nil {
		return err
	}
	if !l.TargetRef.is(linkerdPolicyGroup, "Server") {
		return tn.Errorf("%s is not a Server of policy.linkerd.io", l.TargetRef)
	}
	if l.TargetRef.Namespace != l.Namespace {
		return yamltree.Node{Path: tn.Child("namespace")}.Errorf("%q is not the policy's namespace %q", l.TargetRef.Namespace, l.Namespace)
	}
	rps := func(parent yamltree.Node) (uint32, error) {
		if parent.Value == nil {
			return 0, nil
		}
		o, err := parent.Object("requestsPerSecond")
		if err != nil {
			return 0, err
		}
		rn, ok := o["requestsPerSecond"]
		if !ok {
			return 0, yamltree.Node{Path: parent.Child("requestsPerSecond")}.Errorf("required")
		}
		return rn.Uint32()
	}
	if l.Total, err = rps(obj["total"]); err != nil {
		return err
	}
	if l.Identity, err = rps(obj["identity"]); err != nil {
		return err
	}
	if l.Total > 0 && l.Identity > l.Total {
		return yamltree.Node{Path: spec.Child("identity.requestsPerSecond")}.Errorf("%d is more than total.requestsPerSecond %d", l.Identity, l.Total)
	}
	on, ok := obj["overrides"]
	if !ok || on.Value == nil {
		return nil
	}
	items, err := on.List()
	if err != nil {
		return err
	}
	for _, item := range items {
		oo, err := item.Object("requestsPerSecond", "clientRefs")
		if err != nil {
			return err
		}
		var o RateLimitOverride
		rn, ok := oo["requestsPerSecond"]
		if !ok {
			return yamltree.Node{Path: item.Child("requestsPerSecond")}.Errorf("required")
		}
		if o.RPS, err = rn.Uint32(); err != nil {
			return err
		}
		if l.Total > 0 && o.RPS > l.Total {
			return rn.Errorf("%d is more than total.requestsPerSecond %d", o.RPS, l.Total)
		}
		cn, ok := oo["clientRefs"]
		if !ok || cn.Value == nil {
			return yamltree.Node{Path: item.Child("clientRefs")}.Errorf("required")
		}
		// An empty list is valid, as Linkerd's CRD has it: the override
		// limits nobody, and proxies leave it out.
		refs, refItems, err := parseRefs(cn, l.Namespace)
		if err != nil {
			return err
		}
		for i, r := range refs {
			if !r.is("", "ServiceAccount") {
				return refItems[i].Errorf("%s is not a ServiceAccount", r)
			}
		}
		o.ClientRefs = refs
		l.Overrides = append(l.Overrides, o)
	}
	return nil
}
