package destination

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/policy"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/httproutepb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// PolicyFromProto converts an OutboundPolicy from its wire form into the
// policy model and checks that it compiles. What Linkerd's proxy refuses is
// an error naming the field, by its proto name where the wire form is at
// fault, such as "protocol.http1.routes[0].rules[2].backends: missing
// distribution kind" (missing metadata, oneofs with no variant set,
// invalid durations, numbers out of range, an endpoint beyond the label
// bounds), and by the model's name where [policy.Compile] refuses it
// (regexes, header names, ratios). Opaque routes are kept (their first
// rule's backends, and whether its first filter forbids the route; other
// opaque filters are not); TLS routes are not converted: only the
// protocol is kept.
func PolicyFromProto(m *outboundpb.OutboundPolicy) (*policy.Policy, error) {
	return decodePolicy(m, "")
}

// decodePolicy is [PolicyFromProto] for the policy of authority ("" for
// none), whose strings it shares (see [shareStrings]).
func decodePolicy(m *outboundpb.OutboundPolicy, authority string) (*policy.Policy, error) {
	p, err := policyFromProto(m)
	if err != nil {
		return nil, err
	}
	shareStrings(p, authority)
	if _, err := policy.Compile(p, policy.Options{}); err != nil {
		return nil, err
	}
	return p, nil
}

// policyFromProto is [PolicyFromProto] without the compile check.
func policyFromProto(m *outboundpb.OutboundPolicy) (*policy.Policy, error) {
	if m == nil {
		return nil, errAt("policy", "null")
	}
	if m.GetMetadata() == nil {
		return nil, errAt("metadata", "required")
	}
	parent, err := metadataFromProto(m.GetMetadata(), "metadata")
	if err != nil {
		return nil, err
	}
	p := &policy.Policy{Parent: parent}
	if m.GetProtocol() == nil {
		return nil, errAt("protocol", "required")
	}
	switch k := m.GetProtocol().GetKind().(type) {
	case *outboundpb.ProxyProtocol_Detect_:
		d := k.Detect
		p.Protocol = policy.ProtocolDetect
		if d.GetTimeout() == nil {
			return nil, errAt("protocol.detect.timeout", "required")
		}
		if p.DetectTimeout, err = durationFromProto(d.GetTimeout(), "protocol.detect.timeout"); err != nil {
			return nil, err
		}
		if d.GetHttp1() == nil {
			return nil, errAt("protocol.detect.http1", "required")
		}
		if d.GetHttp2() == nil {
			return nil, errAt("protocol.detect.http2", "required")
		}
		if d.GetOpaque() == nil {
			return nil, errAt("protocol.detect.opaque", "required")
		}
		if p.HTTP1, err = httpProtocolFromProto(d.GetHttp1().GetRoutes(), d.GetHttp1().GetFailureAccrual(), "protocol.detect.http1"); err != nil {
			return nil, err
		}
		// A detected protocol usually carries the same routes for both
		// HTTP versions (Linkerd's default policies do): the policy then
		// shares one decoded copy, which it only reads.
		if proto.Equal(d.GetHttp1().GetFailureAccrual(), d.GetHttp2().GetFailureAccrual()) && sameHTTPRoutes(d.GetHttp1().GetRoutes(), d.GetHttp2().GetRoutes()) {
			p.HTTP2 = p.HTTP1
		} else if p.HTTP2, err = httpProtocolFromProto(d.GetHttp2().GetRoutes(), d.GetHttp2().GetFailureAccrual(), "protocol.detect.http2"); err != nil {
			return nil, err
		}
		if p.Opaque, err = opaqueProtocolFromProto(d.GetOpaque(), "protocol.detect.opaque"); err != nil {
			return nil, err
		}
	case *outboundpb.ProxyProtocol_Http1_:
		p.Protocol = policy.ProtocolHTTP1
		if p.HTTP1, err = httpProtocolFromProto(k.Http1.GetRoutes(), k.Http1.GetFailureAccrual(), "protocol.http1"); err != nil {
			return nil, err
		}
	case *outboundpb.ProxyProtocol_Http2_:
		p.Protocol = policy.ProtocolHTTP2
		if p.HTTP2, err = httpProtocolFromProto(k.Http2.GetRoutes(), k.Http2.GetFailureAccrual(), "protocol.http2"); err != nil {
			return nil, err
		}
	case *outboundpb.ProxyProtocol_Grpc_:
		p.Protocol = policy.ProtocolGRPC
		if p.GRPC, err = grpcProtocolFromProto(k.Grpc, "protocol.grpc"); err != nil {
			return nil, err
		}
	case *outboundpb.ProxyProtocol_Opaque_:
		p.Protocol = policy.ProtocolOpaque
		if p.Opaque, err = opaqueProtocolFromProto(k.Opaque, "protocol.opaque"); err != nil {
			return nil, err
		}
	case *outboundpb.ProxyProtocol_Tls_:
		p.Protocol = policy.ProtocolTLS
	default:
		return nil, errAt("protocol.kind", "no protocol set")
	}
	shareOpaqueBackends(p)
	return p, nil
}

