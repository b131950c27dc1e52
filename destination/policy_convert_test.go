package destination_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/policy"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/grpcroutepb"
	"github.com/inmesh/inmesh/proxyapi/httproutepb"
	"github.com/inmesh/inmesh/proxyapi/opaqueroutepb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// newReq is a request with headers given as name, value pairs; a Host
// pair sets the request's host.
func newReq(method, target string, hdrs ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(hdrs); i += 2 {
		if http.CanonicalHeaderKey(hdrs[i]) == "Host" {
			r.Host = hdrs[i+1]
			continue
		}
		r.Header.Add(hdrs[i], hdrs[i+1])
	}
	return r
}

func resource(kind, name string) *pb.Metadata {
	return &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{Group: "core", Kind: kind, Name: name, Namespace: "ns", Port: 8080}}}
}

func queue() *outboundpb.Queue {
	return &outboundpb.Queue{Capacity: 100, FailfastTimeout: durationpb.New(3 * time.Second)}
}

func balancerBackend(name string) *outboundpb.Backend {
	return &outboundpb.Backend{
		Metadata: resource("Service", name),
		Kind: &outboundpb.Backend_Balancer{Balancer: &outboundpb.Backend_BalanceP2C{
			Discovery: &outboundpb.Backend_EndpointDiscovery{Kind: &outboundpb.Backend_EndpointDiscovery_Dst{Dst: &outboundpb.Backend_EndpointDiscovery_DestinationGet{Path: name + ".ns.svc.cluster.local:8080"}}},
			Load:      &outboundpb.Backend_BalanceP2C_PeakEwma_{PeakEwma: &outboundpb.Backend_BalanceP2C_PeakEwma{DefaultRtt: durationpb.New(30 * time.Millisecond), Decay: durationpb.New(10 * time.Second)}},
		}},
		Queue: queue(),
	}
}

func wireBackoff() *outboundpb.ExponentialBackoff {
	return &outboundpb.ExponentialBackoff{MinBackoff: durationpb.New(25 * time.Millisecond), MaxBackoff: durationpb.New(250 * time.Millisecond), JitterRatio: 1}
}

func hdrs(kv ...string) *pb.Headers {
	h := &pb.Headers{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Headers = append(h.Headers, &pb.Headers_Header{Name: kv[i], Value: []byte(kv[i+1])})
	}
	return h
}

