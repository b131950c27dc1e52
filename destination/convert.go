package destination

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Bounds of an endpoint's metric labels (its set's labels and its own,
// merged), which become dst_* labels on every request series: an endpoints
// file or a Get stream beyond them is an error naming the field, and the
// endpoint is not used.
const (
	MaxEndpointLabels = manifest.MaxEndpointLabels // labels of one endpoint
	MaxLabelKeyLen    = manifest.MaxLabelKeyLen    // bytes of one label key
	MaxLabelValueLen  = manifest.MaxLabelValueLen  // bytes of one label value
)

// checkLabels applies the label bounds; the error names the label at
// fault.
func checkLabels(labels map[string]string) error { return manifest.CheckLabels(labels) }

// ProfileToProto converts a profile to its wire form. Routes with a nil
// condition are sent without one.
func ProfileToProto(p *profiles.Profile) *pb.DestinationProfile {
	m := &pb.DestinationProfile{
		FullyQualifiedName: p.FullyQualifiedName,
		OpaqueProtocol:     p.OpaqueProtocol,
	}
	for _, r := range p.Routes {
		pr := &pb.Route{
			Condition:     requestMatchToProto(r.Condition),
			MetricsLabels: maps.Clone(r.Labels),
			IsRetryable:   r.Retryable,
			Hedge:         hedgeToProto(r.Hedge),
		}
		if r.Timeout > 0 {
			pr.Timeout = durationpb.New(r.Timeout)
		}
		for _, c := range r.ResponseClasses {
			pr.ResponseClasses = append(pr.ResponseClasses, &pb.ResponseClass{
				Condition: responseMatchToProto(c.Condition),
				IsFailure: c.IsFailure,
			})
		}
		m.Routes = append(m.Routes, pr)
	}
	if b := p.RetryBudget; b != nil {
		m.RetryBudget = &pb.RetryBudget{
			RetryRatio:          b.RetryRatio,
			MinRetriesPerSecond: b.MinRetriesPerSecond,
			Ttl:                 durationpb.New(b.TTL),
		}
	}
	for _, d := range p.DstOverrides {
		m.DstOverrides = append(m.DstOverrides, &pb.WeightedDst{Authority: d.Authority, Weight: d.Weight})
	}
	if p.Endpoint != nil {
		m.Endpoint = EndpointToProto(*p.Endpoint)
	}
	return m
}

func requestMatchToProto(m profiles.RequestMatch) *pb.RequestMatch {
	switch m := m.(type) {
	case profiles.MatchAll:
		return &pb.RequestMatch{Match: &pb.RequestMatch_All{All: &pb.RequestMatch_Seq{Matches: requestSeqToProto(m)}}}
	case profiles.MatchAny:
		return &pb.RequestMatch{Match: &pb.RequestMatch_Any{Any: &pb.RequestMatch_Seq{Matches: requestSeqToProto(m)}}}
	case profiles.MatchNot:
		return &pb.RequestMatch{Match: &pb.RequestMatch_Not{Not: requestMatchToProto(m.Match)}}
	case profiles.PathRegex:
		return &pb.RequestMatch{Match: &pb.RequestMatch_Path{Path: &pb.PathMatch{Regex: string(m)}}}
	case profiles.Method:
		return &pb.RequestMatch{Match: &pb.RequestMatch_Method{Method: MethodToProto(string(m))}}
	}
	return nil
}

func requestSeqToProto(ms []profiles.RequestMatch) []*pb.RequestMatch {
	out := make([]*pb.RequestMatch, len(ms))
	for i, m := range ms {
		out[i] = requestMatchToProto(m)
	}
	return out
}

func responseMatchToProto(m profiles.ResponseMatch) *pb.ResponseMatch {
	switch m := m.(type) {
	case profiles.ResponseAll:
		return &pb.ResponseMatch{Match: &pb.ResponseMatch_All{All: &pb.ResponseMatch_Seq{Matches: responseSeqToProto(m)}}}
	case profiles.ResponseAny:
		return &pb.ResponseMatch{Match: &pb.ResponseMatch_Any{Any: &pb.ResponseMatch_Seq{Matches: responseSeqToProto(m)}}}
	case profiles.ResponseNot:
		return &pb.ResponseMatch{Match: &pb.ResponseMatch_Not{Not: responseMatchToProto(m.Match)}}
	case profiles.StatusRange:
		return &pb.ResponseMatch{Match: &pb.ResponseMatch_Status{Status: &pb.HttpStatusRange{Min: m.Min, Max: m.Max}}}
	}
	return nil
}