// shareOpaqueBackends points the backends of each opaque route at an equal
// list of an HTTP rule's, when there is one: Linkerd's default policy for
// a Service sends its opaque and its HTTP traffic to the same backend, and
// a client holds a policy for each of thousands of names. The policy is
// only read once decoded, as the HTTP versions' shared routes are.
func shareOpaqueBackends(p *policy.Policy) {
	for i := range p.Opaque.Routes {
		ob := &p.Opaque.Routes[i].Backends
		if len(ob.Backends) == 0 {
			continue
		}
	rules:
		for _, hp := range []*policy.HTTPProtocol{&p.HTTP1, &p.HTTP2} {
			for _, r := range hp.Routes {
				for _, rule := range r.Rules {
					if rb := rule.Backends; rb.Kind == ob.Kind && reflect.DeepEqual(rb.Backends, ob.Backends) {
						ob.Backends = rb.Backends
						break rules
					}
				}
			}
		}
	}
}

func metadataFromProto(m *pb.Metadata, path string) (policy.Metadata, error) {
	switch k := m.GetKind().(type) {
	case *pb.Metadata_Default:
		return policy.DefaultMetadata(knownName(k.Default)), nil
	case *pb.Metadata_Resource:
		r := k.Resource
		for _, f := range []struct{ name, v string }{{"group", r.GetGroup()}, {"kind", r.GetKind()}, {"name", r.GetName()}, {"namespace", r.GetNamespace()}} {
			if f.v == "" {
				return policy.Metadata{}, errAt(path+".resource."+f.name, "must not be empty")
			}
		}
		md := policy.Metadata{Group: knownName(r.GetGroup()), Kind: knownName(r.GetKind()), Name: r.GetName(), Namespace: r.GetNamespace(), Section: r.GetSection()}
		if port := r.GetPort(); port <= math.MaxUint16 {
			md.Port = uint16(port) // as Linkerd: a port out of range is no port
		}
		return md, nil
	}
	return policy.Metadata{}, errAt(path+".kind", "no metadata set")
}

// sameHTTPRoutes reports whether a and b are equal lists of routes.
func sameHTTPRoutes(a, b []*outboundpb.HttpRoute) bool {
	return slices.EqualFunc(a, b, func(x, y *outboundpb.HttpRoute) bool { return proto.Equal(x, y) })
}

func httpProtocolFromProto(routes []*outboundpb.HttpRoute, fa *outboundpb.FailureAccrual, path string) (policy.HTTPProtocol, error) {
	var p policy.HTTPProtocol
	var err error
	if fa != nil {
		if p.FailureAccrual, err = failureAccrualFromProto(fa, path+".failure_accrual"); err != nil {
			return p, err
		}
	}
	p.Routes = make([]policy.HTTPRoute, len(routes))
	for i, r := range routes {
		rpath := fmt.Sprintf("%s.routes[%d]", path, i)
		if r.GetMetadata() == nil {
			return p, errAt(rpath+".metadata", "required")
		}
		out := &p.Routes[i]
		if out.Meta, err = metadataFromProto(r.GetMetadata(), rpath+".metadata"); err != nil {
			return p, err
		}
		if out.Hosts, err = hostsFromProto(r.GetHosts(), rpath+".hosts"); err != nil {
			return p, err
		}
		out.Rules = make([]policy.HTTPRule, len(r.GetRules()))
		for j, rule := range r.GetRules() {
			if out.Rules[j], err = httpRuleFromProto(rule, fmt.Sprintf("%s.rules[%d]", rpath, j)); err != nil {
				return p, err
			}
		}
	}
	return p, nil
}

func hostsFromProto(hs []*httproutepb.HostMatch, path string) ([]policy.HostMatch, error) {
	if len(hs) == 0 {
		return nil, nil
	}
	out := make([]policy.HostMatch, len(hs))
	for i, h := range hs {
		switch m := h.GetMatch().(type) {
		case *httproutepb.HostMatch_Exact:
			out[i] = policy.HostMatch{Exact: m.Exact}
		case *httproutepb.HostMatch_Suffix_:
			out[i] = policy.HostMatch{Suffix: true, ReverseLabels: append([]string(nil), m.Suffix.GetReverseLabels()...)}
		default:
			return nil, errAt(fmt.Sprintf("%s[%d].match", path, i), "no host match set")
		}
	}
	return out, nil
}