// wireHTTPPolicy is an OutboundPolicy with one of everything an HTTP route
// can carry.
func wireHTTPPolicy() *outboundpb.OutboundPolicy {
	rule := &outboundpb.HttpRoute_Rule{
		Matches: []*httproutepb.HttpRouteMatch{{
			Path:        &httproutepb.PathMatch{Kind: &httproutepb.PathMatch_Prefix{Prefix: "/api"}},
			Headers:     []*httproutepb.HeaderMatch{{Name: "x-env", Value: &httproutepb.HeaderMatch_Exact{Exact: []byte("prod")}}},
			QueryParams: []*httproutepb.QueryParamMatch{{Name: "v", Value: &httproutepb.QueryParamMatch_Regex{Regex: "[0-9]+"}}},
			Method:      &pb.HttpMethod{Type: &pb.HttpMethod_Registered_{Registered: pb.HttpMethod_GET}},
		}},
		Filters: []*outboundpb.HttpRoute_Filter{
			{Kind: &outboundpb.HttpRoute_Filter_RequestHeaderModifier{RequestHeaderModifier: &httproutepb.RequestHeaderModifier{Add: hdrs("x-a", "1"), Set: hdrs("x-b", "2"), Remove: []string{"x-c"}}}},
			{Kind: &outboundpb.HttpRoute_Filter_ResponseHeaderModifier{ResponseHeaderModifier: &httproutepb.ResponseHeaderModifier{Set: hdrs("x-r", "3")}}},
		},
		Backends: &outboundpb.HttpRoute_Distribution{Kind: &outboundpb.HttpRoute_Distribution_RandomAvailable_{RandomAvailable: &outboundpb.HttpRoute_Distribution_RandomAvailable{
			Backends: []*outboundpb.HttpRoute_WeightedRouteBackend{
				{Weight: 90, Backend: &outboundpb.HttpRoute_RouteBackend{Backend: balancerBackend("books")}},
				{Weight: 10, Backend: &outboundpb.HttpRoute_RouteBackend{
					Backend: &outboundpb.Backend{
						Metadata: resource("Service", "books-v2"),
						Kind: &outboundpb.Backend_Forward{Forward: &pb.WeightedAddr{
							Addr:         &pb.TcpAddress{Ip: &pb.IPAddress{Ip: &pb.IPAddress_Ipv4{Ipv4: 0x7f000001}}, Port: 9000},
							Weight:       5,
							TlsIdentity:  &pb.TlsIdentity{Strategy: &pb.TlsIdentity_DnsLikeIdentity_{DnsLikeIdentity: &pb.TlsIdentity_DnsLikeIdentity{Name: "books.ns.serviceaccount.identity.linkerd.cluster.local"}}},
							ProtocolHint: &pb.ProtocolHint{Protocol: &pb.ProtocolHint_H2_{H2: &pb.ProtocolHint_H2{}}},
						}},
						Queue: queue(),
					},
					Filters: []*outboundpb.HttpRoute_Filter{{Kind: &outboundpb.HttpRoute_Filter_FailureInjector{FailureInjector: &httproutepb.HttpFailureInjector{Status: 503, Message: "canary down", Ratio: &httproutepb.Ratio{Numerator: 1, Denominator: 4}}}}},
				}},
			},
		}}},
		Timeouts: &httproutepb.Timeouts{Request: durationpb.New(10 * time.Second), Response: durationpb.New(5 * time.Second)},
		Retry: &outboundpb.HttpRoute_Retry{
			MaxRetries: 3, MaxRequestBytes: 1024, Timeout: durationpb.New(time.Second), Backoff: wireBackoff(),
			Conditions: &outboundpb.HttpRoute_Retry_Conditions{StatusRanges: []*outboundpb.HttpRoute_Retry_Conditions_StatusRange{{Start: 502, End: 504}}},
		},
		AllowL5DRequestHeaders: true,
	}
	redirect := &outboundpb.HttpRoute_Rule{
		Matches: []*httproutepb.HttpRouteMatch{{Path: &httproutepb.PathMatch{Kind: &httproutepb.PathMatch_Exact{Exact: "/old"}}}},
		Filters: []*outboundpb.HttpRoute_Filter{{Kind: &outboundpb.HttpRoute_Filter_Redirect{Redirect: &httproutepb.RequestRedirect{
			Scheme: &pb.Scheme{Type: &pb.Scheme_Registered_{Registered: pb.Scheme_HTTPS}},
			Host:   "new.example.com",
			Path:   &httproutepb.PathModifier{Replace: &httproutepb.PathModifier_Full{Full: "/new"}},
		}}}},
		Backends: &outboundpb.HttpRoute_Distribution{Kind: &outboundpb.HttpRoute_Distribution_Empty_{Empty: &outboundpb.HttpRoute_Distribution_Empty{}}},
	}
	route := &outboundpb.HttpRoute{
		Metadata: &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Name: "books-route", Namespace: "ns"}}},
		Hosts:    []*httproutepb.HostMatch{{Match: &httproutepb.HostMatch_Suffix_{Suffix: &httproutepb.HostMatch_Suffix{ReverseLabels: []string{"local", "cluster"}}}}},
		Rules:    []*outboundpb.HttpRoute_Rule{rule, redirect},
	}
	http1 := &outboundpb.ProxyProtocol_Http1{
		Routes: []*outboundpb.HttpRoute{route},
		FailureAccrual: &outboundpb.FailureAccrual{
			Kind:     &outboundpb.FailureAccrual_ConsecutiveFailures_{ConsecutiveFailures: &outboundpb.FailureAccrual_ConsecutiveFailures{MaxFailures: 7, Backoff: &outboundpb.ExponentialBackoff{MinBackoff: durationpb.New(time.Second), MaxBackoff: durationpb.New(time.Minute), JitterRatio: 0.5}}},
			Ejection: &outboundpb.EjectionConfig{MinReadyEndpoints: 1},
		},
	}
	return &outboundpb.OutboundPolicy{
		Metadata: resource("Service", "books"),
		Protocol: &outboundpb.ProxyProtocol{Kind: &outboundpb.ProxyProtocol_Detect_{Detect: &outboundpb.ProxyProtocol_Detect{
			Timeout: durationpb.New(10 * time.Second),
			Http1:   http1,
			Http2:   &outboundpb.ProxyProtocol_Http2{Routes: []*outboundpb.HttpRoute{route}},
			Opaque:  &outboundpb.ProxyProtocol_Opaque{},
		}}},
	}
}

