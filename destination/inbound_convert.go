package destination

import (
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/policy"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/grpcroutepb"
	"github.com/inmesh/inmesh/proxyapi/httproutepb"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// InboundDetectTimeout is the detect timeout sent with an inbound Server
// whose protocol is detected, as Linkerd's controller sends it.
const InboundDetectTimeout = 10 * time.Second

// ServerToProto encodes the inbound policy of a port for the
// InboundServerPolicies API, as Linkerd's policy controller lays it out:
// the Server's meta in its labels map (group, kind, name), each
// authorization with its metadata and the same values in its deprecated
// labels, the routes (HTTP, or gRPC for a gRPC Server) and the rate limit
// of HTTP protocols. inmesh's own limit of requests in flight travels as
// one more label, authz.AnnotationMaxConcurrentRequests, which Linkerd's
// proxy ignores.
func ServerToProto(s *authz.Server) *inboundpb.Server {
	out := &inboundpb.Server{
		Protocol:       &inboundpb.ProxyProtocol{},
		Authorizations: authzsToProto(s.Authorizations),
		Labels:         map[string]string{"group": s.Meta.Group, "kind": s.Meta.Kind, "name": s.Meta.Name},
	}
	if s.MaxConcurrentRequests > 0 {
		out.Labels[authz.AnnotationMaxConcurrentRequests] = strconv.Itoa(s.MaxConcurrentRequests)
	}
	routes := inboundRoutesToProto(s.Routes)
	limit := rateLimitToProto(s.RateLimit)
	switch s.Protocol {
	case authz.ProtocolDetect:
		out.Protocol.Kind = &inboundpb.ProxyProtocol_Detect_{Detect: &inboundpb.ProxyProtocol_Detect{
			Timeout: durationpb.New(InboundDetectTimeout), HttpRoutes: routes, HttpLocalRateLimit: limit}}
	case authz.ProtocolHTTP1:
		out.Protocol.Kind = &inboundpb.ProxyProtocol_Http1_{Http1: &inboundpb.ProxyProtocol_Http1{Routes: routes, LocalRateLimit: limit}}
	case authz.ProtocolHTTP2:
		out.Protocol.Kind = &inboundpb.ProxyProtocol_Http2_{Http2: &inboundpb.ProxyProtocol_Http2{Routes: routes, LocalRateLimit: limit}}
	case authz.ProtocolGRPC:
		out.Protocol.Kind = &inboundpb.ProxyProtocol_Grpc_{Grpc: &inboundpb.ProxyProtocol_Grpc{Routes: inboundGRPCRoutesToProto(s.GRPCRoutes)}}
	case authz.ProtocolOpaque:
		out.Protocol.Kind = &inboundpb.ProxyProtocol_Opaque_{Opaque: &inboundpb.ProxyProtocol_Opaque{}}
	case authz.ProtocolTLS:
		out.Protocol.Kind = &inboundpb.ProxyProtocol_Tls_{Tls: &inboundpb.ProxyProtocol_Tls{}}
	}
	return out
}

func inboundMetaToProto(m authz.Meta) *pb.Metadata {
	return metaToProto(policy.Metadata{Group: m.Group, Kind: m.Kind, Name: m.Name})
}

func authzsToProto(as []authz.Authz) []*inboundpb.Authz {
	var out []*inboundpb.Authz
	for _, a := range as {
		pa := &inboundpb.Authz{
			Metadata: inboundMetaToProto(a.Meta),
			Labels:   map[string]string{"group": a.Meta.Group, "kind": a.Meta.Kind, "name": a.Meta.Name},
		}
		for _, n := range a.Networks {
			pn := &inboundpb.Network{Net: prefixToProto(n.Net)}
			for _, e := range n.Except {
				pn.Except = append(pn.Except, prefixToProto(e))
			}
			pa.Networks = append(pa.Networks, pn)
		}
		switch m := a.Authentication.MeshTLS; {
		case m == nil:
			pa.Authentication = &inboundpb.Authn{Permit: &inboundpb.Authn_Unauthenticated{Unauthenticated: &inboundpb.Authn_PermitUnauthenticated{}}}
		case m.Unauthenticated:
			pa.Authentication = &inboundpb.Authn{Permit: &inboundpb.Authn_MeshTLS{MeshTLS: &inboundpb.Authn_PermitMeshTLS{
				Clients: &inboundpb.Authn_PermitMeshTLS_Unauthenticated{Unauthenticated: &inboundpb.Authn_PermitUnauthenticated{}}}}}
		default:
			ids := &inboundpb.Authn_PermitMeshTLS_PermitClientIdentities{}
			for _, id := range m.Identities {
				ids.Identities = append(ids.Identities, &inboundpb.Identity{Name: id})
			}
			for _, s := range m.Suffixes {
				ids.Suffixes = append(ids.Suffixes, &inboundpb.IdentitySuffix{Parts: s})
			}
			pa.Authentication = &inboundpb.Authn{Permit: &inboundpb.Authn_MeshTLS{MeshTLS: &inboundpb.Authn_PermitMeshTLS{
				Clients: &inboundpb.Authn_PermitMeshTLS_Identities{Identities: ids}}}}
		}
		out = append(out, pa)
	}
	return out
}

func prefixToProto(p netip.Prefix) *pb.IPNetwork {
	return &pb.IPNetwork{Ip: AddrToProto(netip.AddrPortFrom(p.Addr(), 0)).GetIp(), PrefixLen: uint32(p.Bits())}
}

func inboundRoutesToProto(rs []authz.Route) []*inboundpb.HttpRoute {
	var out []*inboundpb.HttpRoute
	for _, r := range rs {
		pr := &inboundpb.HttpRoute{Metadata: inboundMetaToProto(r.Meta), Hosts: hostsToProto(r.Hosts), Authorizations: authzsToProto(r.Authorizations)}
		for _, rule := range r.Rules {
			prule := &inboundpb.HttpRoute_Rule{}
			for _, m := range rule.Matches {
				prule.Matches = append(prule.Matches, httpMatchToProto(m))
			}
			for _, f := range rule.Filters {
				switch {
				case f.RequestHeaders != nil:
					prule.Filters = append(prule.Filters, &inboundpb.HttpRoute_Filter{Kind: &inboundpb.HttpRoute_Filter_RequestHeaderModifier{
						RequestHeaderModifier: &httproutepb.RequestHeaderModifier{Add: headersToProto(f.RequestHeaders.Add),
							Set: headersToProto(f.RequestHeaders.Set), Remove: f.RequestHeaders.Remove}}})
				case f.Redirect != nil:
					prule.Filters = append(prule.Filters, &inboundpb.HttpRoute_Filter{Kind: &inboundpb.HttpRoute_Filter_Redirect{
						Redirect: redirectToProto(f.Redirect)}})
				case f.FailureInjector != nil:
					prule.Filters = append(prule.Filters, &inboundpb.HttpRoute_Filter{Kind: &inboundpb.HttpRoute_Filter_FailureInjector{
						FailureInjector: &httproutepb.HttpFailureInjector{Status: uint32(f.FailureInjector.Status),
							Message: f.FailureInjector.Message, Ratio: ratioToProto(f.FailureInjector.Ratio)}}})
				}
			}
			pr.Rules = append(pr.Rules, prule)
		}
		out = append(out, pr)
	}
	return out
}

func rateLimitToProto(rl *authz.RateLimit) *inboundpb.HttpLocalRateLimit {
	if rl == nil {
		return nil
	}
	limit := func(rps uint32) *inboundpb.HttpLocalRateLimit_Limit {
		if rps == 0 {
			return nil
		}
		return &inboundpb.HttpLocalRateLimit_Limit{RequestsPerSecond: rps}
	}
	out := &inboundpb.HttpLocalRateLimit{Metadata: inboundMetaToProto(rl.Meta), Total: limit(rl.Total), Identity: limit(rl.Identity)}
	for _, o := range rl.Overrides {
		ids := &inboundpb.HttpLocalRateLimit_Override_ClientIdentities{}
		for _, id := range o.Identities {
			ids.Identities = append(ids.Identities, &inboundpb.Identity{Name: id})
		}
		out.Overrides = append(out.Overrides, &inboundpb.HttpLocalRateLimit_Override{Limit: limit(o.RPS), Clients: ids})
	}
	return out
}

// ServerFromProto decodes an inbound Server, as Linkerd's proxy reads one,
// with errors naming the field ("authorizations[1].networks[0].net:
// ..."). The Server's meta comes from its labels map; an authorization
// takes its metadata, or its deprecated labels when it has none.
func ServerFromProto(m *inboundpb.Server) (*authz.Server, error) {
	if m == nil {
		return nil, errAt("server", "null")
	}
	s := &authz.Server{Meta: authz.Meta{Group: m.GetLabels()["group"], Kind: m.GetLabels()["kind"], Name: m.GetLabels()["name"]}}
	var err error
	if s.MaxConcurrentRequests, err = authz.MaxConcurrentRequestsFrom(m.GetLabels()); err != nil {
		return nil, errAt("labels", "%v", err)
	}
	if s.Authorizations, err = authzsFromProto(m.GetAuthorizations(), "authorizations"); err != nil {
		return nil, err
	}
	var routes []*inboundpb.HttpRoute
	var limit *inboundpb.HttpLocalRateLimit
	switch k := m.GetProtocol().GetKind().(type) {
	case *inboundpb.ProxyProtocol_Detect_:
		s.Protocol, routes, limit = authz.ProtocolDetect, k.Detect.GetHttpRoutes(), k.Detect.GetHttpLocalRateLimit()
	case *inboundpb.ProxyProtocol_Http1_:
		s.Protocol, routes, limit = authz.ProtocolHTTP1, k.Http1.GetRoutes(), k.Http1.GetLocalRateLimit()
	case *inboundpb.ProxyProtocol_Http2_:
		s.Protocol, routes, limit = authz.ProtocolHTTP2, k.Http2.GetRoutes(), k.Http2.GetLocalRateLimit()
	case *inboundpb.ProxyProtocol_Grpc_:
		s.Protocol = authz.ProtocolGRPC
		for i, r := range k.Grpc.GetRoutes() {
			route, err := inboundGRPCRouteFromProto(r, fmt.Sprintf("protocol.grpc.routes[%d]", i))
			if err != nil {
				return nil, err
			}
			s.GRPCRoutes = append(s.GRPCRoutes, route)
		}
	case *inboundpb.ProxyProtocol_Opaque_:
		s.Protocol = authz.ProtocolOpaque
	case *inboundpb.ProxyProtocol_Tls_:
		s.Protocol = authz.ProtocolTLS
	default:
		return nil, errAt("protocol.kind", "no protocol set")
	}
	for i, r := range routes {
		route, err := inboundRouteFromProto(r, fmt.Sprintf("protocol.routes[%d]", i))
		if err != nil {
			return nil, err
		}
		s.Routes = append(s.Routes, route)
	}
	if limit != nil {
		rl := &authz.RateLimit{Total: limit.GetTotal().GetRequestsPerSecond(), Identity: limit.GetIdentity().GetRequestsPerSecond()}
		if limit.GetMetadata() != nil {
			rl.Meta = inboundMetaFromProto(limit.GetMetadata())
		}
		// An override that limits nobody is left out, as Linkerd's proxy
		// reads it (linkerd/proxy/server-policy/src/local_rate_limit.rs):
		// one without a rate, without identities (Linkerd's controller
		// sends an HTTPLocalRateLimitPolicy override with empty clientRefs
		// so), and its empty identity names.
		for _, o := range limit.GetOverrides() {
			ov := authz.Override{RPS: o.GetLimit().GetRequestsPerSecond()}
			for _, id := range o.GetClients().GetIdentities() {
				if id.GetName() != "" {
					ov.Identities = append(ov.Identities, id.GetName())
				}
			}
			if ov.RPS > 0 && len(ov.Identities) > 0 {
				rl.Overrides = append(rl.Overrides, ov)
			}
		}
		s.RateLimit = rl
	}
	return s, nil
}

func authzsFromProto(as []*inboundpb.Authz, path string) ([]authz.Authz, error) {
	var out []authz.Authz
	for i, a := range as {
		apath := fmt.Sprintf("%s[%d]", path, i)
		var az authz.Authz
		if a.GetMetadata() != nil {
			az.Meta = inboundMetaFromProto(a.GetMetadata())
		} else {
			l := a.GetLabels()
			az.Meta = authz.Meta{Group: l["group"], Kind: l["kind"], Name: l["name"]}
		}
		for j, n := range a.GetNetworks() {
			npath := fmt.Sprintf("%s.networks[%d]", apath, j)
			net, err := prefixFromProto(n.GetNet(), npath+".net")
			if err != nil {
				return nil, err
			}
			nw := authz.Network{Net: net}
			for k, e := range n.GetExcept() {
				ex, err := prefixFromProto(e, fmt.Sprintf("%s.except[%d]", npath, k))
				if err != nil {
					return nil, err
				}
				nw.Except = append(nw.Except, ex)
			}
			az.Networks = append(az.Networks, nw)
		}
		switch p := a.GetAuthentication().GetPermit().(type) {
		case *inboundpb.Authn_Unauthenticated:
		case *inboundpb.Authn_MeshTLS:
			switch c := p.MeshTLS.GetClients().(type) {
			case *inboundpb.Authn_PermitMeshTLS_Unauthenticated:
				az.Authentication.MeshTLS = &authz.MeshTLS{Unauthenticated: true}
			case *inboundpb.Authn_PermitMeshTLS_Identities:
				mt := &authz.MeshTLS{}
				for _, id := range c.Identities.GetIdentities() {
					mt.Identities = append(mt.Identities, id.GetName())
				}
				for _, s := range c.Identities.GetSuffixes() {
					mt.Suffixes = append(mt.Suffixes, append([]string{}, s.GetParts()...))
				}
				az.Authentication.MeshTLS = mt
			default:
				return nil, errAt(apath+".authentication.meshTLS.clients", "no clients set")
			}
		default:
			return nil, errAt(apath+".authentication.permit", "no permit set")
		}
		out = append(out, az)
	}
	return out, nil
}

// inboundMetaFromProto reads the metadata of inbound policy, whose
// resources carry no namespace: a default meta has kind "default".
func inboundMetaFromProto(m *pb.Metadata) authz.Meta {
	if d, ok := m.GetKind().(*pb.Metadata_Default); ok {
		return authz.DefaultMeta(d.Default)
	}
	r := m.GetResource()
	return authz.Meta{Group: r.GetGroup(), Kind: r.GetKind(), Name: r.GetName()}
}

func prefixFromProto(n *pb.IPNetwork, path string) (netip.Prefix, error) {
	ap, err := AddrFromProto(&pb.TcpAddress{Ip: n.GetIp()})
	if err != nil {
		return netip.Prefix{}, errAt(path+".ip", "%v", err)
	}
	p, err := ap.Addr().Prefix(int(n.GetPrefixLen()))
	if err != nil || int(n.GetPrefixLen()) > ap.Addr().BitLen() {
		return netip.Prefix{}, errAt(path+".prefix_len", "%d is not a prefix length of %s", n.GetPrefixLen(), ap.Addr())
	}
	return p, nil
}

func inboundRouteFromProto(r *inboundpb.HttpRoute, path string) (authz.Route, error) {
	var out authz.Route
	if r.GetMetadata() != nil {
		out.Meta = inboundMetaFromProto(r.GetMetadata())
	}
	var err error
	if out.Hosts, err = hostsFromProto(r.GetHosts(), path+".hosts"); err != nil {
		return out, err
	}
	if out.Authorizations, err = authzsFromProto(r.GetAuthorizations(), path+".authorizations"); err != nil {
		return out, err
	}
	for i, rule := range r.GetRules() {
		rpath := fmt.Sprintf("%s.rules[%d]", path, i)
		var ar authz.Rule
		for j, m := range rule.GetMatches() {
			hm, err := httpMatchFromProto(m, fmt.Sprintf("%s.matches[%d]", rpath, j))
			if err != nil {
				return out, err
			}
			ar.Matches = append(ar.Matches, hm)
		}
		for j, f := range rule.GetFilters() {
			fpath := fmt.Sprintf("%s.filters[%d]", rpath, j)
			switch k := f.GetKind().(type) {
			case *inboundpb.HttpRoute_Filter_RequestHeaderModifier:
				m := k.RequestHeaderModifier
				ar.Filters = append(ar.Filters, policy.Filter{RequestHeaders: modifierFromProto(m.GetAdd(), m.GetSet(), m.GetRemove())})
			case *inboundpb.HttpRoute_Filter_Redirect:
				rd, err := redirectFromProto(k.Redirect, fpath+".redirect")
				if err != nil {
					return out, err
				}
				ar.Filters = append(ar.Filters, policy.Filter{Redirect: rd})
			case *inboundpb.HttpRoute_Filter_FailureInjector:
				ratio, err := ratioFromProto(k.FailureInjector.GetRatio(), fpath+".failure_injector.ratio")
				if err != nil {
					return out, err
				}
				ar.Filters = append(ar.Filters, policy.Filter{FailureInjector: &policy.FailureInjector{
					Status: int(k.FailureInjector.GetStatus()), Message: k.FailureInjector.GetMessage(), Ratio: ratio}})
			default:
				return out, errAt(fpath+".kind", "no filter set")
			}
		}
		out.Rules = append(out.Rules, ar)
	}
	return out, nil
}

func inboundGRPCRoutesToProto(rs []authz.GRPCRoute) []*inboundpb.GrpcRoute {
	var out []*inboundpb.GrpcRoute
	for _, r := range rs {
		pr := &inboundpb.GrpcRoute{Metadata: inboundMetaToProto(r.Meta), Hosts: hostsToProto(r.Hosts), Authorizations: authzsToProto(r.Authorizations)}
		for _, rule := range r.Rules {
			prule := &inboundpb.GrpcRoute_Rule{}
			for _, m := range rule.Matches {
				prule.Matches = append(prule.Matches, &grpcroutepb.GrpcRouteMatch{
					Rpc: &grpcroutepb.GrpcRpcMatch{Service: m.Service, Method: m.Method}, Headers: headerMatchesToProto(m.Headers)})
			}
			// The filters of an inbound gRPC rule are those of an outbound
			// one: encode them so, and carry each over.
			for _, f := range grpcFiltersToProto(rule.Filters) {
				switch k := f.GetKind().(type) {
				case *outboundpb.GrpcRoute_Filter_RequestHeaderModifier:
					prule.Filters = append(prule.Filters, &inboundpb.GrpcRoute_Filter{Kind: &inboundpb.GrpcRoute_Filter_RequestHeaderModifier{RequestHeaderModifier: k.RequestHeaderModifier}})
				case *outboundpb.GrpcRoute_Filter_FailureInjector:
					prule.Filters = append(prule.Filters, &inboundpb.GrpcRoute_Filter{Kind: &inboundpb.GrpcRoute_Filter_FailureInjector{FailureInjector: k.FailureInjector}})
				}
			}
			pr.Rules = append(pr.Rules, prule)
		}
		out = append(out, pr)
	}
	return out
}

func inboundGRPCRouteFromProto(r *inboundpb.GrpcRoute, path string) (authz.GRPCRoute, error) {
	out := authz.GRPCRoute{Meta: inboundMetaFromProto(r.GetMetadata())}
	var err error
	if out.Hosts, err = hostsFromProto(r.GetHosts(), path+".hosts"); err != nil {
		return out, err
	}
	if out.Authorizations, err = authzsFromProto(r.GetAuthorizations(), path+".authorizations"); err != nil {
		return out, err
	}
	for i, rule := range r.GetRules() {
		rpath := fmt.Sprintf("%s.rules[%d]", path, i)
		var gr authz.GRPCRule
		for j, m := range rule.GetMatches() {
			mpath := fmt.Sprintf("%s.matches[%d]", rpath, j)
			gm := policy.GRPCRouteMatch{Service: m.GetRpc().GetService(), Method: m.GetRpc().GetMethod()}
			if gm.Headers, err = headerMatchesFromProto(m.GetHeaders(), mpath+".headers"); err != nil {
				return out, err
			}
			gr.Matches = append(gr.Matches, gm)
		}
		var fs []*outboundpb.GrpcRoute_Filter
		for _, f := range rule.GetFilters() {
			switch k := f.GetKind().(type) {
			case *inboundpb.GrpcRoute_Filter_RequestHeaderModifier:
				fs = append(fs, &outboundpb.GrpcRoute_Filter{Kind: &outboundpb.GrpcRoute_Filter_RequestHeaderModifier{RequestHeaderModifier: k.RequestHeaderModifier}})
			case *inboundpb.GrpcRoute_Filter_FailureInjector:
				fs = append(fs, &outboundpb.GrpcRoute_Filter{Kind: &outboundpb.GrpcRoute_Filter_FailureInjector{FailureInjector: k.FailureInjector}})
			default:
				fs = append(fs, &outboundpb.GrpcRoute_Filter{})
			}
		}
		if gr.Filters, err = grpcFiltersFromProto(fs, rpath+".filters"); err != nil {
			return out, err
		}
		out.Rules = append(out.Rules, gr)
	}
	return out, nil
}