func httpRuleFromProto(r *outboundpb.HttpRoute_Rule, path string) (policy.HTTPRule, error) {
	var out policy.HTTPRule
	var err error
	if len(r.GetMatches()) > 0 {
		out.Matches = make([]policy.HTTPRouteMatch, len(r.GetMatches()))
	}
	for i, m := range r.GetMatches() {
		if out.Matches[i], err = httpMatchFromProto(m, fmt.Sprintf("%s.matches[%d]", path, i)); err != nil {
			return out, err
		}
	}
	out.Matches = shareMatches(out.Matches)
	if out.Filters, err = httpFiltersFromProto(r.GetFilters(), path+".filters"); err != nil {
		return out, err
	}
	if r.GetBackends() == nil {
		return out, errAt(path+".backends", "required")
	}
	if out.Backends, err = httpDistributionFromProto(r.GetBackends(), path+".backends"); err != nil {
		return out, err
	}
	if out.Timeouts, err = timeoutsFromProto(r.GetTimeouts(), path+".timeouts"); err != nil {
		return out, err
	}
	//lint:ignore SA1019 the deprecated field still carries a timeout from older controllers
	if legacy := r.GetRequestTimeout(); legacy != nil && out.Timeouts.Request == 0 {
		// As Linkerd's proxy: the legacy field fills in the request timeout.
		if out.Timeouts.Request, err = durationFromProto(legacy, path+".requestTimeout"); err != nil {
			return out, err
		}
	}
	if rt := r.GetRetry(); rt != nil {
		rpath := path + ".retry"
		if rt.GetConditions() == nil {
			return out, errAt(rpath+".conditions", "required")
		}
		retry, err := retryFromProto(rt.GetMaxRetries(), rt.GetMaxRequestBytes(), rt.GetTimeout(), rt.GetBackoff(), rpath)
		if err != nil {
			return out, err
		}
		if retry.MaxRetries > math.MaxUint16 {
			return out, errAt(rpath+".max_retries", "%d is out of range", retry.MaxRetries)
		}
		for i, s := range rt.GetConditions().GetStatusRanges() {
			if s.GetStart() > math.MaxUint16 || s.GetEnd() > math.MaxUint16 {
				return out, errAt(fmt.Sprintf("%s.conditions.status_ranges[%d]", rpath, i), "%d-%d is out of range", s.GetStart(), s.GetEnd())
			}
			retry.StatusRanges = append(retry.StatusRanges, policy.StatusRange{Start: uint16(s.GetStart()), End: uint16(s.GetEnd())})
		}
		out.Retry = retry
	}
	out.AllowL5dRequestHeaders = r.GetAllowL5DRequestHeaders()
	if out.Hedge, err = hedgeFromProto(r.GetHedge(), path+".hedge"); err != nil {
		return out, err
	}
	if out.Mirrors, err = mirrorsFromProto(r.GetInmeshRequestMirrors(), path+".inmesh_request_mirrors"); err != nil {
		return out, err
	}
	return out, nil
}

func httpMatchFromProto(m *httproutepb.HttpRouteMatch, path string) (policy.HTTPRouteMatch, error) {
	var out policy.HTTPRouteMatch
	if pm := m.GetPath(); pm != nil {
		switch k := pm.GetKind().(type) {
		case *httproutepb.PathMatch_Exact:
			out.Path = &policy.PathMatch{Kind: policy.PathExact, Value: k.Exact}
		case *httproutepb.PathMatch_Prefix:
			out.Path = &policy.PathMatch{Kind: policy.PathPrefix, Value: k.Prefix}
		case *httproutepb.PathMatch_Regex:
			out.Path = &policy.PathMatch{Kind: policy.PathRegex, Value: k.Regex}
		default:
			return out, errAt(path+".path.kind", "no path match set")
		}
	}
	var err error
	if out.Headers, err = headerMatchesFromProto(m.GetHeaders(), path+".headers"); err != nil {
		return out, err
	}
	for i, q := range m.GetQueryParams() {
		qm := policy.QueryParamMatch{Name: q.GetName()}
		switch v := q.GetValue().(type) {
		case *httproutepb.QueryParamMatch_Exact:
			qm.Value = v.Exact
		case *httproutepb.QueryParamMatch_Regex:
			qm.Value, qm.Regex = v.Regex, true
		default:
			return out, errAt(fmt.Sprintf("%s.query_params[%d].value", path, i), "no value match set")
		}
		out.QueryParams = append(out.QueryParams, qm)
	}
	if m.GetMethod() != nil {
		if out.Method, err = routeMethodFromProto(m.GetMethod(), path+".method"); err != nil {
			return out, err
		}
	}
	return out, nil
}

func headerMatchesFromProto(hs []*httproutepb.HeaderMatch, path string) ([]policy.HeaderMatch, error) {
	var out []policy.HeaderMatch
	for i, h := range hs {
		hm := policy.HeaderMatch{Name: h.GetName()}
		switch v := h.GetValue().(type) {
		case *httproutepb.HeaderMatch_Exact:
			hm.Value = string(v.Exact)
		case *httproutepb.HeaderMatch_Regex:
			hm.Value, hm.Regex = v.Regex, true
		default:
			return nil, errAt(fmt.Sprintf("%s[%d].value", path, i), "no value match set")
		}
		out = append(out, hm)
	}
	return out, nil
}

