package destination_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"

	"github.com/inmesh/inmesh/policy"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/grpcroutepb"
	"github.com/inmesh/inmesh/proxyapi/httproutepb"
	"github.com/inmesh/inmesh/proxyapi/opaqueroutepb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/inmesh/inmesh/proxyapi/tlsroutepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/durationpb"
)

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	require.NoError(t, err)
	return b
}

// A oneof variant set to its zero value is still sent, and so tells "prefix
// empty" from "no path kind" and "empty distribution" from "no distribution".
func TestPolicyWireOneofZeroValuesAreSent(t *testing.T) {
	assert.Equal(t, []byte{0x12, 0x00}, marshal(t, &httproutepb.PathMatch{Kind: &httproutepb.PathMatch_Prefix{}}))
	assert.Equal(t, []byte{0x0a, 0x00}, marshal(t, &httproutepb.HostMatch{Match: &httproutepb.HostMatch_Exact{}}))
	assert.Empty(t, marshal(t, &httproutepb.PathMatch{}))
	empty := &outboundpb.HttpRoute_Distribution{Kind: &outboundpb.HttpRoute_Distribution_Empty_{Empty: &outboundpb.HttpRoute_Distribution_Empty{}}}
	assert.Equal(t, []byte{0x0a, 0x00}, marshal(t, empty))

	// Decoded: the empty distribution converts, the unset one is refused.
	var back outboundpb.HttpRoute_Distribution
	require.NoError(t, proto.Unmarshal([]byte{0x0a, 0x00}, &back))
	d, err := destination.DecodeHTTPDistribution(&back, "backends")
	require.NoError(t, err)
	assert.Equal(t, policy.DistributionEmpty, d.Kind)
	_, err = destination.DecodeHTTPDistribution(&outboundpb.HttpRoute_Distribution{}, "backends")
	assert.EqualError(t, err, "backends.kind: missing distribution kind")

	// The backend kind oneof: forward is field 2, balancer field 3.
	b := marshal(t, &outboundpb.Backend{Kind: &outboundpb.Backend_Balancer{Balancer: &outboundpb.Backend_BalanceP2C{}}})
	assert.Equal(t, []byte{0x1a, 0x00}, b)
	b = marshal(t, &outboundpb.TrafficSpec{Target: &outboundpb.TrafficSpec_Authority{Authority: "a:80"}})
	assert.Equal(t, []byte{0x1a, 0x04, 'a', ':', '8', '0'}, b)
}

// GET is the zero value of the method enum: it is sent because it is in a
// oneof, and decodes to GET, not to "any method".
func TestPolicyWireMethodGETIsTheZeroEnum(t *testing.T) {
	get := &pb.HttpMethod{Type: &pb.HttpMethod_Registered_{Registered: pb.HttpMethod_GET}}
	b := marshal(t, &httproutepb.HttpRouteMatch{Method: get})
	assert.Equal(t, []byte{0x22, 0x02, 0x08, 0x00}, b)
	var back httproutepb.HttpRouteMatch
	require.NoError(t, proto.Unmarshal(b, &back))
	m, err := destination.DecodeHTTPMatch(&back, "m")
	require.NoError(t, err)
	assert.Equal(t, "GET", m.Method)

	m, err = destination.DecodeHTTPMatch(&httproutepb.HttpRouteMatch{}, "m")
	require.NoError(t, err)
	assert.Empty(t, m.Method, "no method field: any method")
	_, err = destination.DecodeHTTPMatch(&httproutepb.HttpRouteMatch{Method: &pb.HttpMethod{}}, "matches[0]")
	assert.EqualError(t, err, "matches[0].method.type: no method set")
}

