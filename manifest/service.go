package manifest

import (
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inmesh/inmesh/internal/yamltree"
	"github.com/inmesh/inmesh/policy"
	"google.golang.org/grpc/codes"
)

// Service is a v1 Service manifest: the embedded control plane knows a
// Service, and serves its policy, when it has one.
type Service struct {
	Object
	// Ports are the Service's ports; empty means any port.
	Ports []ServicePort
	// ClusterIP is spec.clusterIP, when it is an address: the embedded
	// Destination API answers a GetProfile of it with the Service's
	// profile, as Linkerd's controller does. "None" (a headless Service)
	// and an absent field leave it invalid.
	ClusterIP netip.Addr
	// Selector is spec.selector: the labels of the Pods that back the
	// Service, whose service accounts may register its endpoints (see
	// [Resources.RegistrationIdentities]). Nil when absent.
	Selector map[string]string
}

// OpaquePort reports whether traffic to port of the Service is opaque: the
// port is listed by its config.linkerd.io/opaque-ports annotation or, when
// it has none, is one of [DefaultOpaquePorts], as Linkerd's destination
// controller decides it
// (controller/api/destination/watcher/opaque_ports_watcher.go). A nil
// Service (one without a manifest) has the default opaque ports.
func (s *Service) OpaquePort(port uint16) bool {
	if s == nil {
		return slices.Contains(DefaultOpaquePorts, port)
	}
	opaque, _ := opaquePort(s.Annotations, s.Ports, port)
	return opaque
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name string
	Port uint16
	// AppProtocol is the port's appProtocol: "http" makes its policy
	// HTTP/1-only, "kubernetes.io/h2c" HTTP/2-only (gRPC with GRPCRoutes),
	// "linkerd.io/opaque", "linkerd.io/tcp" or any other value opaque.
	AppProtocol string
}

// DefaultOpaquePorts are the ports whose traffic is opaque unless the
// Service's config.linkerd.io/opaque-ports annotation says otherwise: the
// default of Linkerd's control plane (its proxy.opaquePorts value; SMTP,
// MySQL, Galera, PostgreSQL, Redis, Elasticsearch and Memcached).
var DefaultOpaquePorts = []uint16{25, 587, 3306, 4444, 5432, 6379, 9300, 11211}

// AnnotationOpaquePorts lists a Service's opaque ports ("3306,5000-5010"),
// in place of [DefaultOpaquePorts].
const AnnotationOpaquePorts = "config.linkerd.io/opaque-ports"

// opaquePort returns whether port is opaque by the Service's annotation or
// the defaults. The annotation may name a port of the Service ("mysql"), as
// in Linkerd (controller/api/destination/watcher/opaque_ports_watcher.go
// isNamed): names are looked up in ports first, so that a name that looks
// like a range ("123-456") is the port of that name. With nil ports (a
// check of the annotation alone) any port name is accepted.
func opaquePort(a map[string]string, ports []ServicePort, port uint16) (bool, error) {
	v, ok := a[AnnotationOpaquePorts]
	if !ok {
		return slices.Contains(DefaultOpaquePorts, port), nil
	}
	named := func(name string) (uint16, bool) {
		if ports == nil {
			return 0, isDNSLabel(name) && strings.ContainsFunc(name, func(r rune) bool { return r < '0' || r > '9' })
		}
		for _, sp := range ports {
			if sp.Name != "" && sp.Name == name {
				return sp.Port, true
			}
		}
		return 0, false
	}
	return portsContain(AnnotationOpaquePorts, v, port, named)
}

// portsContain reports whether port is in v, the list of ports and port
// ranges of the annotation key ("3306,5000-5010"); named, when not nil,
// resolves a port's name first (a name that names no port matches none).
func portsContain(key, v string, port uint16, named func(string) (uint16, bool)) (bool, error) {
	found := false
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if named != nil {
			if p, ok := named(item); ok {
				found = found || p != 0 && p == port
				continue
			}
		}
		lo, hi, isRange := strings.Cut(item, "-")
		l, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
		h := l
		var err2 error
		if isRange {
			h, err2 = strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
		}
		if err1 != nil || err2 != nil || l == 0 || h < l {
			return false, annotationErr(key, "%q is not a port or a range of ports (such as 3306 or 5000-5010)", item)
		}
		if uint64(port) >= l && uint64(port) <= h {
			found = true
		}
	}
	return found, nil
}