// routeMethodFromProto decodes a route match's method as [MethodFromProto]
// does, naming the oneof variant at fault in errors (path.registered,
// path.unregistered, path.type). GET is the enum's zero value, told apart
// from "unset" only by the oneof.
func routeMethodFromProto(m *pb.HttpMethod, path string) (string, error) {
	switch v := m.GetType().(type) {
	case *pb.HttpMethod_Registered_:
		name, ok := pb.HttpMethod_Registered_name[int32(v.Registered)]
		if !ok {
			return "", errAt(path+".registered", "unknown registered method %d", v.Registered)
		}
		return name, nil
	case *pb.HttpMethod_Unregistered:
		if v.Unregistered == "" {
			return "", errAt(path+".unregistered", "empty method")
		}
		return v.Unregistered, nil
	}
	return "", errAt(path+".type", "no method set")
}

func httpFiltersFromProto(fs []*outboundpb.HttpRoute_Filter, path string) ([]policy.Filter, error) {
	var out []policy.Filter
	for i, f := range fs {
		fpath := fmt.Sprintf("%s[%d]", path, i)
		var filter policy.Filter
		switch k := f.GetKind().(type) {
		case *outboundpb.HttpRoute_Filter_FailureInjector:
			fi := k.FailureInjector
			if fi.GetStatus() > math.MaxUint16 {
				return nil, errAt(fpath+".failure_injector.status", "%d is not an HTTP status code", fi.GetStatus())
			}
			ratio, err := ratioFromProto(fi.GetRatio(), fpath+".failure_injector.ratio")
			if err != nil {
				return nil, err
			}
			filter.FailureInjector = &policy.FailureInjector{Status: int(fi.GetStatus()), Message: fi.GetMessage(), Ratio: ratio}
		case *outboundpb.HttpRoute_Filter_RequestHeaderModifier:
			filter.RequestHeaders = modifierFromProto(k.RequestHeaderModifier.GetAdd(), k.RequestHeaderModifier.GetSet(), k.RequestHeaderModifier.GetRemove())
		case *outboundpb.HttpRoute_Filter_ResponseHeaderModifier:
			filter.ResponseHeaders = modifierFromProto(k.ResponseHeaderModifier.GetAdd(), k.ResponseHeaderModifier.GetSet(), k.ResponseHeaderModifier.GetRemove())
		case *outboundpb.HttpRoute_Filter_Redirect:
			rd, err := redirectFromProto(k.Redirect, fpath+".redirect")
			if err != nil {
				return nil, err
			}
			filter.Redirect = rd
		default:
			return nil, errAt(fpath+".kind", "no filter set")
		}
		out = append(out, filter)
	}
	return out, nil
}

func modifierFromProto(add, set *pb.Headers, remove []string) *policy.HeaderModifier {
	m := &policy.HeaderModifier{}
	for _, h := range add.GetHeaders() {
		m.Add = append(m.Add, policy.Header{Name: h.GetName(), Value: string(h.GetValue())})
	}
	for _, h := range set.GetHeaders() {
		m.Set = append(m.Set, policy.Header{Name: h.GetName(), Value: string(h.GetValue())})
	}
	if len(remove) > 0 {
		m.Remove = append([]string(nil), remove...)
	}
	return m
}

func redirectFromProto(r *httproutepb.RequestRedirect, path string) (*policy.Redirect, error) {
	out := &policy.Redirect{Host: r.GetHost()}
	if s := r.GetScheme(); s != nil {
		switch v := s.GetType().(type) {
		case *pb.Scheme_Registered_:
			switch v.Registered {
			case pb.Scheme_HTTP:
				out.Scheme = "http"
			case pb.Scheme_HTTPS:
				out.Scheme = "https"
			default:
				return nil, errAt(path+".scheme.registered", "unknown registered scheme %d", v.Registered)
			}
		case *pb.Scheme_Unregistered:
			out.Scheme = v.Unregistered
		default:
			return nil, errAt(path+".scheme.type", "no scheme set")
		}
	}
	if r.GetPort() > math.MaxUint16 {
		return nil, errAt(path+".port", "%d is out of range", r.GetPort())
	}
	out.Port = uint16(r.GetPort())
	if r.GetStatus() > math.MaxUint16 {
		return nil, errAt(path+".status", "%d is not an HTTP status code", r.GetStatus())
	}
	out.Status = int(r.GetStatus())
	if pm := r.GetPath(); pm != nil {
		switch v := pm.GetReplace().(type) {
		case *httproutepb.PathModifier_Full:
			out.Path = &policy.PathModifier{Full: v.Full}
		case *httproutepb.PathModifier_Prefix:
			out.Path = &policy.PathModifier{Full: v.Prefix, Prefix: true}
		}
		// As Linkerd's proxy, a path modifier with nothing set keeps the path.
	}
	return out, nil
}

func ratioFromProto(r *httproutepb.Ratio, path string) (policy.Ratio, error) {
	if r == nil {
		return policy.Ratio{}, nil // every request
	}
	if r.GetDenominator() == 0 {
		return policy.Ratio{}, errAt(path+".denominator", "must be positive")
	}
	if r.GetNumerator() > r.GetDenominator() {
		return policy.Ratio{}, errAt(path, "%d/%d is more than 1", r.GetNumerator(), r.GetDenominator())
	}
	return policy.Ratio{Numerator: r.GetNumerator(), Denominator: r.GetDenominator()}, nil
}

