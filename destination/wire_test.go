package destination_test

import (
	"encoding/binary"
	"math"
	"net/netip"
	"testing"

	"github.com/inmesh/inmesh/destination"

	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

func TestWireIPv4IsBigEndianValueInFixed32(t *testing.T) {
	m := destination.AddrToProto(netip.MustParseAddrPort("10.1.2.3:8080"))
	assert.Equal(t, uint32(0x0a010203), m.GetIp().GetIpv4())
	b, err := proto.Marshal(m.GetIp())
	require.NoError(t, err)
	// Field 1, wire type 5 (fixed32), then the value little-endian.
	assert.Equal(t, []byte{0x0d, 0x03, 0x02, 0x01, 0x0a}, b)

	back, err := destination.AddrFromProto(m)
	require.NoError(t, err)
	assert.Equal(t, "10.1.2.3:8080", back.String())

	mapped := destination.AddrToProto(netip.MustParseAddrPort("[::ffff:10.1.2.3]:80"))
	assert.Equal(t, uint32(0x0a010203), mapped.GetIp().GetIpv4(), "IPv4-mapped goes as IPv4")
}

func TestWireIPv6Halves(t *testing.T) {
	m := destination.AddrToProto(netip.MustParseAddrPort("[2001:db8:1:2:3:4:5:6]:443"))
	assert.Equal(t, uint64(0x20010db800010002), m.GetIp().GetIpv6().GetFirst())
	assert.Equal(t, uint64(0x0003000400050006), m.GetIp().GetIpv6().GetLast())
	b, err := proto.Marshal(m.GetIp().GetIpv6())
	require.NoError(t, err)
	want := []byte{0x09}
	want = binary.LittleEndian.AppendUint64(want, 0x20010db800010002)
	want = append(want, 0x11)
	want = binary.LittleEndian.AppendUint64(want, 0x0003000400050006)
	assert.Equal(t, want, b)
	back, err := destination.AddrFromProto(m)
	require.NoError(t, err)
	assert.Equal(t, "[2001:db8:1:2:3:4:5:6]:443", back.String())

	_, err = destination.AddrFromProto(&pb.TcpAddress{Ip: m.GetIp(), Port: 70000})
	assert.ErrorContains(t, err, "port 70000 is out of range")
	_, err = destination.AddrFromProto(&pb.TcpAddress{Port: 80})
	assert.ErrorContains(t, err, "no IP address")
}

func TestWireMethodGETSurvivesRoundTrip(t *testing.T) {
	b, err := proto.Marshal(destination.MethodToProto("GET"))
	require.NoError(t, err)
	assert.Equal(t, []byte{0x08, 0x00}, b, "GET is sent although it is the zero value")
	var back pb.HttpMethod
	require.NoError(t, proto.Unmarshal(b, &back))
	got, err := destination.MethodFromProto(&back, "method")
	require.NoError(t, err)
	assert.Equal(t, "GET", got)

	var unset pb.HttpMethod
	_, err = destination.MethodFromProto(&unset, "routes[0].condition.method")
	assert.EqualError(t, err, "routes[0].condition.method: no method set")
}

func TestWireMethods(t *testing.T) {
	for name, want := range map[string][]byte{
		"PATCH":   {0x08, 0x04},
		"POST":    {0x08, 0x01},
		"TRACE":   {0x08, 0x08},
		"PURGE":   {0x12, 0x05, 'P', 'U', 'R', 'G', 'E'},
		"patch":   {0x12, 0x05, 'p', 'a', 't', 'c', 'h'}, // methods are case-sensitive
		"CONNECT": {0x08, 0x06},
	} {
		b, err := proto.Marshal(destination.MethodToProto(name))
		require.NoError(t, err)
		assert.Equal(t, want, b, name)
	}
}

func TestWireRetryRatioIsFloat32(t *testing.T) {
	b, err := proto.Marshal(&pb.RetryBudget{RetryRatio: 0.2})
	require.NoError(t, err)
	want := binary.LittleEndian.AppendUint32([]byte{0x0d}, math.Float32bits(0.2))
	assert.Equal(t, want, b)
}

// The wire table of the Destination API: every message, field number, kind
// and oneof. A change to the .proto files that breaks compatibility with
// Linkerd fails here.
func TestWireTable(t *testing.T) {
	type field struct {
		num   protoreflect.FieldNumber
		kind  protoreflect.Kind
		oneof string
		list  bool
	}
	msg, enum, str, u32, b := protoreflect.MessageKind, protoreflect.EnumKind, protoreflect.StringKind, protoreflect.Uint32Kind, protoreflect.BoolKind
	table := map[string]map[string]field{
		"io.linkerd.proxy.destination.GetDestination":  {"scheme": {1, str, "", false}, "path": {2, str, "", false}, "context_token": {3, str, "", false}},
		"io.linkerd.proxy.destination.Update":          {"add": {1, msg, "update", false}, "remove": {2, msg, "update", false}, "no_endpoints": {3, msg, "update", false}},
		"io.linkerd.proxy.destination.AddrSet":         {"addrs": {1, msg, "", true}},
		"io.linkerd.proxy.destination.WeightedAddrSet": {"addrs": {1, msg, "", true}, "metric_labels": {2, msg, "", false}},
		"io.linkerd.proxy.destination.WeightedAddr": {
			"addr": {1, msg, "", false}, "weight": {3, u32, "", false}, "metric_labels": {4, msg, "", false},
			"tls_identity": {5, msg, "", false}, "protocol_hint": {6, msg, "", false}, "authority_override": {7, msg, "", false},
			"http2": {8, msg, "", false}, "resource_ref": {9, msg, "", false},
		},
		"io.linkerd.proxy.destination.TlsIdentity": {
			"dns_like_identity": {1, msg, "strategy", false}, "uri_like_identity": {3, msg, "strategy", false}, "server_name": {4, msg, "", false},
		},
		"io.linkerd.proxy.destination.TlsIdentity.DnsLikeIdentity": {"name": {1, str, "", false}},
		"io.linkerd.proxy.destination.TlsIdentity.UriLikeIdentity": {"uri": {1, str, "", false}},
		"io.linkerd.proxy.destination.AuthorityOverride":           {"authority_override": {1, str, "", false}},
		"io.linkerd.proxy.destination.NoEndpoints":                 {"exists": {1, b, "", false}},
		"io.linkerd.proxy.destination.ProtocolHint": {
			"h2": {1, msg, "protocol", false}, "opaque": {3, msg, "protocol", false}, "opaque_transport": {2, msg, "", false},
		},
		"io.linkerd.proxy.destination.ProtocolHint.OpaqueTransport": {"inbound_port": {1, u32, "", false}},
		"io.linkerd.proxy.destination.Http2ClientParams":            {"flow_control": {1, msg, "", false}, "keep_alive": {2, msg, "", false}, "internals": {3, msg, "", false}},
		"io.linkerd.proxy.destination.Http2ClientParams.FlowControl": {
			"initial_connection_window_size": {1, u32, "", false}, "initial_stream_window_size": {2, u32, "", false}, "adaptive_flow_control": {3, b, "", false},
		},
		"io.linkerd.proxy.destination.Http2ClientParams.KeepAlive": {"interval": {1, msg, "", false}, "timeout": {2, msg, "", false}, "while_idle": {3, b, "", false}},
		"io.linkerd.proxy.destination.Http2ClientParams.Internals": {
			"max_concurrent_reset_streams": {1, u32, "", false}, "max_frame_size": {2, u32, "", false}, "max_send_buf_size": {3, u32, "", false},
		},
		"io.linkerd.proxy.destination.DestinationProfile": {
			"routes": {1, msg, "", true}, "retry_budget": {2, msg, "", false}, "dst_overrides": {3, msg, "", true},
			"opaque_protocol": {4, b, "", false}, "fully_qualified_name": {5, str, "", false}, "endpoint": {6, msg, "", false},
			"parent_ref": {7, msg, "", false}, "profile_ref": {8, msg, "", false},
		},
		"io.linkerd.proxy.destination.Route": {
			"condition": {1, msg, "", false}, "response_classes": {2, msg, "", true}, "metrics_labels": {3, msg, "", false},
			"is_retryable": {4, b, "", false}, "timeout": {5, msg, "", false},
			"hedge": {1001, msg, "", false}, // inmesh's, skipped by Linkerd's proxies
		},
		"io.linkerd.proxy.destination.RetryBudget": {
			"retry_ratio": {1, protoreflect.FloatKind, "", false}, "min_retries_per_second": {2, u32, "", false}, "ttl": {3, msg, "", false},
		},
		"io.linkerd.proxy.destination.ResponseClass": {"condition": {1, msg, "", false}, "is_failure": {2, b, "", false}},
		"io.linkerd.proxy.destination.RequestMatch": {
			"all": {1, msg, "match", false}, "any": {2, msg, "match", false}, "not": {3, msg, "match", false},
			"path": {4, msg, "match", false}, "method": {5, msg, "match", false},
		},
		"io.linkerd.proxy.destination.RequestMatch.Seq":  {"matches": {1, msg, "", true}},
		"io.linkerd.proxy.destination.PathMatch":         {"regex": {1, str, "", false}},
		"io.linkerd.proxy.destination.ResponseMatch":     {"all": {1, msg, "match", false}, "any": {2, msg, "match", false}, "not": {3, msg, "match", false}, "status": {4, msg, "match", false}},
		"io.linkerd.proxy.destination.ResponseMatch.Seq": {"matches": {1, msg, "", true}},
		"io.linkerd.proxy.destination.HttpStatusRange":   {"min": {1, u32, "", false}, "max": {2, u32, "", false}},
		"io.linkerd.proxy.destination.WeightedDst":       {"authority": {1, str, "", false}, "weight": {2, u32, "", false}, "backend_ref": {3, msg, "", false}},
		"io.linkerd.proxy.net.IPAddress":                 {"ipv4": {1, protoreflect.Fixed32Kind, "ip", false}, "ipv6": {2, msg, "ip", false}},
		"io.linkerd.proxy.net.IPv6":                      {"first": {1, protoreflect.Fixed64Kind, "", false}, "last": {2, protoreflect.Fixed64Kind, "", false}},
		"io.linkerd.proxy.net.TcpAddress":                {"ip": {1, msg, "", false}, "port": {2, u32, "", false}},
		"io.linkerd.proxy.net.IPNetwork":                 {"ip": {1, msg, "", false}, "prefix_len": {2, u32, "", false}},
		"io.linkerd.proxy.http_types.HttpMethod":         {"registered": {1, enum, "type", false}, "unregistered": {2, str, "type", false}},
		"io.linkerd.proxy.http_types.Scheme":             {"registered": {1, enum, "type", false}, "unregistered": {2, str, "type", false}},
		"io.linkerd.proxy.http_types.Headers":            {"headers": {1, msg, "", true}},
		"io.linkerd.proxy.http_types.Headers.Header":     {"name": {1, str, "", false}, "value": {2, protoreflect.BytesKind, "", false}},
		"io.linkerd.proxy.meta.Metadata":                 {"default": {1, str, "kind", false}, "resource": {2, msg, "kind", false}},
		"io.linkerd.proxy.meta.Resource": {
			"group": {1, str, "", false}, "kind": {2, str, "", false}, "name": {3, str, "", false},
			"namespace": {4, str, "", false}, "section": {5, str, "", false}, "port": {6, u32, "", false},
		},
	}
	files := []protoreflect.FileDescriptor{pb.File_destination_proto, pb.File_net_proto, pb.File_http_types_proto, pb.File_meta_proto}
	found := map[string]protoreflect.MessageDescriptor{}
	var walk func(protoreflect.MessageDescriptors)
	walk = func(ms protoreflect.MessageDescriptors) {
		for i := 0; i < ms.Len(); i++ {
			m := ms.Get(i)
			if !m.IsMapEntry() {
				found[string(m.FullName())] = m
			}
			walk(m.Messages())
		}
	}
	for _, f := range files {
		walk(f.Messages())
	}
	for name, fields := range table {
		m, ok := found[name]
		if !assert.True(t, ok, "message %s missing", name) {
			continue
		}
		assert.Equal(t, len(fields), m.Fields().Len(), "%s field count", name)
		for fname, want := range fields {
			f := m.Fields().ByName(protoreflect.Name(fname))
			if !assert.NotNil(t, f, "%s.%s missing", name, fname) {
				continue
			}
			assert.Equal(t, want.num, f.Number(), "%s.%s number", name, fname)
			assert.Equal(t, want.kind, f.Kind(), "%s.%s kind", name, fname)
			assert.Equal(t, want.list, f.IsList(), "%s.%s repeated", name, fname)
			oneof := ""
			if o := f.ContainingOneof(); o != nil {
				oneof = string(o.Name())
			}
			assert.Equal(t, want.oneof, oneof, "%s.%s oneof", name, fname)
		}
	}
	assert.Equal(t, "GET", pb.HttpMethod_Registered_name[0])
	assert.Equal(t, int32(4), pb.HttpMethod_Registered_value["PATCH"])
	assert.Equal(t, int32(8), pb.HttpMethod_Registered_value["TRACE"])
	assert.Equal(t, int32(1), pb.Scheme_Registered_value["HTTPS"])
	svc := pb.File_destination_proto.Services().ByName("Destination")
	require.NotNil(t, svc)
	assert.Equal(t, "io.linkerd.proxy.destination.Destination", string(svc.FullName()))
	for _, rpc := range []string{"Get", "GetProfile"} {
		md := svc.Methods().ByName(protoreflect.Name(rpc))
		require.NotNil(t, md, rpc)
		assert.True(t, md.IsStreamingServer() && !md.IsStreamingClient(), rpc)
		assert.Equal(t, "io.linkerd.proxy.destination.GetDestination", string(md.Input().FullName()))
	}
	tls := found["io.linkerd.proxy.destination.TlsIdentity"]
	assert.True(t, tls.ReservedRanges().Has(2), "TlsIdentity field 2 reserved")
	assert.True(t, tls.ReservedNames().Has("k8s_pod_identity"))
}
