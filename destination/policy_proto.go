package destination

import (
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/policy"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/grpcroutepb"
	"github.com/inmesh/inmesh/proxyapi/httproutepb"
	"github.com/inmesh/inmesh/proxyapi/opaqueroutepb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// PolicyToProto encodes an outbound policy for the wire, the inverse of
// [PolicyFromProto] for HTTP and gRPC policies (opaque and TLS policies
// are sent without routes; filters a protocol does not carry are left
// out, as [policy.Compile] rejects them). Forward backends are encoded with
// [EndpointToProto].
func PolicyToProto(p *policy.Policy) *outboundpb.OutboundPolicy {
	m := &outboundpb.OutboundPolicy{Metadata: metaToProto(p.Parent), Protocol: &outboundpb.ProxyProtocol{}}
	switch p.Protocol {
	case policy.ProtocolDetect:
		m.Protocol.Kind = &outboundpb.ProxyProtocol_Detect_{Detect: &outboundpb.ProxyProtocol_Detect{
			Timeout: durationpb.New(p.DetectTimeout),
			Http1:   &outboundpb.ProxyProtocol_Http1{Routes: httpRoutesToProto(p.HTTP1.Routes), FailureAccrual: accrualToProto(p.HTTP1.FailureAccrual)},
			Http2:   &outboundpb.ProxyProtocol_Http2{Routes: httpRoutesToProto(p.HTTP2.Routes), FailureAccrual: accrualToProto(p.HTTP2.FailureAccrual)},
			Opaque:  &outboundpb.ProxyProtocol_Opaque{Routes: opaqueRoutesToProto(p.Opaque.Routes)},
		}}
	case policy.ProtocolHTTP1:
		m.Protocol.Kind = &outboundpb.ProxyProtocol_Http1_{Http1: &outboundpb.ProxyProtocol_Http1{Routes: httpRoutesToProto(p.HTTP1.Routes),
			FailureAccrual: accrualToProto(p.HTTP1.FailureAccrual)}}
	case policy.ProtocolHTTP2:
		m.Protocol.Kind = &outboundpb.ProxyProtocol_Http2_{Http2: &outboundpb.ProxyProtocol_Http2{Routes: httpRoutesToProto(p.HTTP2.Routes),
			FailureAccrual: accrualToProto(p.HTTP2.FailureAccrual)}}
	case policy.ProtocolGRPC:
		m.Protocol.Kind = &outboundpb.ProxyProtocol_Grpc_{Grpc: &outboundpb.ProxyProtocol_Grpc{Routes: grpcRoutesToProto(p.GRPC.Routes),
			FailureAccrual: accrualToProto(p.GRPC.FailureAccrual)}}
	case policy.ProtocolOpaque:
		m.Protocol.Kind = &outboundpb.ProxyProtocol_Opaque_{Opaque: &outboundpb.ProxyProtocol_Opaque{Routes: opaqueRoutesToProto(p.Opaque.Routes)}}
	case policy.ProtocolTLS:
		m.Protocol.Kind = &outboundpb.ProxyProtocol_Tls_{Tls: &outboundpb.ProxyProtocol_Tls{}}
	}
	return m
}

// accrualToProto encodes a failure accrual; nil stays nil (no breaker).
func accrualToProto(fa *policy.FailureAccrual) *outboundpb.FailureAccrual {
	if fa == nil {
		return nil
	}
	bo := func(b backoff.Policy) *outboundpb.ExponentialBackoff {
		return &outboundpb.ExponentialBackoff{MinBackoff: durationpb.New(b.Min), MaxBackoff: durationpb.New(b.Max), JitterRatio: float32(b.Jitter)}
	}
	out := &outboundpb.FailureAccrual{}
	if fa.MinReadyEndpoints > 0 {
		out.Ejection = &outboundpb.EjectionConfig{MinReadyEndpoints: fa.MinReadyEndpoints}
	}
	switch {
	case fa.Unified != nil:
		u := fa.Unified
		out.Kind = &outboundpb.FailureAccrual_Unified_{Unified: &outboundpb.FailureAccrual_Unified{
			SuccessRateThreshold: u.SuccessRateThreshold, Decay: durationpb.New(u.Window), MinRequests: u.MinRequests,
			MaxConsecutiveFailures: u.MaxConsecutiveFailures, Backoff: bo(u.Backoff)}}
	case fa.Consecutive != nil:
		c := fa.Consecutive
		out.Kind = &outboundpb.FailureAccrual_ConsecutiveFailures_{ConsecutiveFailures: &outboundpb.FailureAccrual_ConsecutiveFailures{
			MaxFailures: c.MaxFailures, Backoff: bo(c.Backoff)}}
	default:
		return nil
	}
	return out
}

func metaToProto(md policy.Metadata) *pb.Metadata {
	if md.IsDefault() {
		return &pb.Metadata{Kind: &pb.Metadata_Default{Default: md.Name}}
	}
	return &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{
		Group: md.Group, Kind: md.Kind, Name: md.Name, Namespace: md.Namespace, Section: md.Section, Port: uint32(md.Port),
	}}}
}