func TestPolicyFromProtoHTTP(t *testing.T) {
	// Through the wire, as a client receives it.
	b, err := proto.Marshal(wireHTTPPolicy())
	require.NoError(t, err)
	var m outboundpb.OutboundPolicy
	require.NoError(t, proto.Unmarshal(b, &m))
	p, err := destination.DecodePolicy(&m)
	require.NoError(t, err)

	assert.Equal(t, policy.Metadata{Group: "core", Kind: "Service", Name: "books", Namespace: "ns", Port: 8080}, p.Parent)
	assert.Equal(t, policy.ProtocolDetect, p.Protocol)
	assert.Equal(t, 10*time.Second, p.DetectTimeout)
	require.Len(t, p.HTTP1.Routes, 1)
	require.Len(t, p.HTTP2.Routes, 1)
	assert.Equal(t, &policy.FailureAccrual{Consecutive: &policy.ConsecutiveFailures{MaxFailures: 7, Backoff: backoff.Policy{Min: time.Second, Max: time.Minute, Jitter: 0.5}}, MinReadyEndpoints: 1}, p.HTTP1.FailureAccrual)
	assert.Nil(t, p.HTTP2.FailureAccrual)

	r := p.HTTP1.Routes[0]
	assert.Equal(t, policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Name: "books-route", Namespace: "ns"}, r.Meta)
	assert.Equal(t, []policy.HostMatch{{Suffix: true, ReverseLabels: []string{"local", "cluster"}}}, r.Hosts)
	require.Len(t, r.Rules, 2)
	rule := r.Rules[0]
	assert.Equal(t, []policy.HTTPRouteMatch{{
		Path:        &policy.PathMatch{Kind: policy.PathPrefix, Value: "/api"},
		Headers:     []policy.HeaderMatch{{Name: "x-env", Value: "prod"}},
		QueryParams: []policy.QueryParamMatch{{Name: "v", Value: "[0-9]+", Regex: true}},
		Method:      "GET",
	}}, rule.Matches)
	assert.Equal(t, []policy.Filter{
		{RequestHeaders: &policy.HeaderModifier{Add: []policy.Header{{Name: "x-a", Value: "1"}}, Set: []policy.Header{{Name: "x-b", Value: "2"}}, Remove: []string{"x-c"}}},
		{ResponseHeaders: &policy.HeaderModifier{Set: []policy.Header{{Name: "x-r", Value: "3"}}}},
	}, rule.Filters)
	assert.Equal(t, policy.DistributionRandomAvailable, rule.Backends.Kind)
	require.Len(t, rule.Backends.Backends, 2)
	bal := rule.Backends.Backends[0]
	assert.Equal(t, uint32(90), bal.Weight)
	assert.Equal(t, &policy.Balancer{Authority: "books.ns.svc.cluster.local:8080", DefaultRTT: 30 * time.Millisecond, Decay: 10 * time.Second}, bal.Backend.Balancer)
	assert.Equal(t, policy.Queue{Capacity: 100, FailFastTimeout: 3 * time.Second}, bal.Backend.Queue)
	fwd := rule.Backends.Backends[1]
	assert.Equal(t, uint32(10), fwd.Weight)
	assert.Equal(t, &endpoint.Endpoint{
		Addr: netip.MustParseAddrPort("127.0.0.1:9000"), Weight: 5,
		Identity: "books.ns.serviceaccount.identity.linkerd.cluster.local", H2: true,
	}, fwd.Backend.Forward)
	assert.Equal(t, []policy.Filter{{FailureInjector: &policy.FailureInjector{Status: 503, Message: "canary down", Ratio: policy.Ratio{Numerator: 1, Denominator: 4}}}}, fwd.Filters)
	assert.Equal(t, policy.Timeouts{Request: 10 * time.Second, Response: 5 * time.Second}, rule.Timeouts)
	assert.Equal(t, &policy.Retry{
		MaxRetries: 3, MaxRequestBytes: 1024, Timeout: time.Second,
		StatusRanges: []policy.StatusRange{{Start: 502, End: 504}},
		Backoff:      &backoff.Policy{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond, Jitter: 1},
	}, rule.Retry)
	assert.True(t, rule.AllowL5dRequestHeaders)

	rd := r.Rules[1]
	assert.Equal(t, policy.Distribution{}, rd.Backends)
	assert.Equal(t, &policy.Redirect{Scheme: "https", Host: "new.example.com", Path: &policy.PathModifier{Full: "/new"}}, rd.Filters[0].Redirect)
	assert.Equal(t, 301, rd.Filters[0].Redirect.StatusCode())

	// It compiles, and routes.
	table, err := policy.Compile(p, policy.Options{})
	require.NoError(t, err)
	got, match := table.Select(newReq("GET", "http://books.ns.svc.cluster.local:8080/api/x?v=2", "x-env", "prod"))
	require.NotNil(t, got, "%v", match)
	assert.Equal(t, 0, got.RuleIndex)
	assert.Equal(t, p.Parent, got.Parent)
	assert.Equal(t, "books-route", got.Meta.Name)
	assert.Equal(t, rule.Retry, got.Retry)
	assert.Same(t, p.HTTP1.FailureAccrual, table.For(newReq("GET", "/")).FailureAccrual())
	got, _ = table.Select(newReq("GET", "http://books.ns.svc.cluster.local/old"))
	require.NotNil(t, got)
	assert.Equal(t, 1, got.RuleIndex)
	got, _ = table.Select(newReq("GET", "http://books.example.com/old"))
	assert.Nil(t, got, "the route's hosts do not match")
}

