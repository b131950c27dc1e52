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

// ProfileFromProto converts a profile from its wire form. A message that
// cannot describe a profile (a route without a condition, a match with no
// variant set, a bad duration or address) is an error naming the field,
// such as "routes[2].condition.all.matches[0]: no match set".
func ProfileFromProto(m *pb.DestinationProfile) (*profiles.Profile, error) {
	p := &profiles.Profile{
		FullyQualifiedName: m.GetFullyQualifiedName(),
		OpaqueProtocol:     m.GetOpaqueProtocol(),
	}
	if n := len(m.GetRoutes()); n > 0 {
		p.Routes = make([]profiles.Route, 0, n)
	}
	for i, pr := range m.GetRoutes() {
		path := fmt.Sprintf("routes[%d]", i)
		if pr == nil {
			return nil, errAt(path, "null route")
		}
		r := profiles.Route{Retryable: pr.GetIsRetryable()}
		if len(pr.GetMetricsLabels()) > 0 {
			r.Labels = maps.Clone(pr.GetMetricsLabels())
		}
		if pr.GetCondition() == nil {
			return nil, errAt(path+".condition", "required")
		}
		var err error
		if r.Condition, err = requestMatchFromProto(pr.GetCondition(), path+".condition"); err != nil {
			return nil, err
		}
		if pr.Timeout != nil {
			if r.Timeout, err = durationFromProto(pr.GetTimeout(), path+".timeout"); err != nil {
				return nil, err
			}
		}
		if r.Hedge, err = hedgeFromProto(pr.GetHedge(), path+".hedge"); err != nil {
			return nil, err
		}
		for j, pc := range pr.GetResponseClasses() {
			cpath := fmt.Sprintf("%s.response_classes[%d].condition", path, j)
			if pc.GetCondition() == nil {
				return nil, errAt(cpath, "required")
			}
			cond, err := responseMatchFromProto(pc.GetCondition(), cpath)
			if err != nil {
				return nil, err
			}
			r.ResponseClasses = append(r.ResponseClasses, profiles.ResponseClass{Condition: cond, IsFailure: pc.GetIsFailure()})
		}
		p.Routes = append(p.Routes, r)
	}
	if b := m.GetRetryBudget(); b != nil {
		// A budget Linkerd's proxy would refuse is kept as sent: the router
		// decides what an invalid budget means (retries disabled).
		budget := &profiles.RetryBudget{RetryRatio: b.GetRetryRatio(), MinRetriesPerSecond: b.GetMinRetriesPerSecond()}
		if b.Ttl != nil {
			ttl, err := durationFromProto(b.GetTtl(), "retry_budget.ttl")
			if err != nil {
				return nil, err
			}
			budget.TTL = ttl
		}
		p.RetryBudget = budget
	}
	for _, d := range m.GetDstOverrides() {
		p.DstOverrides = append(p.DstOverrides, endpoint.WeightedDst{Authority: d.GetAuthority(), Weight: d.GetWeight()})
	}
	if e := m.GetEndpoint(); e != nil {
		ep, err := EndpointFromProto(e, nil, "endpoint")
		if err != nil {
			return nil, err
		}
		p.Endpoint = &ep
	}
	return p, nil
}

func requestMatchFromProto(m *pb.RequestMatch, path string) (profiles.RequestMatch, error) {
	if m == nil {
		return nil, errAt(path, "null match")
	}
	switch v := m.GetMatch().(type) {
	case *pb.RequestMatch_All:
		seq, err := requestSeqFromProto(v.All.GetMatches(), path+".all")
		return profiles.MatchAll(seq), err
	case *pb.RequestMatch_Any:
		seq, err := requestSeqFromProto(v.Any.GetMatches(), path+".any")
		return profiles.MatchAny(seq), err
	case *pb.RequestMatch_Not:
		inner, err := requestMatchFromProto(v.Not, path+".not")
		if err != nil {
			return nil, err
		}
		return profiles.MatchNot{Match: inner}, nil
	case *pb.RequestMatch_Path:
		return profiles.PathRegex(v.Path.GetRegex()), nil
	case *pb.RequestMatch_Method:
		method, err := MethodFromProto(v.Method, path+".method")
		return profiles.Method(method), err
	}
	return nil, errAt(path, "no match set")
}

func requestSeqFromProto(ms []*pb.RequestMatch, path string) ([]profiles.RequestMatch, error) {
	out := make([]profiles.RequestMatch, len(ms))
	for i, m := range ms {
		var err error
		if out[i], err = requestMatchFromProto(m, fmt.Sprintf("%s.matches[%d]", path, i)); err != nil {
			return nil, err
		}
	}
	return out, nil
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

func responseMatchFromProto(m *pb.ResponseMatch, path string) (profiles.ResponseMatch, error) {
	if m == nil {
		return nil, errAt(path, "null match")
	}
	switch v := m.GetMatch().(type) {
	case *pb.ResponseMatch_All:
		seq, err := responseSeqFromProto(v.All.GetMatches(), path+".all")
		return profiles.ResponseAll(seq), err
	case *pb.ResponseMatch_Any:
		seq, err := responseSeqFromProto(v.Any.GetMatches(), path+".any")
		return profiles.ResponseAny(seq), err
	case *pb.ResponseMatch_Not:
		inner, err := responseMatchFromProto(v.Not, path+".not")
		if err != nil {
			return nil, err
		}
		return profiles.ResponseNot{Match: inner}, nil
	case *pb.ResponseMatch_Status:
		return profiles.StatusRange{Min: v.Status.GetMin(), Max: v.Status.GetMax()}, nil
	}
	return nil, errAt(path, "no match set")
}

func responseSeqFromProto(ms []*pb.ResponseMatch, path string) ([]profiles.ResponseMatch, error) {
	out := make([]profiles.ResponseMatch, len(ms))
	for i, m := range ms {
		var err error
		if out[i], err = responseMatchFromProto(m, fmt.Sprintf("%s.matches[%d]", path, i)); err != nil {
			return nil, err
		}
	}
	return out, nil
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