func hostsToProto(hs []policy.HostMatch) []*httproutepb.HostMatch {
	var out []*httproutepb.HostMatch
	for _, h := range hs {
		if h.Suffix {
			out = append(out, &httproutepb.HostMatch{Match: &httproutepb.HostMatch_Suffix_{Suffix: &httproutepb.HostMatch_Suffix{ReverseLabels: h.ReverseLabels}}})
		} else {
			out = append(out, &httproutepb.HostMatch{Match: &httproutepb.HostMatch_Exact{Exact: h.Exact}})
		}
	}
	return out
}

func durationOrNil(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// timeoutsToProto encodes a rule's timeouts. Every rule carries them, an
// empty message when none is set, as Linkerd's policy controller sends
// them (policy-controller/grpc/src/outbound/http.rs and grpc.rs).
func timeoutsToProto(t policy.Timeouts) *httproutepb.Timeouts {
	return &httproutepb.Timeouts{Request: durationOrNil(t.Request), Response: durationOrNil(t.Response), Idle: durationOrNil(t.Idle)}
}

func backoffToProto(r *policy.Retry) *outboundpb.ExponentialBackoff {
	b := r.BackoffPolicy()
	return &outboundpb.ExponentialBackoff{MinBackoff: durationpb.New(b.Min), MaxBackoff: durationpb.New(b.Max), JitterRatio: float32(b.Jitter)}
}

func headerMatchesToProto(hs []policy.HeaderMatch) []*httproutepb.HeaderMatch {
	var out []*httproutepb.HeaderMatch
	for _, h := range hs {
		m := &httproutepb.HeaderMatch{Name: h.Name}
		if h.Regex {
			m.Value = &httproutepb.HeaderMatch_Regex{Regex: h.Value}
		} else {
			m.Value = &httproutepb.HeaderMatch_Exact{Exact: []byte(h.Value)}
		}
		out = append(out, m)
	}
	return out
}

func methodToProto(method string) *pb.HttpMethod {
	if v, ok := pb.HttpMethod_Registered_value[method]; ok {
		return &pb.HttpMethod{Type: &pb.HttpMethod_Registered_{Registered: pb.HttpMethod_Registered(v)}}
	}
	return &pb.HttpMethod{Type: &pb.HttpMethod_Unregistered{Unregistered: method}}
}

func httpMatchToProto(m policy.HTTPRouteMatch) *httproutepb.HttpRouteMatch {
	out := &httproutepb.HttpRouteMatch{Headers: headerMatchesToProto(m.Headers)}
	if m.Path != nil {
		switch m.Path.Kind {
		case policy.PathExact:
			out.Path = &httproutepb.PathMatch{Kind: &httproutepb.PathMatch_Exact{Exact: m.Path.Value}}
		case policy.PathRegex:
			out.Path = &httproutepb.PathMatch{Kind: &httproutepb.PathMatch_Regex{Regex: m.Path.Value}}
		default:
			out.Path = &httproutepb.PathMatch{Kind: &httproutepb.PathMatch_Prefix{Prefix: m.Path.Value}}
		}
	}
	for _, q := range m.QueryParams {
		qm := &httproutepb.QueryParamMatch{Name: q.Name}
		if q.Regex {
			qm.Value = &httproutepb.QueryParamMatch_Regex{Regex: q.Value}
		} else {
			qm.Value = &httproutepb.QueryParamMatch_Exact{Exact: q.Value}
		}
		out.QueryParams = append(out.QueryParams, qm)
	}
	if m.Method != "" {
		out.Method = methodToProto(m.Method)
	}
	return out
}

func headersToProto(hs []policy.Header) *pb.Headers {
	if len(hs) == 0 {
		return nil
	}
	out := &pb.Headers{}
	for _, h := range hs {
		out.Headers = append(out.Headers, &pb.Headers_Header{Name: h.Name, Value: []byte(h.Value)})
	}
	return out
}

func ratioToProto(r policy.Ratio) *httproutepb.Ratio {
	if r.Denominator == 0 {
		return nil
	}
	return &httproutepb.Ratio{Numerator: r.Numerator, Denominator: r.Denominator}
}

func httpFiltersToProto(fs []policy.Filter) []*outboundpb.HttpRoute_Filter {
	var out []*outboundpb.HttpRoute_Filter
	for _, f := range fs {
		var k *outboundpb.HttpRoute_Filter
		switch {
		case f.RequestHeaders != nil:
			k = &outboundpb.HttpRoute_Filter{Kind: &outboundpb.HttpRoute_Filter_RequestHeaderModifier{RequestHeaderModifier: &httproutepb.RequestHeaderModifier{
				Add: headersToProto(f.RequestHeaders.Add), Set: headersToProto(f.RequestHeaders.Set), Remove: f.RequestHeaders.Remove}}}
		case f.ResponseHeaders != nil:
			k = &outboundpb.HttpRoute_Filter{Kind: &outboundpb.HttpRoute_Filter_ResponseHeaderModifier{ResponseHeaderModifier: &httproutepb.ResponseHeaderModifier{
				Add: headersToProto(f.ResponseHeaders.Add), Set: headersToProto(f.ResponseHeaders.Set), Remove: f.ResponseHeaders.Remove}}}
		case f.Redirect != nil:
			k = &outboundpb.HttpRoute_Filter{Kind: &outboundpb.HttpRoute_Filter_Redirect{Redirect: redirectToProto(f.Redirect)}}
		case f.FailureInjector != nil:
			k = &outboundpb.HttpRoute_Filter{Kind: &outboundpb.HttpRoute_Filter_FailureInjector{FailureInjector: &httproutepb.HttpFailureInjector{
				Status: uint32(f.FailureInjector.Status), Message: f.FailureInjector.Message, Ratio: ratioToProto(f.FailureInjector.Ratio)}}}
		default:
			continue
		}
		out = append(out, k)
	}
	return out
}

// redirectToProto encodes a redirect filter.
func redirectToProto(r *policy.Redirect) *httproutepb.RequestRedirect {
	rd := &httproutepb.RequestRedirect{Host: r.Host, Port: uint32(r.Port), Status: uint32(r.Status)}
	switch r.Scheme {
	case "":
	case "http":
		rd.Scheme = &pb.Scheme{Type: &pb.Scheme_Registered_{Registered: pb.Scheme_HTTP}}
	case "https":
		rd.Scheme = &pb.Scheme{Type: &pb.Scheme_Registered_{Registered: pb.Scheme_HTTPS}}
	default:
		rd.Scheme = &pb.Scheme{Type: &pb.Scheme_Unregistered{Unregistered: r.Scheme}}
	}
	if pm := r.Path; pm != nil {
		if pm.Prefix {
			rd.Path = &httproutepb.PathModifier{Replace: &httproutepb.PathModifier_Prefix{Prefix: pm.Full}}
		} else {
			rd.Path = &httproutepb.PathModifier{Replace: &httproutepb.PathModifier_Full{Full: pm.Full}}
		}
	}
	return rd
}

func grpcFiltersToProto(fs []policy.Filter) []*outboundpb.GrpcRoute_Filter {
	var out []*outboundpb.GrpcRoute_Filter
	for _, f := range fs {
		switch {
		case f.RequestHeaders != nil:
			out = append(out, &outboundpb.GrpcRoute_Filter{Kind: &outboundpb.GrpcRoute_Filter_RequestHeaderModifier{RequestHeaderModifier: &httproutepb.RequestHeaderModifier{
				Add: headersToProto(f.RequestHeaders.Add), Set: headersToProto(f.RequestHeaders.Set), Remove: f.RequestHeaders.Remove}}})
		case f.GRPCFailureInjector != nil:
			out = append(out, &outboundpb.GrpcRoute_Filter{Kind: &outboundpb.GrpcRoute_Filter_FailureInjector{FailureInjector: &grpcroutepb.GrpcFailureInjector{
				Code: uint32(f.GRPCFailureInjector.Code), Message: f.GRPCFailureInjector.Message, Ratio: ratioToProto(f.GRPCFailureInjector.Ratio)}}})
		}
	}
	return out
}

func backendToProto(b policy.Backend) *outboundpb.Backend {
	out := &outboundpb.Backend{
		Metadata: metaToProto(b.Meta),
		Queue:    &outboundpb.Queue{Capacity: b.Queue.Capacity, FailfastTimeout: durationpb.New(b.Queue.FailFastTimeout)},
	}
	switch {
	case b.Balancer != nil:
		bl := &outboundpb.Backend_BalanceP2C{
			Discovery: &outboundpb.Backend_EndpointDiscovery{Kind: &outboundpb.Backend_EndpointDiscovery_Dst{
				Dst: &outboundpb.Backend_EndpointDiscovery_DestinationGet{Path: b.Balancer.Authority}}},
		}
		if pen := b.Balancer.Penalty; pen != nil {
			bl.Load = &outboundpb.Backend_BalanceP2C_PenaltyPeakEwma_{PenaltyPeakEwma: &outboundpb.Backend_BalanceP2C_PenaltyPeakEwma{
				DefaultRtt: durationpb.New(b.Balancer.DefaultRTT), Decay: durationpb.New(b.Balancer.Decay),
				Penalty: durationpb.New(pen.Penalty), MaxRetryAfter: durationpb.New(pen.MaxRetryAfter), PenaltyDecay: durationpb.New(pen.PenaltyDecay)}}
		} else {
			bl.Load = &outboundpb.Backend_BalanceP2C_PeakEwma_{PeakEwma: &outboundpb.Backend_BalanceP2C_PeakEwma{
				DefaultRtt: durationpb.New(b.Balancer.DefaultRTT), Decay: durationpb.New(b.Balancer.Decay)}}
		}
		bl.OutlierDetection = outlierToProto(b.Balancer.Outlier)
		out.Kind = &outboundpb.Backend_Balancer{Balancer: bl}
	case b.Forward != nil:
		out.Kind = &outboundpb.Backend_Forward{Forward: EndpointToProto(*b.Forward)}
	}
	return out
}

// opaqueRoutesToProto encodes opaque routes, each of one rule whose only
// filter, on a route that forbids its connections, is Forbidden.
func opaqueRoutesToProto(routes []policy.OpaqueRoute) []*outboundpb.OpaqueRoute {
	var out []*outboundpb.OpaqueRoute
	for _, r := range routes {
		d := &outboundpb.OpaqueRoute_Distribution{}
		switch r.Backends.Kind {
		case policy.DistributionFirstAvailable:
			fa := &outboundpb.OpaqueRoute_Distribution_FirstAvailable{}
			for _, b := range r.Backends.Backends {
				fa.Backends = append(fa.Backends, &outboundpb.OpaqueRoute_RouteBackend{Backend: backendToProto(b.Backend)})
			}
			d.Kind = &outboundpb.OpaqueRoute_Distribution_FirstAvailable_{FirstAvailable: fa}
		case policy.DistributionRandomAvailable:
			ra := &outboundpb.OpaqueRoute_Distribution_RandomAvailable{}
			for _, b := range r.Backends.Backends {
				ra.Backends = append(ra.Backends, &outboundpb.OpaqueRoute_WeightedRouteBackend{
					Backend: &outboundpb.OpaqueRoute_RouteBackend{Backend: backendToProto(b.Backend)}, Weight: b.Weight})
			}
			d.Kind = &outboundpb.OpaqueRoute_Distribution_RandomAvailable_{RandomAvailable: ra}
		default:
			d.Kind = &outboundpb.OpaqueRoute_Distribution_Empty_{Empty: &outboundpb.OpaqueRoute_Distribution_Empty{}}
		}
		rule := &outboundpb.OpaqueRoute_Rule{Backends: d}
		if r.Forbidden {
			rule.Filters = []*outboundpb.OpaqueRoute_Filter{{Kind: &outboundpb.OpaqueRoute_Filter_Forbidden{Forbidden: &opaqueroutepb.Forbidden{}}}}
		}
		out = append(out, &outboundpb.OpaqueRoute{Metadata: metaToProto(r.Meta), Rules: []*outboundpb.OpaqueRoute_Rule{rule}})
	}
	return out
}

func httpRoutesToProto(routes []policy.HTTPRoute) []*outboundpb.HttpRoute {
	out := make([]*outboundpb.HttpRoute, 0, len(routes))
	for _, r := range routes {
		hr := &outboundpb.HttpRoute{Metadata: metaToProto(r.Meta), Hosts: hostsToProto(r.Hosts)}
		for _, rule := range r.Rules {
			pr := &outboundpb.HttpRoute_Rule{
				Filters:  httpFiltersToProto(rule.Filters),
				Timeouts: timeoutsToProto(rule.Timeouts),
				// The deprecated field mirrors the request timeout, as
				// Linkerd's controller still sends it for older proxies.
				//lint:ignore SA1019 sent for proxies that read only this field
				RequestTimeout:         durationOrNil(rule.Timeouts.Request),
				AllowL5DRequestHeaders: rule.AllowL5dRequestHeaders,
				Hedge:                  hedgeToProto(rule.Hedge),
				Backends:               &outboundpb.HttpRoute_Distribution{},
				InmeshRequestMirrors:   mirrorsToProto(rule.Mirrors),
			}
			for _, m := range rule.Matches {
				pr.Matches = append(pr.Matches, httpMatchToProto(m))
			}
			switch rule.Backends.Kind {
			case policy.DistributionFirstAvailable:
				fa := &outboundpb.HttpRoute_Distribution_FirstAvailable{}
				for _, b := range rule.Backends.Backends {
					fa.Backends = append(fa.Backends, &outboundpb.HttpRoute_RouteBackend{Backend: backendToProto(b.Backend), Filters: httpFiltersToProto(b.Filters)})
				}
				pr.Backends.Kind = &outboundpb.HttpRoute_Distribution_FirstAvailable_{FirstAvailable: fa}
			case policy.DistributionRandomAvailable:
				ra := &outboundpb.HttpRoute_Distribution_RandomAvailable{}
				for _, b := range rule.Backends.Backends {
					ra.Backends = append(ra.Backends, &outboundpb.HttpRoute_WeightedRouteBackend{Weight: b.Weight,
						Backend: &outboundpb.HttpRoute_RouteBackend{Backend: backendToProto(b.Backend), Filters: httpFiltersToProto(b.Filters)}})
				}
				pr.Backends.Kind = &outboundpb.HttpRoute_Distribution_RandomAvailable_{RandomAvailable: ra}
			default:
				pr.Backends.Kind = &outboundpb.HttpRoute_Distribution_Empty_{Empty: &outboundpb.HttpRoute_Distribution_Empty{}}
			}
			if rt := rule.Retry; rt != nil {
				c := &outboundpb.HttpRoute_Retry_Conditions{}
				for _, s := range rt.StatusRanges {
					c.StatusRanges = append(c.StatusRanges, &outboundpb.HttpRoute_Retry_Conditions_StatusRange{Start: uint32(s.Start), End: uint32(s.End)})
				}
				pr.Retry = &outboundpb.HttpRoute_Retry{MaxRetries: uint32(rt.Limit()), MaxRequestBytes: uint32(rt.BodyLimit()),
					Conditions: c, Timeout: durationOrNil(rt.Timeout), Backoff: backoffToProto(rt)}
			}
			hr.Rules = append(hr.Rules, pr)
		}
		out = append(out, hr)
	}
	return out
}

func grpcRoutesToProto(routes []policy.GRPCRoute) []*outboundpb.GrpcRoute {
	out := make([]*outboundpb.GrpcRoute, 0, len(routes))
	for _, r := range routes {
		gr := &outboundpb.GrpcRoute{Metadata: metaToProto(r.Meta), Hosts: hostsToProto(r.Hosts)}
		for _, rule := range r.Rules {
			pr := &outboundpb.GrpcRoute_Rule{
				Filters:  grpcFiltersToProto(rule.Filters),
				Timeouts: timeoutsToProto(rule.Timeouts),
				// The deprecated field mirrors the request timeout, as
				// Linkerd's controller still sends it for older proxies.
				//lint:ignore SA1019 sent for proxies that read only this field
				RequestTimeout:         durationOrNil(rule.Timeouts.Request),
				AllowL5DRequestHeaders: rule.AllowL5dRequestHeaders,
				Hedge:                  hedgeToProto(rule.Hedge),
				InmeshRequestMirrors:   mirrorsToProto(rule.Mirrors),
				Backends:               &outboundpb.GrpcRoute_Distribution{},
			}
			for _, m := range rule.Matches {
				pr.Matches = append(pr.Matches, &grpcroutepb.GrpcRouteMatch{
					Rpc: &grpcroutepb.GrpcRpcMatch{Service: m.Service, Method: m.Method}, Headers: headerMatchesToProto(m.Headers)})
			}
			switch rule.Backends.Kind {
			case policy.DistributionFirstAvailable:
				fa := &outboundpb.GrpcRoute_Distribution_FirstAvailable{}
				for _, b := range rule.Backends.Backends {
					fa.Backends = append(fa.Backends, &outboundpb.GrpcRoute_RouteBackend{Backend: backendToProto(b.Backend), Filters: grpcFiltersToProto(b.Filters)})
				}
				pr.Backends.Kind = &outboundpb.GrpcRoute_Distribution_FirstAvailable_{FirstAvailable: fa}
			case policy.DistributionRandomAvailable:
				ra := &outboundpb.GrpcRoute_Distribution_RandomAvailable{}
				for _, b := range rule.Backends.Backends {
					ra.Backends = append(ra.Backends, &outboundpb.GrpcRoute_WeightedRouteBackend{Weight: b.Weight,
						Backend: &outboundpb.GrpcRoute_RouteBackend{Backend: backendToProto(b.Backend), Filters: grpcFiltersToProto(b.Filters)}})
				}
				pr.Backends.Kind = &outboundpb.GrpcRoute_Distribution_RandomAvailable_{RandomAvailable: ra}
			default:
				pr.Backends.Kind = &outboundpb.GrpcRoute_Distribution_Empty_{Empty: &outboundpb.GrpcRoute_Distribution_Empty{}}
			}
			if rt := rule.Retry; rt != nil {
				c := &outboundpb.GrpcRoute_Retry_Conditions{}
				for _, code := range rt.GRPCCodes {
					switch code {
					case codes.Canceled:
						c.Cancelled = true
					case codes.DeadlineExceeded:
						c.DeadineExceeded = true
					case codes.ResourceExhausted:
						c.ResourceExhausted = true
					case codes.Internal:
						c.Internal = true
					case codes.Unavailable:
						c.Unavailable = true
					}
				}
				pr.Retry = &outboundpb.GrpcRoute_Retry{MaxRetries: uint32(rt.Limit()), MaxRequestBytes: uint32(rt.BodyLimit()),
					Conditions: c, Timeout: durationOrNil(rt.Timeout), Backoff: backoffToProto(rt)}
			}
			gr.Rules = append(gr.Rules, pr)
		}
		out = append(out, gr)
	}
	return out
}