func responseSeqToProto(ms []profiles.ResponseMatch) []*pb.ResponseMatch {
	out := make([]*pb.ResponseMatch, len(ms))
	for i, m := range ms {
		out[i] = responseMatchToProto(m)
	}
	return out
}

// MethodToProto encodes a method: one of the registered names (GET, POST,
// PUT, DELETE, PATCH, OPTIONS, CONNECT, HEAD, TRACE) as its enum value,
// anything else as an unregistered string.
func MethodToProto(method string) *pb.HttpMethod {
	if v, ok := pb.HttpMethod_Registered_value[method]; ok {
		return &pb.HttpMethod{Type: &pb.HttpMethod_Registered_{Registered: pb.HttpMethod_Registered(v)}}
	}
	return &pb.HttpMethod{Type: &pb.HttpMethod_Unregistered{Unregistered: method}}
}

// fieldError is a conversion error at a field path of a message.
type fieldError struct {
	path string
	msg  string
}

func (e *fieldError) Error() string { return e.path + ": " + e.msg }

func errAt(path, format string, args ...any) error {
	return &fieldError{path: path, msg: fmt.Sprintf(format, args...)}
}

// ProfileFromProto converts a profile from its wire form. A part that
// cannot be converted is left out and the rest applies, as Linkerd's proxy
// converts a profile (linkerd2-proxy linkerd/service-profiles/src/proto.rs):
// a route without a condition or whose condition does not convert (a match
// with no variant set, a method not set), a condition of an all or an any
// (the all then matches by its other conditions), a response class
// likewise (an all or an any left empty too), a negative route timeout
// (the route has none), a route's invalid hedge (it does not hedge), a
// retry budget whose ttl is negative (retries are disabled) and an
// endpoint that does not convert. dropped names each part left out, such
// as "routes[2].condition.all.matches[0]: no match set". Path regexes,
// status ranges and the rest of the budget are converted as sent, for
// [profiles.Compile] to judge.
func ProfileFromProto(m *pb.DestinationProfile) (p *profiles.Profile, dropped []profiles.Dropped) {
	p = &profiles.Profile{
		FullyQualifiedName: m.GetFullyQualifiedName(),
		OpaqueProtocol:     m.GetOpaqueProtocol(),
	}
	if n := len(m.GetRoutes()); n > 0 {
		p.Routes = make([]profiles.Route, 0, n)
	}
	for i, pr := range m.GetRoutes() {
		path := fmt.Sprintf("routes[%d]", i)
		c := protoConverter{route: pr.GetMetricsLabels()["route"], dropped: &dropped}
		if pr == nil {
			c.drop(path, errAt(path, "null route"))
			continue
		}
		if pr.GetCondition() == nil {
			c.drop(path, errAt(path+".condition", "required"))
			continue
		}
		cond, err := c.requestMatch(pr.GetCondition(), path+".condition")
		if err != nil {
			c.drop(path, err)
			continue
		}
		r := profiles.Route{Condition: cond, Retryable: pr.GetIsRetryable()}
		if len(pr.GetMetricsLabels()) > 0 {
			r.Labels = maps.Clone(pr.GetMetricsLabels())
		}
		if pr.Timeout != nil {
			// As prost's conversion: the value, normalized; a negative one
			// is only warned about (set_route_timeout).
			if d := pr.GetTimeout().AsDuration(); d < 0 {
				c.drop(path+".timeout", errAt(path+".timeout", "negative duration %v", d))
			} else {
				r.Timeout = d
			}
		}
		if r.Hedge, err = hedgeFromProto(pr.GetHedge(), path+".hedge"); err != nil {
			c.drop(path+".hedge", err)
		}
		for j, pc := range pr.GetResponseClasses() {
			cpath := fmt.Sprintf("%s.response_classes[%d]", path, j)
			if pc.GetCondition() == nil {
				c.drop(cpath, errAt(cpath+".condition", "required"))
				continue
			}
			cond, err := c.responseMatch(pc.GetCondition(), cpath+".condition")
			if err != nil {
				c.drop(cpath, err)
				continue
			}
			r.ResponseClasses = append(r.ResponseClasses, profiles.ResponseClass{Condition: cond, IsFailure: pc.GetIsFailure()})
		}
		p.Routes = append(p.Routes, r)
	}
	if b := m.GetRetryBudget(); b != nil {
		// A budget Linkerd's proxy would refuse is kept as sent: the router
		// decides what an invalid budget means (retries disabled). Only a
		// ttl the model cannot hold as Linkerd reads it is dropped here,
		// with the budget, as convert_retry_budget drops it.
		budget := &profiles.RetryBudget{RetryRatio: b.GetRetryRatio(), MinRetriesPerSecond: b.GetMinRetriesPerSecond()}
		c := protoConverter{dropped: &dropped}
		switch ttl := b.GetTtl(); {
		case ttl == nil: // no ttl: invalid, retries are disabled
		case ttl.GetSeconds() < 0 || ttl.GetNanos() < 0:
			c.drop("retry_budget", errAt("retry_budget.ttl", "negative duration"))
			budget = nil
		case ttl.GetNanos() > 1e9:
			c.drop("retry_budget", errAt("retry_budget.ttl", "nanos %d exceed 1s", ttl.GetNanos()))
			budget = nil
		default:
			budget.TTL = ttl.AsDuration()
		}
		p.RetryBudget = budget
	}
	for _, d := range m.GetDstOverrides() {
		p.DstOverrides = append(p.DstOverrides, endpoint.WeightedDst{Authority: d.GetAuthority(), Weight: d.GetWeight()})
	}
	if e := m.GetEndpoint(); e != nil {
		if ep, err := EndpointFromProto(e, nil, "endpoint"); err != nil {
			dropped = append(dropped, profiles.Dropped{Field: "endpoint", Err: err})
		} else {
			p.Endpoint = &ep
		}
	}
	return p, dropped
}