// The default policy of a Service sends its opaque traffic to the backend
// of its HTTP route: the decoded policy keeps one copy of that backend
// list, and an opaque backend that differs keeps its own.
func TestPolicyFromProtoSharesOpaqueBackends(t *testing.T) {
	svc := func(name string) policy.Backend {
		return policy.Backend{Meta: policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: name, Port: 8080},
			Queue:    policy.Queue{Capacity: 100, FailFastTimeout: 3 * time.Second},
			Balancer: &policy.Balancer{Authority: name + ".ns.svc.cluster.local:8080", DefaultRTT: 30 * time.Millisecond, Decay: 10 * time.Second}}
	}
	for _, tc := range []struct {
		name   string
		opaque policy.Backend
		shared bool
	}{
		{"the Service's own backend", svc("books"), true},
		{"another Service", svc("authors"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			routes := policy.HTTPProtocol{Routes: []policy.HTTPRoute{policy.DefaultHTTPRoute(svc("books"), nil, policy.Timeouts{})}}
			want := &policy.Policy{Parent: policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "books", Port: 8080},
				Protocol: policy.ProtocolDetect, DetectTimeout: 10 * time.Second, HTTP1: routes, HTTP2: routes,
				Opaque: policy.OpaqueProtocol{Routes: []policy.OpaqueRoute{policy.DefaultOpaqueRoute(tc.opaque)}}}
			got, err := destination.PolicyFromProto(destination.PolicyToProto(want))
			require.NoError(t, err)
			assert.Equal(t, want, got, "the policy decodes as it was encoded")
			httpBackends := got.HTTP1.Routes[0].Rules[0].Backends.Backends
			opaqueBackends := got.Opaque.Routes[0].Backends.Backends
			if tc.shared {
				assert.Same(t, &httpBackends[0], &opaqueBackends[0])
			} else {
				assert.NotSame(t, &httpBackends[0], &opaqueBackends[0])
			}
		})
	}
}