func timeoutsFromProto(t *httproutepb.Timeouts, path string) (policy.Timeouts, error) {
	var out policy.Timeouts
	var err error
	for _, f := range []struct {
		name string
		d    *durationpb.Duration
		dst  *time.Duration
	}{{"response", t.GetResponse(), &out.Response}, {"request", t.GetRequest(), &out.Request}, {"idle", t.GetIdle(), &out.Idle}} {
		if f.d == nil {
			continue
		}
		if *f.dst, err = durationFromProto(f.d, path+"."+f.name); err != nil {
			return out, err
		}
	}
	return out, nil
}

func retryFromProto(maxRetries, maxBytes uint32, timeout *durationpb.Duration, b *outboundpb.ExponentialBackoff, path string) (*policy.Retry, error) {
	r := &policy.Retry{MaxRetries: maxRetries, MaxRequestBytes: maxBytes}
	var err error
	if timeout != nil {
		if r.Timeout, err = durationFromProto(timeout, path+".timeout"); err != nil {
			return nil, err
		}
	}
	if b != nil {
		bp, err := backoffFromProto(b, path+".backoff")
		if err != nil {
			return nil, err
		}
		r.Backoff = &bp
	}
	return r, nil
}

func backoffFromProto(b *outboundpb.ExponentialBackoff, path string) (backoff.Policy, error) {
	if b.GetMinBackoff() == nil {
		return backoff.Policy{}, errAt(path+".min_backoff", "required")
	}
	if b.GetMaxBackoff() == nil {
		return backoff.Policy{}, errAt(path+".max_backoff", "required")
	}
	lo, err := durationFromProto(b.GetMinBackoff(), path+".min_backoff")
	if err != nil {
		return backoff.Policy{}, err
	}
	hi, err := durationFromProto(b.GetMaxBackoff(), path+".max_backoff")
	if err != nil {
		return backoff.Policy{}, err
	}
	p := backoff.Policy{Min: lo, Max: hi, Jitter: float64(b.GetJitterRatio())}
	if hi == 0 {
		return p, errAt(path+".max_backoff", "must be positive")
	}
	if err := p.Validate(); err != nil {
		return p, errAt(path, "%v", err)
	}
	return p, nil
}

// noOpaqueFilters drops an opaque route backend's filters: the model of an
// opaque route has none.
func noOpaqueFilters([]*outboundpb.OpaqueRoute_Filter, string) ([]policy.Filter, error) {
	return nil, nil
}

func opaqueProtocolFromProto(o *outboundpb.ProxyProtocol_Opaque, path string) (policy.OpaqueProtocol, error) {
	var out policy.OpaqueProtocol
	for i, r := range o.GetRoutes() {
		rpath := fmt.Sprintf("%s.routes[%d]", path, i)
		if r.GetMetadata() == nil {
			return out, errAt(rpath+".metadata", "required")
		}
		meta, err := metadataFromProto(r.GetMetadata(), rpath+".metadata")
		if err != nil {
			return out, err
		}
		route := policy.OpaqueRoute{Meta: meta}
		if rules := r.GetRules(); len(rules) > 0 {
			dpath := rpath + ".rules[0].backends"
			switch k := rules[0].GetBackends().GetKind().(type) {
			case *outboundpb.OpaqueRoute_Distribution_Empty_:
			case *outboundpb.OpaqueRoute_Distribution_FirstAvailable_:
				route.Backends, err = firstAvailableFromProto(k.FirstAvailable.GetBackends(), noOpaqueFilters, dpath, true)
			case *outboundpb.OpaqueRoute_Distribution_RandomAvailable_:
				route.Backends, err = randomAvailableFromProto(k.RandomAvailable.GetBackends(), noOpaqueFilters, dpath, true)
			default:
				return out, errAt(dpath+".kind", "missing distribution kind")
			}
			if err != nil {
				return out, err
			}
			// Linkerd's proxy applies the rule's first filter alone
			// (linkerd/app/outbound/src/opaq/logical/route/filters.rs).
			if fs := rules[0].GetFilters(); len(fs) > 0 && fs[0].GetForbidden() != nil {
				route.Forbidden = true
			}
		}
		out.Routes = append(out.Routes, route)
	}
	return out, nil
}

func httpDistributionFromProto(d *outboundpb.HttpRoute_Distribution, path string) (policy.Distribution, error) {
	switch k := d.GetKind().(type) {
	case *outboundpb.HttpRoute_Distribution_Empty_:
		return policy.Distribution{}, nil
	case *outboundpb.HttpRoute_Distribution_FirstAvailable_:
		return firstAvailableFromProto(k.FirstAvailable.GetBackends(), httpFiltersFromProto, path, false)
	case *outboundpb.HttpRoute_Distribution_RandomAvailable_:
		return randomAvailableFromProto(k.RandomAvailable.GetBackends(), httpFiltersFromProto, path, false)
	}
	return policy.Distribution{}, errAt(path+".kind", "missing distribution kind")
}