// The gRPC retry conditions are numbered by status code, and field 4 keeps
// Linkerd's spelling.
func TestPolicyWireGRPCRetryConditions(t *testing.T) {
	c := &outboundpb.GrpcRoute_Retry_Conditions{Cancelled: true, DeadineExceeded: true, ResourceExhausted: true, Internal: true, Unavailable: true}
	assert.Equal(t, []byte{0x08, 0x01, 0x20, 0x01, 0x40, 0x01, 0x68, 0x01, 0x70, 0x01}, marshal(t, c))
	fd := c.ProtoReflect().Descriptor().Fields().ByNumber(4)
	assert.Equal(t, protoreflect.Name("deadine_exceeded"), fd.Name())

	var back outboundpb.GrpcRoute_Retry_Conditions
	require.NoError(t, proto.Unmarshal([]byte{0x20, 0x01}, &back))
	rule, err := destination.DecodeGRPCRule(&outboundpb.GrpcRoute_Rule{
		Backends: &outboundpb.GrpcRoute_Distribution{Kind: &outboundpb.GrpcRoute_Distribution_Empty_{Empty: &outboundpb.GrpcRoute_Distribution_Empty{}}},
		Retry:    &outboundpb.GrpcRoute_Retry{Conditions: &back},
	}, "r")
	require.NoError(t, err)
	assert.Equal(t, []codes.Code{codes.DeadlineExceeded}, rule.Retry.GRPCCodes)
	assert.True(t, rule.Retry.RetryableCode(codes.DeadlineExceeded))
	assert.False(t, rule.Retry.RetryableCode(codes.Unavailable))
}

func TestPolicyWireDurations(t *testing.T) {
	to := &httproutepb.Timeouts{Response: durationpb.New(1500 * time.Millisecond), Idle: durationpb.New(time.Minute)}
	var want []byte
	want = protowire.AppendTag(want, 1, protowire.BytesType)
	want = protowire.AppendBytes(want, append(protowire.AppendVarint([]byte{0x08}, 1), append([]byte{0x10}, protowire.AppendVarint(nil, 500_000_000)...)...))
	want = protowire.AppendTag(want, 3, protowire.BytesType)
	want = protowire.AppendBytes(want, []byte{0x08, 60})
	assert.Equal(t, want, marshal(t, to))

	got, err := destination.DecodeTimeouts(to, "timeouts")
	require.NoError(t, err)
	assert.Equal(t, policy.Timeouts{Response: 1500 * time.Millisecond, Idle: time.Minute}, got)

	_, err = destination.DecodeTimeouts(&httproutepb.Timeouts{Request: &durationpb.Duration{Seconds: -1}}, "rules[0].timeouts")
	assert.EqualError(t, err, "rules[0].timeouts.request: negative duration -1s")
	_, err = destination.DecodeTimeouts(&httproutepb.Timeouts{Idle: &durationpb.Duration{Seconds: 1, Nanos: -1}}, "t")
	assert.ErrorContains(t, err, "t.idle: ")
}

func TestPolicyWireRatioAndFailureInjector(t *testing.T) {
	fi := &httproutepb.HttpFailureInjector{Status: 503, Message: "x", Ratio: &httproutepb.Ratio{Numerator: 1, Denominator: 10}}
	assert.Equal(t, []byte{0x08, 0xf7, 0x03, 0x12, 0x01, 'x', 0x1a, 0x04, 0x08, 0x01, 0x10, 0x0a}, marshal(t, fi))
	fs, err := destination.DecodeHTTPFilters([]*outboundpb.HttpRoute_Filter{{Kind: &outboundpb.HttpRoute_Filter_FailureInjector{FailureInjector: fi}}}, "filters")
	require.NoError(t, err)
	assert.Equal(t, &policy.FailureInjector{Status: 503, Message: "x", Ratio: policy.Ratio{Numerator: 1, Denominator: 10}}, fs[0].FailureInjector)
	assert.InDelta(t, 0.1, fs[0].FailureInjector.Ratio.Probability(), 1e-12)

	// No ratio: every request.
	fs, err = destination.DecodeHTTPFilters([]*outboundpb.HttpRoute_Filter{{Kind: &outboundpb.HttpRoute_Filter_FailureInjector{FailureInjector: &httproutepb.HttpFailureInjector{Status: 500}}}}, "filters")
	require.NoError(t, err)
	assert.Equal(t, 1.0, fs[0].FailureInjector.Ratio.Probability())

	_, err = destination.DecodeRatio(&httproutepb.Ratio{Numerator: 1}, "filters[0].failure_injector.ratio")
	assert.EqualError(t, err, "filters[0].failure_injector.ratio.denominator: must be positive")
	_, err = destination.DecodeRatio(&httproutepb.Ratio{Numerator: 3, Denominator: 2}, "r")
	assert.EqualError(t, err, "r: 3/2 is more than 1")

	g := &grpcroutepb.GrpcFailureInjector{Code: 14, Message: "m", Ratio: &httproutepb.Ratio{Numerator: 1, Denominator: 2}}
	assert.Equal(t, []byte{0x08, 0x0e, 0x12, 0x01, 'm', 0x1a, 0x04, 0x08, 0x01, 0x10, 0x02}, marshal(t, g))
}