// protoConverter converts the conditions of one route, recording what it
// drops.
type protoConverter struct {
	route   string
	dropped *[]profiles.Dropped
}

func (c protoConverter) drop(field string, err error) {
	*c.dropped = append(*c.dropped, profiles.Dropped{Route: c.route, Field: field, Err: err})
}

// requestMatch converts m as convert_req_match does: a condition of an
// all or an any that does not convert is dropped; any other that does not
// is an error, which drops the part holding it.
func (c protoConverter) requestMatch(m *pb.RequestMatch, path string) (profiles.RequestMatch, error) {
	if m == nil {
		return nil, errAt(path, "null match")
	}
	switch v := m.GetMatch().(type) {
	case *pb.RequestMatch_All:
		return profiles.MatchAll(c.requestSeq(v.All.GetMatches(), path+".all")), nil
	case *pb.RequestMatch_Any:
		return profiles.MatchAny(c.requestSeq(v.Any.GetMatches(), path+".any")), nil
	case *pb.RequestMatch_Not:
		inner, err := c.requestMatch(v.Not, path+".not")
		if err != nil {
			return nil, err
		}
		return profiles.MatchNot{Match: inner}, nil
	case *pb.RequestMatch_Path:
		return profiles.PathRegex(v.Path.GetRegex()), nil
	case *pb.RequestMatch_Method:
		method, err := MethodFromProto(v.Method, path+".method")
		if err != nil {
			return nil, err
		}
		return profiles.Method(method), nil
	}
	return nil, errAt(path, "no match set")
}

func (c protoConverter) requestSeq(ms []*pb.RequestMatch, path string) []profiles.RequestMatch {
	out := make([]profiles.RequestMatch, 0, len(ms))
	for i, m := range ms {
		mpath := fmt.Sprintf("%s.matches[%d]", path, i)
		rm, err := c.requestMatch(m, mpath)
		if err != nil {
			c.drop(mpath, err)
			continue
		}
		out = append(out, rm)
	}
	return out
}