// routeBackendProto is a route backend of any route kind's distribution:
// the backend and the filters of that kind.
type routeBackendProto[F any] interface {
	comparable
	GetBackend() *outboundpb.Backend
	GetFilters() []F
}

// weightedBackendProto is a route backend of a random_available
// distribution, with its weight.
type weightedBackendProto[RB any] interface {
	GetBackend() RB
	GetWeight() uint32
}

// firstAvailableFromProto decodes the backends of a first_available
// distribution of any route kind; filters decodes that kind's filters.
// With mayBeEmpty unset, no backend at all is an error.
func firstAvailableFromProto[F any, RB routeBackendProto[F]](rbs []RB, filters func([]F, string) ([]policy.Filter, error), path string, mayBeEmpty bool) (policy.Distribution, error) {
	out := policy.Distribution{Kind: policy.DistributionFirstAvailable}
	for i, rb := range rbs {
		b, err := routeBackendWithFilters(rb, filters, fmt.Sprintf("%s.first_available.backends[%d]", path, i))
		if err != nil {
			return out, err
		}
		out.Backends = append(out.Backends, b)
	}
	if len(out.Backends) == 0 && !mayBeEmpty {
		return out, errAt(path+".first_available.backends", "a first_available distribution may not be empty")
	}
	return out, nil
}

// randomAvailableFromProto decodes the weighted backends of a
// random_available distribution of any route kind.
func randomAvailableFromProto[F any, RB routeBackendProto[F], WB weightedBackendProto[RB]](wbs []WB, filters func([]F, string) ([]policy.Filter, error), path string, mayBeEmpty bool) (policy.Distribution, error) {
	out := policy.Distribution{Kind: policy.DistributionRandomAvailable}
	for i, wb := range wbs {
		bpath := fmt.Sprintf("%s.random_available.backends[%d].backend", path, i)
		var none RB
		if wb.GetBackend() == none {
			return out, errAt(bpath, "required")
		}
		b, err := routeBackendWithFilters(wb.GetBackend(), filters, bpath)
		if err != nil {
			return out, err
		}
		b.Weight = wb.GetWeight()
		out.Backends = append(out.Backends, b)
	}
	if len(out.Backends) == 0 && !mayBeEmpty {
		return out, errAt(path+".random_available.backends", "a random_available distribution may not be empty")
	}
	return out, nil
}

func routeBackendWithFilters[F any, RB routeBackendProto[F]](rb RB, filters func([]F, string) ([]policy.Filter, error), path string) (policy.RouteBackend, error) {
	b, err := routeBackendFromProto(rb.GetBackend(), path)
	if err != nil {
		return b, err
	}
	b.Filters, err = filters(rb.GetFilters(), path+".filters")
	return b, err
}

func routeBackendFromProto(b *outboundpb.Backend, path string) (policy.RouteBackend, error) {
	if b == nil {
		return policy.RouteBackend{}, errAt(path+".backend", "required")
	}
	bb, err := backendFromProto(b, path+".backend")
	return policy.RouteBackend{Backend: bb}, err
}

func backendFromProto(b *outboundpb.Backend, path string) (policy.Backend, error) {
	var out policy.Backend
	var err error
	if b.GetMetadata() == nil {
		return out, errAt(path+".metadata", "required")
	}
	if out.Meta, err = metadataFromProto(b.GetMetadata(), path+".metadata"); err != nil {
		return out, err
	}
	switch k := b.GetKind().(type) {
	case *outboundpb.Backend_Balancer:
		bl := k.Balancer
		dst, ok := bl.GetDiscovery().GetKind().(*outboundpb.Backend_EndpointDiscovery_Dst)
		if !ok {
			return out, errAt(path+".balancer.discovery", "missing endpoint discovery")
		}
		out.Balancer = &policy.Balancer{Authority: dst.Dst.GetPath()}
		switch load := bl.GetLoad().(type) {
		case *outboundpb.Backend_BalanceP2C_PeakEwma_:
			lpath := path + ".balancer.peak_ewma"
			if out.Balancer.DefaultRTT, err = requiredDuration(load.PeakEwma.GetDefaultRtt(), lpath+".default_rtt"); err != nil {
				return out, err
			}
			if out.Balancer.Decay, err = requiredDuration(load.PeakEwma.GetDecay(), lpath+".decay"); err != nil {
				return out, err
			}
		case *outboundpb.Backend_BalanceP2C_PenaltyPeakEwma_:
			// As Linkerd's proxy, absent fields take the documented defaults.
			lpath := path + ".balancer.penalty_peak_ewma"
			pe := load.PenaltyPeakEwma
			pen := &policy.LoadPenalty{}
			for _, f := range []struct {
				name string
				d    *durationpb.Duration
				def  time.Duration
				dst  *time.Duration
			}{
				{"default_rtt", pe.GetDefaultRtt(), 30 * time.Millisecond, &out.Balancer.DefaultRTT},
				{"decay", pe.GetDecay(), 10 * time.Second, &out.Balancer.Decay},
				{"penalty", pe.GetPenalty(), 5 * time.Second, &pen.Penalty},
				{"max_retry_after", pe.GetMaxRetryAfter(), 300 * time.Second, &pen.MaxRetryAfter},
				{"penalty_decay", pe.GetPenaltyDecay(), 10 * time.Second, &pen.PenaltyDecay},
			} {
				*f.dst = f.def
				if f.d != nil {
					if *f.dst, err = durationFromProto(f.d, lpath+"."+f.name); err != nil {
						return out, err
					}
				}
			}
			out.Balancer.Penalty = pen
		default:
			return out, errAt(path+".balancer.load", "missing balancer load")
		}
		if out.Balancer.Outlier, err = outlierFromProto(bl.GetOutlierDetection(), path+".balancer.outlier_detection"); err != nil {
			return out, err
		}
	case *outboundpb.Backend_Forward:
		ep, err := EndpointFromProto(k.Forward, nil, path+".forward")
		if err != nil {
			return out, err
		}
		out.Forward = &ep
	case nil:
		// No dispatcher: the backend fails its requests.
	}
	q := b.GetQueue()
	if q == nil {
		return out, errAt(path+".queue", "required")
	}
	out.Queue.Capacity = q.GetCapacity()
	if out.Queue.FailFastTimeout, err = requiredDuration(q.GetFailfastTimeout(), path+".queue.failfast_timeout"); err != nil {
		return out, err
	}
	return out, nil
}