func TestPolicyWireFloatsAndDoubles(t *testing.T) {
	b := marshal(t, &outboundpb.ExponentialBackoff{JitterRatio: 0.5})
	assert.Equal(t, protowire.AppendFixed32([]byte{0x1d}, math.Float32bits(0.5)), b)
	b = marshal(t, &outboundpb.FailureAccrual_Unified{SuccessRateThreshold: 0.8})
	assert.Equal(t, protowire.AppendFixed64([]byte{0x09}, math.Float64bits(0.8)), b)
}

// The wire table of the OutboundPolicies API: every message, field number,
// kind, repeatedness and oneof. A change to the .proto files that breaks
// compatibility with Linkerd fails here. Each field is
// "number name kind [rep] [oneof=name]".
func TestPolicyWireTable(t *testing.T) {
	const (
		o = "io.linkerd.proxy.outbound."
		h = "io.linkerd.proxy.http_route."
	)
	dist := map[string]string{
		"":       "1 empty message oneof=kind; 2 first_available message oneof=kind; 3 random_available message oneof=kind",
		".Empty": "", ".FirstAvailable": "1 backends message rep", ".RandomAvailable": "1 backends message rep",
	}
	table := map[string]string{
		o + "TrafficSpec":                                 "1 source_workload string; 2 addr message oneof=target; 3 authority string oneof=target",
		o + "OutboundPolicy":                              "1 protocol message; 2 metadata message",
		o + "ProxyProtocol":                               "1 detect message oneof=kind; 2 opaque message oneof=kind; 3 http1 message oneof=kind; 4 http2 message oneof=kind; 5 grpc message oneof=kind; 6 tls message oneof=kind",
		o + "ProxyProtocol.Detect":                        "1 timeout message; 2 opaque message; 3 http1 message; 4 http2 message",
		o + "ProxyProtocol.Opaque":                        "1 routes message rep",
		o + "ProxyProtocol.Http1":                         "1 routes message rep; 2 failure_accrual message",
		o + "ProxyProtocol.Http2":                         "1 routes message rep; 2 failure_accrual message",
		o + "ProxyProtocol.Grpc":                          "1 routes message rep; 2 failure_accrual message",
		o + "ProxyProtocol.Tls":                           "1 routes message rep",
		o + "HttpRoute":                                   "1 metadata message; 2 hosts message rep; 3 rules message rep",
		o + "HttpRoute.Rule":                              "1 matches message rep; 2 filters message rep; 3 backends message; 4 requestTimeout message; 5 timeouts message; 6 retry message; 7 allow_l5d_request_headers bool; 1001 hedge message; 1002 inmesh_request_mirrors message rep",
		o + "HttpRoute.Filter":                            "1 failure_injector message oneof=kind; 2 request_header_modifier message oneof=kind; 3 redirect message oneof=kind; 4 response_header_modifier message oneof=kind",
		o + "HttpRoute.Retry":                             "1 max_retries uint32; 2 max_request_bytes uint32; 3 conditions message; 4 timeout message; 5 backoff message",
		o + "HttpRoute.Retry.Conditions":                  "1 status_ranges message rep",
		o + "HttpRoute.Retry.Conditions.StatusRange":      "1 start uint32; 2 end uint32",
		o + "HttpRoute.RouteBackend":                      "1 backend message; 3 filters message rep; 4 requestTimeout message",
		o + "HttpRoute.WeightedRouteBackend":              "1 backend message; 2 weight uint32",
		o + "GrpcRoute":                                   "1 metadata message; 2 hosts message rep; 3 rules message rep",
		o + "GrpcRoute.Rule":                              "1 matches message rep; 2 filters message rep; 3 backends message; 4 requestTimeout message; 5 timeouts message; 6 retry message; 7 allow_l5d_request_headers bool; 1001 hedge message; 1002 inmesh_request_mirrors message rep",
		o + "GrpcRoute.Filter":                            "1 failure_injector message oneof=kind; 2 request_header_modifier message oneof=kind",
		o + "GrpcRoute.Retry":                             "1 max_retries uint32; 2 max_request_bytes uint32; 3 conditions message; 4 timeout message; 5 backoff message",
		o + "GrpcRoute.Retry.Conditions":                  "1 cancelled bool; 4 deadine_exceeded bool; 8 resource_exhausted bool; 13 internal bool; 14 unavailable bool",
		o + "GrpcRoute.RouteBackend":                      "1 backend message; 3 filters message rep; 4 requestTimeout message",
		o + "GrpcRoute.WeightedRouteBackend":              "1 backend message; 2 weight uint32",
		o + "OpaqueRoute":                                 "1 metadata message; 3 rules message rep",
		o + "OpaqueRoute.Rule":                            "1 backends message; 2 filters message rep",
		o + "OpaqueRoute.Filter":                          "1 invalid message oneof=kind; 2 forbidden message oneof=kind",
		o + "OpaqueRoute.RouteBackend":                    "1 backend message; 3 filters message rep",
		o + "OpaqueRoute.WeightedRouteBackend":            "1 backend message; 2 weight uint32",
		o + "TlsRoute":                                    "1 metadata message; 2 snis message rep; 3 rules message rep",
		o + "TlsRoute.Rule":                               "1 backends message; 2 filters message rep",
		o + "TlsRoute.Filter":                             "1 invalid message oneof=kind; 2 forbidden message oneof=kind",
		o + "TlsRoute.RouteBackend":                       "1 backend message; 3 filters message rep",
		o + "TlsRoute.WeightedRouteBackend":               "1 backend message; 2 weight uint32",
		o + "Backend":                                     "1 metadata message; 2 forward message oneof=kind; 3 balancer message oneof=kind; 4 queue message",
		o + "Backend.EndpointDiscovery":                   "1 dst message oneof=kind",
		o + "Backend.EndpointDiscovery.DestinationGet":    "1 path string",
		o + "Backend.BalanceP2c":                          "1 discovery message; 2 peak_ewma message oneof=load; 3 penalty_peak_ewma message oneof=load; 1003 outlier_detection message",
		o + "Backend.BalanceP2c.PeakEwma":                 "1 default_rtt message; 2 decay message",
		o + "Backend.BalanceP2c.PenaltyPeakEwma":          "1 default_rtt message; 2 decay message; 3 penalty message; 4 max_retry_after message; 5 penalty_decay message",
		o + "Queue":                                       "1 capacity uint32; 2 failfast_timeout message",
		o + "FailureAccrual":                              "1 consecutive_failures message oneof=kind; 2 unified message oneof=kind; 3 ejection message",
		o + "FailureAccrual.ConsecutiveFailures":          "1 max_failures uint32; 2 backoff message",
		o + "FailureAccrual.Unified":                      "1 success_rate_threshold double; 2 decay message; 3 min_requests uint32; 4 max_consecutive_failures uint32; 5 backoff message",
		o + "EjectionConfig":                              "1 min_ready_endpoints uint32",
		o + "ExponentialBackoff":                          "1 min_backoff message; 2 max_backoff message; 3 jitter_ratio float; 4 respect_retry_after_hint bool",
		h + "HostMatch":                                   "1 exact string oneof=match; 2 suffix message oneof=match",
		h + "HostMatch.Suffix":                            "1 reverse_labels string rep",
		h + "HttpRouteMatch":                              "1 path message; 2 headers message rep; 3 query_params message rep; 4 method message",
		h + "PathMatch":                                   "1 exact string oneof=kind; 2 prefix string oneof=kind; 3 regex string oneof=kind",
		h + "HeaderMatch":                                 "1 name string; 2 exact bytes oneof=value; 3 regex string oneof=value",
		h + "QueryParamMatch":                             "1 name string; 2 exact string oneof=value; 3 regex string oneof=value",
		h + "RequestHeaderModifier":                       "1 add message; 2 set message; 3 remove string rep",
		h + "ResponseHeaderModifier":                      "1 add message; 2 set message; 3 remove string rep",
		h + "RequestRedirect":                             "1 scheme message; 2 host string; 3 path message; 4 port uint32; 5 status uint32",
		h + "PathModifier":                                "1 full string oneof=replace; 2 prefix string oneof=replace",
		h + "HttpFailureInjector":                         "1 status uint32; 2 message string; 3 ratio message",
		h + "Ratio":                                       "1 numerator uint32; 2 denominator uint32",
		h + "Timeouts":                                    "1 response message; 2 request message; 3 idle message",
		"io.linkerd.proxy.grpc_route.GrpcRouteMatch":      "1 rpc message; 2 headers message rep",
		"io.linkerd.proxy.grpc_route.GrpcRpcMatch":        "1 service string; 2 method string",
		"io.linkerd.proxy.grpc_route.GrpcFailureInjector": "1 code uint32; 2 message string; 3 ratio message",
		"io.linkerd.proxy.opaque_route.Invalid":           "1 message string",
		"io.linkerd.proxy.opaque_route.Forbidden":         "",
		"io.linkerd.proxy.tls_route.SniMatch":             "1 exact string oneof=match; 2 suffix message oneof=match",
		"io.linkerd.proxy.tls_route.SniMatch.Suffix":      "1 reverse_labels string rep",
	}
	for _, route := range []string{"HttpRoute", "GrpcRoute", "OpaqueRoute", "TlsRoute"} {
		for suffix, fields := range dist {
			table[o+route+".Distribution"+suffix] = fields
		}
	}
	// Message-typed fields name their types: the ones a mismatch would
	// silently break.
	types := map[string]string{
		o + "TrafficSpec.addr":                                  "io.linkerd.proxy.net.TcpAddress",
		o + "OutboundPolicy.metadata":                           "io.linkerd.proxy.meta.Metadata",
		o + "HttpRoute.hosts":                                   h + "HostMatch",
		o + "HttpRoute.Rule.matches":                            h + "HttpRouteMatch",
		o + "HttpRoute.Rule.timeouts":                           h + "Timeouts",
		o + "HttpRoute.Rule.inmesh_request_mirrors":             "io.inmesh.mirror.v1.RequestMirror",
		o + "GrpcRoute.Rule.inmesh_request_mirrors":             "io.inmesh.mirror.v1.RequestMirror",
		o + "HttpRoute.Rule.requestTimeout":                     "google.protobuf.Duration",
		o + "HttpRoute.Filter.failure_injector":                 h + "HttpFailureInjector",
		o + "HttpRoute.Filter.redirect":                         h + "RequestRedirect",
		o + "HttpRoute.Filter.response_header_modifier":         h + "ResponseHeaderModifier",
		o + "HttpRoute.Distribution.RandomAvailable.backends":   o + "HttpRoute.WeightedRouteBackend",
		o + "GrpcRoute.Rule.matches":                            "io.linkerd.proxy.grpc_route.GrpcRouteMatch",
		o + "GrpcRoute.Filter.failure_injector":                 "io.linkerd.proxy.grpc_route.GrpcFailureInjector",
		o + "GrpcRoute.Filter.request_header_modifier":          h + "RequestHeaderModifier",
		o + "OpaqueRoute.Filter.invalid":                        "io.linkerd.proxy.opaque_route.Invalid",
		o + "TlsRoute.snis":                                     "io.linkerd.proxy.tls_route.SniMatch",
		o + "Backend.forward":                                   "io.linkerd.proxy.destination.WeightedAddr",
		o + "Backend.balancer":                                  o + "Backend.BalanceP2c",
		o + "Backend.BalanceP2c.outlier_detection":              "io.inmesh.ext.outlier.v1.OutlierDetection", // inmesh only
		h + "HttpRouteMatch.method":                             "io.linkerd.proxy.http_types.HttpMethod",
		h + "RequestHeaderModifier.add":                         "io.linkerd.proxy.http_types.Headers",
		h + "RequestRedirect.scheme":                            "io.linkerd.proxy.http_types.Scheme",
		h + "HttpFailureInjector.ratio":                         h + "Ratio",
		"io.linkerd.proxy.grpc_route.GrpcRouteMatch.headers":    h + "HeaderMatch",
		"io.linkerd.proxy.grpc_route.GrpcFailureInjector.ratio": h + "Ratio",
	}

	files := []protoreflect.FileDescriptor{
		outboundpb.File_outbound_proto, httproutepb.File_http_route_proto, grpcroutepb.File_grpc_route_proto,
		opaqueroutepb.File_opaque_route_proto, tlsroutepb.File_tls_route_proto,
	}
	found := map[string]protoreflect.MessageDescriptor{}
	var walk func(protoreflect.MessageDescriptors)
	walk = func(ms protoreflect.MessageDescriptors) {
		for i := 0; i < ms.Len(); i++ {
			found[string(ms.Get(i).FullName())] = ms.Get(i)
			walk(ms.Get(i).Messages())
		}
	}
	for _, f := range files {
		walk(f.Messages())
	}
	assert.Len(t, found, len(table), "every message of the files is in the table")
	typed := 0
	for name, spec := range table {
		m, ok := found[name]
		if !assert.True(t, ok, "message %s missing", name) {
			continue
		}
		var n int
		for _, fs := range strings.Split(spec, ";") {
			parts := strings.Fields(fs)
			if len(parts) == 0 {
				continue
			}
			n++
			num, err := strconv.Atoi(parts[0])
			require.NoError(t, err, spec)
			f := m.Fields().ByNumber(protoreflect.FieldNumber(num))
			if !assert.NotNil(t, f, "%s field %d missing", name, num) {
				continue
			}
			assert.Equal(t, parts[1], string(f.Name()), "%s field %d name", name, num)
			assert.Equal(t, parts[2], f.Kind().String(), "%s.%s kind", name, parts[1])
			rep, oneof := false, ""
			for _, p := range parts[3:] {
				if p == "rep" {
					rep = true
				}
				if o, ok := strings.CutPrefix(p, "oneof="); ok {
					oneof = o
				}
			}
			assert.Equal(t, rep, f.IsList(), "%s.%s repeated", name, parts[1])
			got := ""
			if od := f.ContainingOneof(); od != nil {
				got = string(od.Name())
			}
			assert.Equal(t, oneof, got, "%s.%s oneof", name, parts[1])
			if want, ok := types[name+"."+parts[1]]; ok {
				assert.Equal(t, want, string(f.Message().FullName()), "%s.%s type", name, parts[1])
				typed++
			}
		}
		assert.Equal(t, n, m.Fields().Len(), "%s field count", name)
	}
	assert.Equal(t, len(types), typed, "every typed field is in the table")
	for _, name := range []string{o + "OpaqueRoute", o + "TlsRoute"} {
		assert.True(t, found[name].ReservedRanges().Has(4), "%s field 4 reserved", name)
	}
	for _, name := range []string{o + "OpaqueRoute.RouteBackend", o + "TlsRoute.RouteBackend"} {
		assert.True(t, found[name].ReservedRanges().Has(2), "%s field 2 reserved", name)
	}
	for _, name := range []string{"HttpRoute.Rule", "GrpcRoute.Rule", "HttpRoute.RouteBackend", "GrpcRoute.RouteBackend"} {
		opts, _ := found[o+name].Fields().ByNumber(4).Options().(*descriptorpb.FieldOptions)
		assert.True(t, opts.GetDeprecated(), "%s.requestTimeout deprecated", name)
	}

	svc := outboundpb.File_outbound_proto.Services().ByName("OutboundPolicies")
	require.NotNil(t, svc)
	assert.Equal(t, "io.linkerd.proxy.outbound.OutboundPolicies", string(svc.FullName()))
	get := svc.Methods().ByName("Get")
	require.NotNil(t, get)
	assert.False(t, get.IsStreamingServer() || get.IsStreamingClient())
	watch := svc.Methods().ByName("Watch")
	require.NotNil(t, watch)
	assert.True(t, watch.IsStreamingServer() && !watch.IsStreamingClient())
	for _, md := range []protoreflect.MethodDescriptor{get, watch} {
		assert.Equal(t, o+"TrafficSpec", string(md.Input().FullName()))
		assert.Equal(t, o+"OutboundPolicy", string(md.Output().FullName()))
	}
	assert.Equal(t, "/io.linkerd.proxy.outbound.OutboundPolicies/Watch", outboundpb.OutboundPolicies_Watch_FullMethodName)
}