// A detected protocol whose HTTP/1 and HTTP/2 routes are equal (Linkerd's
// default policies) decodes them once and shares the copy; any difference
// in the routes or the failure accrual decodes each on its own.
func TestPolicyFromProtoSharesEqualHTTPVersions(t *testing.T) {
	detect := func(m *outboundpb.OutboundPolicy) *outboundpb.ProxyProtocol_Detect {
		return m.GetProtocol().GetDetect()
	}
	for _, tc := range []struct {
		name   string
		edit   func(d *outboundpb.ProxyProtocol_Detect)
		shared bool
	}{
		{"equal routes and accrual", func(d *outboundpb.ProxyProtocol_Detect) {
			d.Http2.FailureAccrual = proto.Clone(d.Http1.FailureAccrual).(*outboundpb.FailureAccrual)
			d.Http2.Routes = []*outboundpb.HttpRoute{proto.Clone(d.Http1.Routes[0]).(*outboundpb.HttpRoute)}
		}, true},
		{"equal routes, no accrual", func(d *outboundpb.ProxyProtocol_Detect) { d.Http1.FailureAccrual = nil }, true},
		{"accrual differs", func(*outboundpb.ProxyProtocol_Detect) {}, false},
		{"a route differs", func(d *outboundpb.ProxyProtocol_Detect) {
			d.Http1.FailureAccrual = nil
			r := proto.Clone(d.Http1.Routes[0]).(*outboundpb.HttpRoute)
			r.Metadata = &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Name: "books-h2", Namespace: "ns"}}}
			d.Http2.Routes = []*outboundpb.HttpRoute{r}
		}, false},
		{"more routes on HTTP/2", func(d *outboundpb.ProxyProtocol_Detect) {
			d.Http1.FailureAccrual = nil
			d.Http2.Routes = append(d.Http2.Routes, d.Http1.Routes[0])
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := wireHTTPPolicy()
			tc.edit(detect(m))
			p, err := destination.DecodePolicy(m)
			require.NoError(t, err)
			d := detect(m)
			want2, err := destination.DecodePolicy(&outboundpb.OutboundPolicy{Metadata: m.Metadata, Protocol: &outboundpb.ProxyProtocol{
				Kind: &outboundpb.ProxyProtocol_Http2_{Http2: d.Http2}}})
			require.NoError(t, err)
			assert.Equal(t, want2.HTTP2, p.HTTP2, "HTTP/2 decodes as on its own")
			require.NotEmpty(t, p.HTTP2.Routes)
			if tc.shared {
				assert.Same(t, &p.HTTP1.Routes[0], &p.HTTP2.Routes[0])
			} else {
				assert.NotSame(t, &p.HTTP1.Routes[0], &p.HTTP2.Routes[0])
			}
			table, err := policy.Compile(p, policy.Options{})
			require.NoError(t, err)
			for _, major := range []int{1, 2} {
				req := newReq("GET", "http://books.ns.svc.cluster.local:8080/old")
				req.ProtoMajor = major
				got, _ := table.Select(req)
				require.NotNil(t, got, "HTTP/%d", major)
				assert.Equal(t, 1, got.RuleIndex)
			}
		})
	}
}