// checkOpaquePortNames refuses an item of the Service's opaque-ports
// annotation that is neither a port, a range of ports nor the name of one
// of its ports (Linkerd's controller skips it with a warning; here the
// file is refused, naming the field).
func (s *Service) checkOpaquePortNames() error {
	v, ok := s.Annotations[AnnotationOpaquePorts]
	if !ok {
		return nil
	}
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" || slices.ContainsFunc(s.Ports, func(sp ServicePort) bool { return sp.Name == item }) {
			continue
		}
		if _, err := portsContain(AnnotationOpaquePorts, item, 0, nil); err != nil {
			return annotationErr(AnnotationOpaquePorts, "%q is not a port, a range of ports or the name of a port of the Service (such as 3306, 5000-5010 or mysql)", item)
		}
	}
	return nil
}

// appProtocol returns the appProtocol of port, "" when it has none.
func (s *Service) appProtocol(port uint16) string {
	for _, sp := range s.Ports {
		if sp.Port == port {
			return sp.AppProtocol
		}
	}
	return ""
}

// HasPort reports whether the Service serves port.
func (s *Service) HasPort(p uint16) bool {
	if len(s.Ports) == 0 {
		return true
	}
	for _, sp := range s.Ports {
		if sp.Port == p {
			return true
		}
	}
	return false
}

var serviceSpecFields = []string{"ports", "selector", "type", "clusterIP", "clusterIPs", "sessionAffinity",
	"sessionAffinityConfig", "ipFamilies", "ipFamilyPolicy", "internalTrafficPolicy", "externalTrafficPolicy",
	"publishNotReadyAddresses", "externalName", "externalIPs", "loadBalancerIP", "loadBalancerSourceRanges",
	"allocateLoadBalancerNodePorts", "healthCheckNodePort", "loadBalancerClass", "trafficDistribution"}

var servicePortFields = []string{"name", "port", "targetPort", "protocol", "appProtocol", "nodePort"}

func (s *Service) parseSpec(spec yamltree.Node) error {
	if !isDNSLabel(s.Name) {
		return yamltree.Node{Path: "metadata.name"}.Errorf("%q is not a DNS label (lower case letters, digits and '-')", s.Name)
	}
	obj, err := spec.Object(serviceSpecFields...)
	if err != nil {
		return err
	}
	if cn, ok := obj["clusterIP"]; ok && cn.Value != nil {
		v, err := cn.Str()
		if err != nil {
			return err
		}
		if v != "" && v != "None" {
			if s.ClusterIP, err = netip.ParseAddr(v); err != nil {
				return cn.Errorf("%q is not an IP address (or None)", v)
			}
		}
	}
	if sn, ok := obj["selector"]; ok && sn.Value != nil {
		if s.Selector, err = stringMap(sn); err != nil {
			return err
		}
	}
	pn, ok := obj["ports"]
	if !ok || pn.Value == nil {
		return nil
	}
	items, err := pn.List()
	if err != nil {
		return err
	}
	// Kubernetes' own Service validation: a port appears once for each
	// protocol, and when a Service has more than one port each is named,
	// under a name of its own. A manifest that Kubernetes would refuse is
	// refused here too, instead of answering for the first of two ports.
	type portKey struct {
		port     uint16
		protocol string
	}
	seen := make(map[portKey]int, len(items))
	names := make(map[string]int, len(items))
	for i, item := range items {
		po, err := item.Object(servicePortFields...)
		if err != nil {
			return err
		}
		var sp ServicePort
		if sp.Name, err = optionalString(po, "name"); err != nil {
			return err
		}
		n, ok := po["port"]
		if !ok {
			return yamltree.Node{Path: item.Child("port")}.Errorf("required")
		}
		if sp.Port, err = port(n); err != nil {
			return err
		}
		protocol, err := optionalString(po, "protocol")
		if err != nil {
			return err
		}
		switch protocol {
		case "":
			protocol = "TCP"
		case "TCP", "UDP", "SCTP":
		default:
			return yamltree.Node{Path: item.Child("protocol")}.Errorf("%q is not TCP, UDP or SCTP", protocol)
		}
		key := portKey{sp.Port, protocol}
		if first, dup := seen[key]; dup {
			return yamltree.Node{Path: item.Child("port")}.Errorf("%d/%s is also ports[%d]", sp.Port, protocol, first)
		}
		seen[key] = i
		if len(items) > 1 {
			if sp.Name == "" {
				return yamltree.Node{Path: item.Child("name")}.Errorf("required when a Service has more than one port")
			}
			if first, dup := names[sp.Name]; dup {
				return yamltree.Node{Path: item.Child("name")}.Errorf("%q is also the name of ports[%d]", sp.Name, first)
			}
			names[sp.Name] = i
		}
		if sp.AppProtocol, err = optionalString(po, "appProtocol"); err != nil {
			return err
		}
		s.Ports = append(s.Ports, sp)
	}
	return nil
}