// MethodFromProto decodes a method; path names the field in errors.
func MethodFromProto(m *pb.HttpMethod, path string) (string, error) {
	switch v := m.GetType().(type) {
	case *pb.HttpMethod_Registered_:
		name, ok := pb.HttpMethod_Registered_name[int32(v.Registered)]
		if !ok {
			return "", errAt(path, "unknown registered method %d", v.Registered)
		}
		return name, nil
	case *pb.HttpMethod_Unregistered:
		if v.Unregistered == "" {
			return "", errAt(path, "empty method")
		}
		return v.Unregistered, nil
	}
	return "", errAt(path, "no method set")
}

// responseMatch converts m as convert_rsp_match does: a condition of an
// all or an any that does not convert is dropped, and an all or an any
// left empty does not convert.
func (c protoConverter) responseMatch(m *pb.ResponseMatch, path string) (profiles.ResponseMatch, error) {
	if m == nil {
		return nil, errAt(path, "null match")
	}
	switch v := m.GetMatch().(type) {
	case *pb.ResponseMatch_All:
		seq := c.responseSeq(v.All.GetMatches(), path+".all")
		if len(seq) == 0 {
			return nil, errAt(path+".all", "empty")
		}
		return profiles.ResponseAll(seq), nil
	case *pb.ResponseMatch_Any:
		seq := c.responseSeq(v.Any.GetMatches(), path+".any")
		if len(seq) == 0 {
			return nil, errAt(path+".any", "empty")
		}
		return profiles.ResponseAny(seq), nil
	case *pb.ResponseMatch_Not:
		inner, err := c.responseMatch(v.Not, path+".not")
		if err != nil {
			return nil, err
		}
		return profiles.ResponseNot{Match: inner}, nil
	case *pb.ResponseMatch_Status:
		return profiles.StatusRange{Min: v.Status.GetMin(), Max: v.Status.GetMax()}, nil
	}
	return nil, errAt(path, "no match set")
}

func (c protoConverter) responseSeq(ms []*pb.ResponseMatch, path string) []profiles.ResponseMatch {
	out := make([]profiles.ResponseMatch, 0, len(ms))
	for i, m := range ms {
		mpath := fmt.Sprintf("%s.matches[%d]", path, i)
		rm, err := c.responseMatch(m, mpath)
		if err != nil {
			c.drop(mpath, err)
			continue
		}
		out = append(out, rm)
	}
	return out
}

func durationFromProto(d *durationpb.Duration, path string) (time.Duration, error) {
	if err := d.CheckValid(); err != nil {
		return 0, errAt(path, "%v", err)
	}
	if d.AsDuration() < 0 {
		return 0, errAt(path, "negative duration %v", d.AsDuration())
	}
	return d.AsDuration(), nil
}

// AddrToProto encodes an address: IPv4 (and IPv4-mapped IPv6) as the
// big-endian value of its four bytes, IPv6 as two big-endian halves.
func AddrToProto(ap netip.AddrPort) *pb.TcpAddress {
	a := ap.Addr().Unmap()
	ip := &pb.IPAddress{}
	if a.Is4() {
		b := a.As4()
		ip.Ip = &pb.IPAddress_Ipv4{Ipv4: binary.BigEndian.Uint32(b[:])}
	} else {
		b := a.As16()
		ip.Ip = &pb.IPAddress_Ipv6{Ipv6: &pb.IPv6{
			First: binary.BigEndian.Uint64(b[:8]),
			Last:  binary.BigEndian.Uint64(b[8:]),
		}}
	}
	return &pb.TcpAddress{Ip: ip, Port: uint32(ap.Port())}
}

// AddrFromProto decodes an address; a port above 65535 is an error.
func AddrFromProto(m *pb.TcpAddress) (netip.AddrPort, error) {
	if m.GetPort() > 0xffff {
		return netip.AddrPort{}, fmt.Errorf("port %d is out of range", m.GetPort())
	}
	var a netip.Addr
	switch v := m.GetIp().GetIp().(type) {
	case *pb.IPAddress_Ipv4:
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], v.Ipv4)
		a = netip.AddrFrom4(b)
	case *pb.IPAddress_Ipv6:
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], v.Ipv6.GetFirst())
		binary.BigEndian.PutUint64(b[8:], v.Ipv6.GetLast())
		a = netip.AddrFrom16(b)
	default:
		return netip.AddrPort{}, errors.New("no IP address")
	}
	return netip.AddrPortFrom(a, uint16(m.GetPort())), nil
}