func TestPolicyFromProtoGRPC(t *testing.T) {
	m := &outboundpb.OutboundPolicy{
		Metadata: &pb.Metadata{Kind: &pb.Metadata_Default{Default: "egress"}},
		Protocol: &outboundpb.ProxyProtocol{Kind: &outboundpb.ProxyProtocol_Grpc_{Grpc: &outboundpb.ProxyProtocol_Grpc{
			Routes: []*outboundpb.GrpcRoute{{
				Metadata: &pb.Metadata{Kind: &pb.Metadata_Default{Default: "grpc"}},
				Rules: []*outboundpb.GrpcRoute_Rule{{
					Matches: []*grpcroutepb.GrpcRouteMatch{{Rpc: &grpcroutepb.GrpcRpcMatch{Service: "pkg.S"}, Headers: []*httproutepb.HeaderMatch{{Name: "x", Value: &httproutepb.HeaderMatch_Regex{Regex: "a.*"}}}}},
					Filters: []*outboundpb.GrpcRoute_Filter{{Kind: &outboundpb.GrpcRoute_Filter_FailureInjector{FailureInjector: &grpcroutepb.GrpcFailureInjector{Code: 14, Message: "nope"}}}},
					Backends: &outboundpb.GrpcRoute_Distribution{Kind: &outboundpb.GrpcRoute_Distribution_FirstAvailable_{FirstAvailable: &outboundpb.GrpcRoute_Distribution_FirstAvailable{
						Backends: []*outboundpb.GrpcRoute_RouteBackend{{Backend: &outboundpb.Backend{
							Metadata: resource("Service", "s"),
							Kind: &outboundpb.Backend_Balancer{Balancer: &outboundpb.Backend_BalanceP2C{
								Discovery: &outboundpb.Backend_EndpointDiscovery{Kind: &outboundpb.Backend_EndpointDiscovery_Dst{Dst: &outboundpb.Backend_EndpointDiscovery_DestinationGet{Path: "s:80"}}},
								Load:      &outboundpb.Backend_BalanceP2C_PenaltyPeakEwma_{PenaltyPeakEwma: &outboundpb.Backend_BalanceP2C_PenaltyPeakEwma{Penalty: durationpb.New(time.Second)}},
							}},
							Queue: queue(),
						}}},
					}}},
					Retry:          &outboundpb.GrpcRoute_Retry{Conditions: &outboundpb.GrpcRoute_Retry_Conditions{Unavailable: true, Cancelled: true}},
					RequestTimeout: durationpb.New(2 * time.Second),
				}},
			}},
			FailureAccrual: &outboundpb.FailureAccrual{Kind: &outboundpb.FailureAccrual_Unified_{Unified: &outboundpb.FailureAccrual_Unified{
				SuccessRateThreshold: 0.8, MinRequests: 5, MaxConsecutiveFailures: 7, Backoff: wireBackoff(),
			}}},
		}}},
	}
	p, err := destination.DecodePolicy(m)
	require.NoError(t, err)
	assert.Equal(t, policy.DefaultMetadata("egress"), p.Parent)
	assert.True(t, p.Parent.IsDefault())
	assert.Equal(t, policy.ProtocolGRPC, p.Protocol)
	rule := p.GRPC.Routes[0].Rules[0]
	assert.Equal(t, []policy.GRPCRouteMatch{{Service: "pkg.S", Headers: []policy.HeaderMatch{{Name: "x", Value: "a.*", Regex: true}}}}, rule.Matches)
	assert.Equal(t, &policy.GRPCFailureInjector{Code: codes.Unavailable, Message: "nope"}, rule.Filters[0].GRPCFailureInjector)
	assert.Equal(t, []codes.Code{codes.Canceled, codes.Unavailable}, rule.Retry.GRPCCodes)
	assert.Equal(t, 2*time.Second, rule.Timeouts.Request, "the legacy requestTimeout fills in the request timeout")
	assert.Equal(t, &policy.Balancer{Authority: "s:80", DefaultRTT: 30 * time.Millisecond, Decay: 10 * time.Second,
		Penalty: &policy.LoadPenalty{Penalty: time.Second, MaxRetryAfter: 300 * time.Second, PenaltyDecay: 10 * time.Second}}, rule.Backends.Backends[0].Backend.Balancer)
	assert.Equal(t, &policy.UnifiedAccrual{SuccessRateThreshold: 0.8, Window: 10 * time.Second, MinRequests: 5, MaxConsecutiveFailures: 7,
		Backoff: backoff.Policy{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond, Jitter: 1}}, p.GRPC.FailureAccrual.Unified)

	table, err := policy.Compile(p, policy.Options{})
	require.NoError(t, err)
	got, _ := table.Select(newReq("POST", "/pkg.S/Get", "x", "abc"))
	require.NotNil(t, got)
	assert.True(t, got.GRPC)
	assert.Equal(t, policy.DefaultMetadata("grpc"), got.Meta)
	got, _ = table.Select(newReq("POST", "/pkg.S/Get", "x", "b"))
	assert.Nil(t, got)
}

func TestPolicyFromProtoErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*outboundpb.OutboundPolicy)
		want   string
	}{
		{"no metadata", func(m *outboundpb.OutboundPolicy) { m.Metadata = nil }, "metadata: required"},
		{"empty resource name", func(m *outboundpb.OutboundPolicy) { m.Metadata.GetResource().Name = "" }, "metadata.resource.name: must not be empty"},
		{"no protocol kind", func(m *outboundpb.OutboundPolicy) { m.Protocol.Kind = nil }, "protocol.kind: no protocol set"},
		{"detect without timeout", func(m *outboundpb.OutboundPolicy) { m.Protocol.GetDetect().Timeout = nil }, "protocol.detect.timeout: required"},
		{"route without metadata", func(m *outboundpb.OutboundPolicy) { m.Protocol.GetDetect().Http1.Routes[0].Metadata = nil },
			"protocol.detect.http1.routes[0].metadata: required"},
		{"host match unset", func(m *outboundpb.OutboundPolicy) { m.Protocol.GetDetect().Http1.Routes[0].Hosts[0].Match = nil },
			"protocol.detect.http1.routes[0].hosts[0].match: no host match set"},
		{"no distribution", func(m *outboundpb.OutboundPolicy) { m.Protocol.GetDetect().Http1.Routes[0].Rules[1].Backends = nil },
			"protocol.detect.http1.routes[0].rules[1].backends: required"},
		{"empty first-available", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[1].Backends.Kind = &outboundpb.HttpRoute_Distribution_FirstAvailable_{FirstAvailable: &outboundpb.HttpRoute_Distribution_FirstAvailable{}}
		}, "protocol.detect.http1.routes[0].rules[1].backends.first_available.backends: a first_available distribution may not be empty"},
		{"path kind unset", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Matches[0].Path.Kind = nil
		}, "protocol.detect.http1.routes[0].rules[0].matches[0].path.kind: no path match set"},
		{"header value unset", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Matches[0].Headers[0].Value = nil
		}, "protocol.detect.http1.routes[0].rules[0].matches[0].headers[0].value: no value match set"},
		{"filter kind unset", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Filters[1].Kind = nil
		},
			"protocol.detect.http1.routes[0].rules[0].filters[1].kind: no filter set"},
		{"retry without conditions", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Retry.Conditions = nil
		},
			"protocol.detect.http1.routes[0].rules[0].retry.conditions: required"},
		{"retry limit beyond u16", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Retry.MaxRetries = 70000
		},
			"protocol.detect.http1.routes[0].rules[0].retry.max_retries: 70000 is out of range"},
		{"backoff max below min", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Retry.Backoff.MaxBackoff = durationpb.New(time.Millisecond)
		}, "protocol.detect.http1.routes[0].rules[0].retry.backoff: backoff: min 25ms is greater than max 1ms"},
		{"queue missing", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Backends.GetRandomAvailable().Backends[0].Backend.Backend.Queue = nil
		}, "protocol.detect.http1.routes[0].rules[0].backends.random_available.backends[0].backend.backend.queue: required"},
		{"balancer without load", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Backends.GetRandomAvailable().Backends[0].Backend.Backend.GetBalancer().Load = nil
		}, "protocol.detect.http1.routes[0].rules[0].backends.random_available.backends[0].backend.backend.balancer.load: missing balancer load"},
		{"forward without IP", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Backends.GetRandomAvailable().Backends[1].Backend.Backend.GetForward().Addr = nil
		}, "protocol.detect.http1.routes[0].rules[0].backends.random_available.backends[1].backend.backend.forward.addr: no IP address"},
		{"forward beyond the label bounds", func(m *outboundpb.OutboundPolicy) {
			fwd := m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Backends.GetRandomAvailable().Backends[1].Backend.Backend.GetForward()
			fwd.MetricLabels = map[string]string{}
			for i := range destination.MaxEndpointLabels + 1 {
				fwd.MetricLabels[fmt.Sprintf("l%d", i)] = "v"
			}
		}, "protocol.detect.http1.routes[0].rules[0].backends.random_available.backends[1].backend.backend.forward.metric_labels: 33 labels, more than 32"},
		{"forward label value too long", func(m *outboundpb.OutboundPolicy) {
			fwd := m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Backends.GetRandomAvailable().Backends[1].Backend.Backend.GetForward()
			fwd.MetricLabels = map[string]string{"pod": strings.Repeat("x", destination.MaxLabelValueLen+1)}
		}, "backends[1].backend.backend.forward.metric_labels: label pod: value is 254 bytes, more than 253"},
		{"bad ratio on a backend filter", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Backends.GetRandomAvailable().Backends[1].Backend.Filters[0].GetFailureInjector().Ratio.Denominator = 0
		}, "protocol.detect.http1.routes[0].rules[0].backends.random_available.backends[1].backend.filters[0].failure_injector.ratio.denominator: must be positive"},
		{"failure accrual kind unset", func(m *outboundpb.OutboundPolicy) { m.Protocol.GetDetect().Http1.FailureAccrual.Kind = nil },
			"protocol.detect.http1.failure_accrual.kind: no failure accrual set"},
		{"bad duration", func(m *outboundpb.OutboundPolicy) {
			m.Protocol.GetDetect().Http1.Routes[0].Rules[0].Timeouts.Idle = &durationpb.Duration{Seconds: 1, Nanos: 2e9}
		}, "protocol.detect.http1.routes[0].rules[0].timeouts.idle: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := wireHTTPPolicy()
			tt.modify(m)
			_, err := destination.DecodePolicy(m)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	_, err := destination.DecodePolicy(nil)
	assert.EqualError(t, err, "policy: null")
}