func grpcProtocolFromProto(g *outboundpb.ProxyProtocol_Grpc, path string) (policy.GRPCProtocol, error) {
	var p policy.GRPCProtocol
	var err error
	if fa := g.GetFailureAccrual(); fa != nil {
		if p.FailureAccrual, err = failureAccrualFromProto(fa, path+".failure_accrual"); err != nil {
			return p, err
		}
	}
	p.Routes = make([]policy.GRPCRoute, len(g.GetRoutes()))
	for i, r := range g.GetRoutes() {
		rpath := fmt.Sprintf("%s.routes[%d]", path, i)
		if r.GetMetadata() == nil {
			return p, errAt(rpath+".metadata", "required")
		}
		out := &p.Routes[i]
		if out.Meta, err = metadataFromProto(r.GetMetadata(), rpath+".metadata"); err != nil {
			return p, err
		}
		if out.Hosts, err = hostsFromProto(r.GetHosts(), rpath+".hosts"); err != nil {
			return p, err
		}
		out.Rules = make([]policy.GRPCRule, len(r.GetRules()))
		for j, rule := range r.GetRules() {
			if out.Rules[j], err = grpcRuleFromProto(rule, fmt.Sprintf("%s.rules[%d]", rpath, j)); err != nil {
				return p, err
			}
		}
	}
	return p, nil
}

func grpcRuleFromProto(r *outboundpb.GrpcRoute_Rule, path string) (policy.GRPCRule, error) {
	var out policy.GRPCRule
	var err error
	for i, m := range r.GetMatches() {
		mpath := fmt.Sprintf("%s.matches[%d]", path, i)
		if m.GetRpc() == nil {
			return out, errAt(mpath+".rpc", "required")
		}
		gm := policy.GRPCRouteMatch{Service: m.GetRpc().GetService(), Method: m.GetRpc().GetMethod()}
		if gm.Headers, err = headerMatchesFromProto(m.GetHeaders(), mpath+".headers"); err != nil {
			return out, err
		}
		out.Matches = append(out.Matches, gm)
	}
	if out.Filters, err = grpcFiltersFromProto(r.GetFilters(), path+".filters"); err != nil {
		return out, err
	}
	if r.GetBackends() == nil {
		return out, errAt(path+".backends", "required")
	}
	if out.Backends, err = grpcDistributionFromProto(r.GetBackends(), path+".backends"); err != nil {
		return out, err
	}
	if out.Timeouts, err = timeoutsFromProto(r.GetTimeouts(), path+".timeouts"); err != nil {
		return out, err
	}
	//lint:ignore SA1019 the deprecated field still carries a timeout from older controllers
	if legacy := r.GetRequestTimeout(); legacy != nil && out.Timeouts.Request == 0 {
		if out.Timeouts.Request, err = durationFromProto(legacy, path+".requestTimeout"); err != nil {
			return out, err
		}
	}
	if rt := r.GetRetry(); rt != nil {
		rpath := path + ".retry"
		c := rt.GetConditions()
		if c == nil {
			return out, errAt(rpath+".conditions", "required")
		}
		retry, err := retryFromProto(rt.GetMaxRetries(), rt.GetMaxRequestBytes(), rt.GetTimeout(), rt.GetBackoff(), rpath)
		if err != nil {
			return out, err
		}
		for _, cc := range []struct {
			on   bool
			code codes.Code
		}{
			{c.GetCancelled(), codes.Canceled}, {c.GetDeadineExceeded(), codes.DeadlineExceeded},
			{c.GetResourceExhausted(), codes.ResourceExhausted}, {c.GetInternal(), codes.Internal},
			{c.GetUnavailable(), codes.Unavailable},
		} {
			if cc.on {
				retry.GRPCCodes = append(retry.GRPCCodes, cc.code)
			}
		}
		out.Retry = retry
	}
	out.AllowL5dRequestHeaders = r.GetAllowL5DRequestHeaders()
	if out.Hedge, err = hedgeFromProto(r.GetHedge(), path+".hedge"); err != nil {
		return out, err
	}
	if out.Mirrors, err = mirrorsFromProto(r.GetInmeshRequestMirrors(), path+".inmesh_request_mirrors"); err != nil {
		return out, err
	}
	return out, nil
}