// The annotations read from Services, HTTPRoutes and GRPCRoutes.
const (
	AnnotationRetryHTTP       = "retry.linkerd.io/http"
	AnnotationRetryGRPC       = "retry.linkerd.io/grpc"
	AnnotationRetryLimit      = "retry.linkerd.io/limit"
	AnnotationRetryTimeout    = "retry.linkerd.io/timeout"
	AnnotationTimeoutRequest  = "timeout.linkerd.io/request"
	AnnotationTimeoutResponse = "timeout.linkerd.io/response"
	AnnotationTimeoutIdle     = "timeout.linkerd.io/idle"
)

// checkAnnotations validates the retry and timeout annotations, so that a
// bad one fails its file.
func checkAnnotations(a map[string]string) error {
	if _, err := httpRetry(a); err != nil {
		return err
	}
	if _, err := grpcRetry(a); err != nil {
		return err
	}
	if _, err := timeouts(a); err != nil {
		return err
	}
	if _, err := loadBiaser(a); err != nil {
		return err
	}
	if _, err := opaquePort(a, nil, 0); err != nil {
		return err
	}
	if _, err := registrationIdentities(a); err != nil {
		return err
	}
	if _, err := hedgePolicy(a); err != nil {
		return err
	}
	if _, err := outlierDetection(a); err != nil {
		return err
	}
	_, err := failureAccrual(a)
	return err
}

func annotationErr(key, format string, args ...any) error {
	return fmt.Errorf("metadata.annotations.%s: %s", key, fmt.Sprintf(format, args...))
}

// retryCommon reads the limit and timeout annotations as Linkerd's policy
// controller reads them (policy-controller/k8s/index/src/outbound/index/
// http.rs parse_http_retry and grpc.rs parse_grpc_retry): a limit or a
// timeout of zero counts as unset, and nil when neither they nor the
// protocol's conditions (conditionsKey) are set, so that a route without
// a retry of its own keeps the Service's. A retry without a limit makes
// one retry.
func retryCommon(a map[string]string, conditionsKey string) (*policy.Retry, error) {
	_, hasCond := a[conditionsKey]
	b := policy.DefaultRetryBackoff()
	r := &policy.Retry{MaxRetries: policy.DefaultMaxRetries, MaxRequestBytes: policy.DefaultMaxRequestBytes, Backoff: &b}
	set := hasCond
	if limit, ok := a[AnnotationRetryLimit]; ok {
		n, err := strconv.ParseUint(strings.TrimSpace(limit), 10, 16)
		if err != nil {
			return nil, annotationErr(AnnotationRetryLimit, "%q is not a whole number from 0 to 65535", limit)
		}
		if n > 0 {
			r.MaxRetries, set = uint32(n), true
		}
	}
	if timeout, ok := a[AnnotationRetryTimeout]; ok {
		d, err := parseDuration(timeout)
		if err != nil {
			return nil, annotationErr(AnnotationRetryTimeout, "%v", err)
		}
		if d > 0 {
			r.Timeout, set = d, true
		}
	}
	if !set {
		return nil, nil
	}
	return r, nil
}

// httpRetry is the HTTP retry policy of the annotations: nil when none is
// set.
func httpRetry(a map[string]string) (*policy.Retry, error) {
	r, err := retryCommon(a, AnnotationRetryHTTP)
	if err != nil || r == nil {
		return nil, err
	}
	if v, ok := a[AnnotationRetryHTTP]; ok {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(strings.ToLower(f))
			switch {
			case f == "":
			case f == "5xx":
				r.StatusRanges = append(r.StatusRanges, policy.StatusRange{Start: 500, End: 599})
			case f == "gateway-error":
				r.StatusRanges = append(r.StatusRanges, policy.StatusRange{Start: 502, End: 504})
			default:
				lo, hi, isRange := strings.Cut(f, "-")
				if !isRange {
					hi = lo
				}
				s, err1 := strconv.ParseUint(lo, 10, 16)
				e, err2 := strconv.ParseUint(hi, 10, 16)
				if err1 != nil || err2 != nil || s < 100 || e > 599 || s > e {
					return nil, annotationErr(AnnotationRetryHTTP, "%q is not 5xx, gateway-error, a status code or a range like 500-504", f)
				}
				r.StatusRanges = append(r.StatusRanges, policy.StatusRange{Start: uint16(s), End: uint16(e)})
			}
		}
	}
	return r, nil
}