// An opaque route whose rule's first filter is Forbidden refuses its
// connections, as Linkerd's proxy reads it
// (linkerd/app/outbound/src/opaq/logical/route/filters.rs: the first
// filter alone applies); the model encodes it back as Linkerd's policy
// controller sends it (policy-controller/grpc/src/outbound.rs
// undefined_port), and only an opaque policy's route forbids a target.
func TestOpaqueForbiddenRoute(t *testing.T) {
	forbidden := &outboundpb.OpaqueRoute_Filter{Kind: &outboundpb.OpaqueRoute_Filter_Forbidden{Forbidden: &opaqueroutepb.Forbidden{}}}
	invalid := &outboundpb.OpaqueRoute_Filter{Kind: &outboundpb.OpaqueRoute_Filter_Invalid{Invalid: &opaqueroutepb.Invalid{Message: "bad"}}}
	opaque := func(filters ...*outboundpb.OpaqueRoute_Filter) *outboundpb.ProxyProtocol_Opaque {
		return &outboundpb.ProxyProtocol_Opaque{Routes: []*outboundpb.OpaqueRoute{{
			Metadata: &pb.Metadata{Kind: &pb.Metadata_Default{Default: "undefined-port"}},
			Rules: []*outboundpb.OpaqueRoute_Rule{{
				Backends: &outboundpb.OpaqueRoute_Distribution{Kind: &outboundpb.OpaqueRoute_Distribution_Empty_{Empty: &outboundpb.OpaqueRoute_Distribution_Empty{}}},
				Filters:  filters,
			}},
		}}}
	}
	parent := &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{Group: "core", Kind: "Service", Name: "books", Namespace: "default", Port: 7001}}}
	for _, tc := range []struct {
		name          string
		protocol      *outboundpb.ProxyProtocol
		wantForbidden bool
	}{
		{"an opaque policy whose route is forbidden", &outboundpb.ProxyProtocol{Kind: &outboundpb.ProxyProtocol_Opaque_{Opaque: opaque(forbidden)}}, true},
		{"the first filter alone applies", &outboundpb.ProxyProtocol{Kind: &outboundpb.ProxyProtocol_Opaque_{Opaque: opaque(invalid, forbidden)}}, false},
		{"an opaque route without filters", &outboundpb.ProxyProtocol{Kind: &outboundpb.ProxyProtocol_Opaque_{Opaque: opaque()}}, false},
		{"a detected protocol's opaque route leaves HTTP alone", &outboundpb.ProxyProtocol{Kind: &outboundpb.ProxyProtocol_Detect_{Detect: &outboundpb.ProxyProtocol_Detect{
			Timeout: durationpb.New(time.Second), Opaque: opaque(forbidden), Http1: &outboundpb.ProxyProtocol_Http1{}, Http2: &outboundpb.ProxyProtocol_Http2{}}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &outboundpb.OutboundPolicy{Metadata: parent, Protocol: tc.protocol}
			p, err := destination.PolicyFromProto(m)
			require.NoError(t, err)
			table, err := policy.Compile(p, policy.Options{})
			require.NoError(t, err)
			assert.Equal(t, tc.wantForbidden, table.Forbidden())
			if tc.wantForbidden {
				assert.True(t, proto.Equal(m, destination.PolicyToProto(p)), "encoded back: %v", destination.PolicyToProto(p))
			}
		})
	}
}