func grpcFiltersFromProto(fs []*outboundpb.GrpcRoute_Filter, path string) ([]policy.Filter, error) {
	var out []policy.Filter
	for i, f := range fs {
		fpath := fmt.Sprintf("%s[%d]", path, i)
		switch k := f.GetKind().(type) {
		case *outboundpb.GrpcRoute_Filter_FailureInjector:
			fi := k.FailureInjector
			if fi.GetCode() > math.MaxUint16 {
				return nil, errAt(fpath+".failure_injector.code", "%d is out of range", fi.GetCode())
			}
			ratio, err := ratioFromProto(fi.GetRatio(), fpath+".failure_injector.ratio")
			if err != nil {
				return nil, err
			}
			out = append(out, policy.Filter{GRPCFailureInjector: &policy.GRPCFailureInjector{Code: codes.Code(fi.GetCode()), Message: fi.GetMessage(), Ratio: ratio}})
		case *outboundpb.GrpcRoute_Filter_RequestHeaderModifier:
			m := k.RequestHeaderModifier
			out = append(out, policy.Filter{RequestHeaders: modifierFromProto(m.GetAdd(), m.GetSet(), m.GetRemove())})
		default:
			return nil, errAt(fpath+".kind", "no filter set")
		}
	}
	return out, nil
}

func grpcDistributionFromProto(d *outboundpb.GrpcRoute_Distribution, path string) (policy.Distribution, error) {
	switch k := d.GetKind().(type) {
	case *outboundpb.GrpcRoute_Distribution_Empty_:
		return policy.Distribution{}, nil
	case *outboundpb.GrpcRoute_Distribution_FirstAvailable_:
		return firstAvailableFromProto(k.FirstAvailable.GetBackends(), grpcFiltersFromProto, path, false)
	case *outboundpb.GrpcRoute_Distribution_RandomAvailable_:
		return randomAvailableFromProto(k.RandomAvailable.GetBackends(), grpcFiltersFromProto, path, false)
	}
	return policy.Distribution{}, errAt(path+".kind", "missing distribution kind")
}

func failureAccrualFromProto(fa *outboundpb.FailureAccrual, path string) (*policy.FailureAccrual, error) {
	out := &policy.FailureAccrual{MinReadyEndpoints: fa.GetEjection().GetMinReadyEndpoints()}
	switch k := fa.GetKind().(type) {
	case *outboundpb.FailureAccrual_ConsecutiveFailures_:
		c := k.ConsecutiveFailures
		if c.GetBackoff() == nil {
			return nil, errAt(path+".consecutive_failures.backoff", "required")
		}
		b, err := backoffFromProto(c.GetBackoff(), path+".consecutive_failures.backoff")
		if err != nil {
			return nil, err
		}
		out.Consecutive = &policy.ConsecutiveFailures{MaxFailures: c.GetMaxFailures(), Backoff: b}
	case *outboundpb.FailureAccrual_Unified_:
		u := k.Unified
		upath := path + ".unified"
		if u.GetBackoff() == nil {
			return nil, errAt(upath+".backoff", "required")
		}
		b, err := backoffFromProto(u.GetBackoff(), upath+".backoff")
		if err != nil {
			return nil, err
		}
		ua := &policy.UnifiedAccrual{
			SuccessRateThreshold: u.GetSuccessRateThreshold(), Window: 10 * time.Second,
			MinRequests: u.GetMinRequests(), MaxConsecutiveFailures: u.GetMaxConsecutiveFailures(), Backoff: b,
		}
		if u.GetDecay() != nil {
			if ua.Window, err = durationFromProto(u.GetDecay(), upath+".decay"); err != nil {
				return nil, err
			}
		}
		out.Unified = ua
	default:
		return nil, errAt(path+".kind", "no failure accrual set")
	}
	if err := policy.CheckFailureAccrual(out, path); err != nil {
		return nil, err
	}
	return out, nil
}

func requiredDuration(d *durationpb.Duration, path string) (time.Duration, error) {
	if d == nil {
		return 0, errAt(path, "required")
	}
	return durationFromProto(d, path)
}