var grpcConditions = map[string]codes.Code{
	"cancelled":          codes.Canceled,
	"deadline-exceeded":  codes.DeadlineExceeded,
	"internal":           codes.Internal,
	"resource-exhausted": codes.ResourceExhausted,
	"unavailable":        codes.Unavailable,
}

// grpcRetry is the gRPC retry policy of the annotations.
func grpcRetry(a map[string]string) (*policy.Retry, error) {
	r, err := retryCommon(a, AnnotationRetryGRPC)
	if err != nil || r == nil {
		return nil, err
	}
	if v, ok := a[AnnotationRetryGRPC]; ok {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(strings.ToLower(f))
			if f == "" {
				continue
			}
			c, ok := grpcConditions[f]
			if !ok {
				return nil, annotationErr(AnnotationRetryGRPC, "%q is not one of cancelled, deadline-exceeded, internal, resource-exhausted, unavailable", f)
			}
			r.GRPCCodes = append(r.GRPCCodes, c)
		}
	}
	return r, nil
}

// timeouts reads the timeout annotations; nil when none is set.
func timeouts(a map[string]string) (*policy.Timeouts, error) {
	var t policy.Timeouts
	set := false
	for _, f := range []struct {
		key string
		dst *time.Duration
	}{{AnnotationTimeoutRequest, &t.Request}, {AnnotationTimeoutResponse, &t.Response}, {AnnotationTimeoutIdle, &t.Idle}} {
		v, ok := a[f.key]
		if !ok {
			continue
		}
		d, err := parseDuration(v)
		if err != nil {
			return nil, annotationErr(f.key, "%v", err)
		}
		*f.dst, set = d, true
	}
	if !set {
		return nil, nil
	}
	return &t, nil
}

// parseDuration reads a duration of an annotation as Linkerd's policy
// controller reads it (policy-controller/k8s/index/src/outbound/index.rs
// parse_duration): a whole number and one unit of ms, s, m, h or d ("0"
// alone is zero); fractions ("1.5s"), compound values ("1m30s") and
// negative ones are refused, so that a manifest means the same under
// Linkerd and here.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("%q is negative", s)
	}
	i := strings.LastIndexFunc(s, func(r rune) bool { return r >= '0' && r <= '9' })
	if i < 0 {
		return 0, fmt.Errorf("%q is not a duration (like 300ms, 10s, 5m, 2h or 1d)", s)
	}
	magnitude, unit := s[:i+1], s[i+1:]
	if strings.Contains(magnitude, ".") {
		return 0, fmt.Errorf("%q is not a whole number of a unit (fractions are not read, as by Linkerd)", s)
	}
	n, err := strconv.ParseUint(magnitude, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (like 300ms, 10s, 5m, 2h or 1d)", s)
	}
	var per time.Duration
	switch unit {
	case "":
		if n != 0 {
			return 0, fmt.Errorf("%q has no unit (did you mean %ds or %dms?)", s, n, n)
		}
	case "ms":
		per = time.Millisecond
	case "s":
		per = time.Second
	case "m":
		per = time.Minute
	case "h":
		per = time.Hour
	case "d":
		per = 24 * time.Hour
	default:
		return 0, fmt.Errorf("%q has the unit %q (want ms, s, m, h or d)", s, unit)
	}
	if per > 0 && n > uint64(math.MaxInt64/int64(per)) {
		return 0, fmt.Errorf("%q is too long", s)
	}
	return time.Duration(n) * per, nil
}

// gatewayDuration matches a Gateway API Duration (GEP-2257): one to four
// whole numbers of at most five digits, each with a unit of h, m, s or ms.
var gatewayDuration = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)

// parseGatewayDuration reads a Gateway API Duration, such as an HTTPRoute
// rule's timeouts (GEP-2257): "10s", "1h30m", "0s".
func parseGatewayDuration(s string) (time.Duration, error) {
	if !gatewayDuration.MatchString(s) {
		return 0, fmt.Errorf("%q is not a Gateway API duration (like 500ms, 10s or 1h30m)", s)
	}
	return time.ParseDuration(s)
}