// EndpointToProto encodes an endpoint.
func EndpointToProto(e endpoint.Endpoint) *pb.WeightedAddr {
	w := &pb.WeightedAddr{
		Addr:         AddrToProto(e.Addr),
		Weight:       e.Weight,
		MetricLabels: maps.Clone(e.Labels),
	}
	if e.Identity != "" || e.ServerName != "" {
		id := &pb.TlsIdentity{}
		switch {
		case strings.Contains(e.Identity, "://"): // a URI: a SPIFFE identity
			id.Strategy = &pb.TlsIdentity_UriLikeIdentity_{UriLikeIdentity: &pb.TlsIdentity_UriLikeIdentity{Uri: e.Identity}}
		case e.Identity != "":
			id.Strategy = &pb.TlsIdentity_DnsLikeIdentity_{DnsLikeIdentity: &pb.TlsIdentity_DnsLikeIdentity{Name: e.Identity}}
		}
		if e.ServerName != "" {
			id.ServerName = &pb.TlsIdentity_DnsLikeIdentity{Name: e.ServerName}
		}
		w.TlsIdentity = id
	}
	if e.H2 || e.Opaque || e.OpaqueTransportPort != 0 {
		h := &pb.ProtocolHint{}
		switch {
		case e.H2:
			h.Protocol = &pb.ProtocolHint_H2_{H2: &pb.ProtocolHint_H2{}}
		case e.Opaque:
			h.Protocol = &pb.ProtocolHint_Opaque_{Opaque: &pb.ProtocolHint_Opaque{}}
		}
		if e.OpaqueTransportPort != 0 {
			h.OpaqueTransport = &pb.ProtocolHint_OpaqueTransport{InboundPort: e.OpaqueTransportPort}
		}
		w.ProtocolHint = h
	}
	if e.AuthorityOverride != "" {
		w.AuthorityOverride = &pb.AuthorityOverride{AuthorityOverride: e.AuthorityOverride}
	}
	return w
}

// EndpointFromProto decodes an endpoint of the Get stream or a policy's
// forward backend; setLabels are the labels of the set it came in, under
// its own. A zero weight becomes [endpoint.DefaultWeight]; labels beyond
// the bounds ([MaxEndpointLabels], [MaxLabelKeyLen], [MaxLabelValueLen])
// are an error naming path.metric_labels.
func EndpointFromProto(w *pb.WeightedAddr, setLabels map[string]string, path string) (endpoint.Endpoint, error) {
	addr, err := AddrFromProto(w.GetAddr())
	if err != nil {
		return endpoint.Endpoint{}, errAt(path+".addr", "%v", err)
	}
	e := endpoint.Endpoint{Addr: addr, Weight: w.GetWeight()}
	if e.Weight == 0 {
		e.Weight = endpoint.DefaultWeight
	}
	if n := len(setLabels) + len(w.GetMetricLabels()); n > 0 {
		if n > 2*MaxEndpointLabels {
			return endpoint.Endpoint{}, errAt(path+".metric_labels", "%d labels, more than %d", n, MaxEndpointLabels)
		}
		e.Labels = make(map[string]string, n)
		maps.Copy(e.Labels, setLabels)
		maps.Copy(e.Labels, w.GetMetricLabels())
		if err := checkLabels(e.Labels); err != nil {
			return endpoint.Endpoint{}, errAt(path+".metric_labels", "%v", err)
		}
	}
	if id := w.GetTlsIdentity(); id != nil {
		switch s := id.GetStrategy().(type) {
		case *pb.TlsIdentity_DnsLikeIdentity_:
			e.Identity = s.DnsLikeIdentity.GetName()
		case *pb.TlsIdentity_UriLikeIdentity_:
			e.Identity = s.UriLikeIdentity.GetUri()
		}
		e.ServerName = id.GetServerName().GetName()
	}
	if h := w.GetProtocolHint(); h != nil {
		switch h.GetProtocol().(type) {
		case *pb.ProtocolHint_H2_:
			e.H2 = true
		case *pb.ProtocolHint_Opaque_:
			e.Opaque = true
		}
		e.OpaqueTransportPort = h.GetOpaqueTransport().GetInboundPort()
	}
	e.AuthorityOverride = w.GetAuthorityOverride().GetAuthorityOverride()
	return e, nil
}
