package inboundpb_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/proxyapi/identitypb"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// The wire table of the InboundServerPolicies API, as linkerd2-proxy-api
// v0.20.0's proto/inbound.proto declares it: every message, field number,
// kind, repeatedness, oneof, message type and reserved number. Each field is
// "number name kind [rep] [oneof=name] [type=full.name]"; maps are
// "rep map".
func TestInboundWireTable(t *testing.T) {
	const (
		i = "io.linkerd.proxy.inbound."
		h = "io.linkerd.proxy.http_route."
		g = "io.linkerd.proxy.grpc_route."
	)
	table := map[string]string{
		i + "PortSpec":                                     "1 workload string; 2 port uint32",
		i + "Server":                                       "1 protocol message type=" + i + "ProxyProtocol; 2 server_ips message rep type=io.linkerd.proxy.net.IPAddress; 3 authorizations message rep type=" + i + "Authz; 4 labels message rep map",
		i + "Server.LabelsEntry":                           "1 key string; 2 value string",
		i + "ProxyProtocol":                                "1 detect message oneof=kind type=" + i + "ProxyProtocol.Detect; 2 opaque message oneof=kind type=" + i + "ProxyProtocol.Opaque; 3 tls message oneof=kind type=" + i + "ProxyProtocol.Tls; 4 http1 message oneof=kind type=" + i + "ProxyProtocol.Http1; 5 http2 message oneof=kind type=" + i + "ProxyProtocol.Http2; 6 grpc message oneof=kind type=" + i + "ProxyProtocol.Grpc",
		i + "ProxyProtocol.Detect":                         "1 timeout message type=google.protobuf.Duration; 3 http_routes message rep type=" + i + "HttpRoute; 4 http_local_rate_limit message type=" + i + "HttpLocalRateLimit",
		i + "ProxyProtocol.Http1":                          "2 routes message rep type=" + i + "HttpRoute; 3 local_rate_limit message type=" + i + "HttpLocalRateLimit",
		i + "ProxyProtocol.Http2":                          "2 routes message rep type=" + i + "HttpRoute; 3 local_rate_limit message type=" + i + "HttpLocalRateLimit",
		i + "ProxyProtocol.Grpc":                           "2 routes message rep type=" + i + "GrpcRoute",
		i + "ProxyProtocol.Opaque":                         "",
		i + "ProxyProtocol.Tls":                            "",
		i + "Authz":                                        "1 networks message rep type=" + i + "Network; 2 authentication message type=" + i + "Authn; 3 labels message rep map; 4 metadata message type=io.linkerd.proxy.meta.Metadata",
		i + "Authz.LabelsEntry":                            "1 key string; 2 value string",
		i + "Network":                                      "1 net message type=io.linkerd.proxy.net.IPNetwork; 2 except message rep type=io.linkerd.proxy.net.IPNetwork",
		i + "Authn":                                        "1 unauthenticated message oneof=permit type=" + i + "Authn.PermitUnauthenticated; 2 meshTLS message oneof=permit type=" + i + "Authn.PermitMeshTLS",
		i + "Authn.PermitUnauthenticated":                  "",
		i + "Authn.PermitMeshTLS":                          "1 unauthenticated message oneof=clients type=" + i + "Authn.PermitUnauthenticated; 2 identities message oneof=clients type=" + i + "Authn.PermitMeshTLS.PermitClientIdentities",
		i + "Authn.PermitMeshTLS.PermitClientIdentities":   "1 identities message rep type=" + i + "Identity; 2 suffixes message rep type=" + i + "IdentitySuffix",
		i + "Identity":                                     "1 name string",
		i + "IdentitySuffix":                               "1 parts string rep",
		i + "HttpRoute":                                    "1 metadata message type=io.linkerd.proxy.meta.Metadata; 2 hosts message rep type=" + h + "HostMatch; 3 authorizations message rep type=" + i + "Authz; 4 rules message rep type=" + i + "HttpRoute.Rule",
		i + "HttpRoute.Rule":                               "1 matches message rep type=" + h + "HttpRouteMatch; 2 filters message rep type=" + i + "HttpRoute.Filter",
		i + "HttpRoute.Filter":                             "1 failure_injector message oneof=kind type=" + h + "HttpFailureInjector; 2 request_header_modifier message oneof=kind type=" + h + "RequestHeaderModifier; 3 redirect message oneof=kind type=" + h + "RequestRedirect",
		i + "GrpcRoute":                                    "1 metadata message type=io.linkerd.proxy.meta.Metadata; 2 hosts message rep type=" + h + "HostMatch; 3 authorizations message rep type=" + i + "Authz; 4 rules message rep type=" + i + "GrpcRoute.Rule",
		i + "GrpcRoute.Rule":                               "1 matches message rep type=" + g + "GrpcRouteMatch; 2 filters message rep type=" + i + "GrpcRoute.Filter",
		i + "GrpcRoute.Filter":                             "1 failure_injector message oneof=kind type=" + g + "GrpcFailureInjector; 2 request_header_modifier message oneof=kind type=" + h + "RequestHeaderModifier",
		i + "HttpLocalRateLimit":                           "1 metadata message type=io.linkerd.proxy.meta.Metadata; 2 total message type=" + i + "HttpLocalRateLimit.Limit; 3 identity message type=" + i + "HttpLocalRateLimit.Limit; 4 overrides message rep type=" + i + "HttpLocalRateLimit.Override",
		i + "HttpLocalRateLimit.Override":                  "1 limit message type=" + i + "HttpLocalRateLimit.Limit; 2 clients message type=" + i + "HttpLocalRateLimit.Override.ClientIdentities",
		i + "HttpLocalRateLimit.Override.ClientIdentities": "1 identities message rep type=" + i + "Identity",
		i + "HttpLocalRateLimit.Limit":                     "1 requestsPerSecond uint32",
	}
	// Numbers upstream retired; nothing may reuse them.
	reserved := map[string]protoreflect.FieldNumber{
		i + "ProxyProtocol.Detect": 2,
		i + "ProxyProtocol.Http1":  1,
		i + "ProxyProtocol.Http2":  1,
		i + "ProxyProtocol.Grpc":   1,
	}

	found := map[string]protoreflect.MessageDescriptor{}
	var walk func(protoreflect.MessageDescriptors)
	walk = func(ms protoreflect.MessageDescriptors) {
		for n := 0; n < ms.Len(); n++ {
			found[string(ms.Get(n).FullName())] = ms.Get(n)
			walk(ms.Get(n).Messages())
		}
	}
	walk(inboundpb.File_inbound_proto.Messages())
	assert.Len(t, found, len(table), "every message of inbound.proto is in the table")

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
			rep, isMap, oneof, typ := false, false, "", ""
			for _, p := range parts[3:] {
				switch {
				case p == "rep":
					rep = true
				case p == "map":
					isMap = true
				case strings.HasPrefix(p, "oneof="):
					oneof = strings.TrimPrefix(p, "oneof=")
				case strings.HasPrefix(p, "type="):
					typ = strings.TrimPrefix(p, "type=")
				}
			}
			assert.Equal(t, rep, f.Cardinality() == protoreflect.Repeated, "%s.%s repeated", name, parts[1])
			assert.Equal(t, isMap, f.IsMap(), "%s.%s map", name, parts[1])
			got := ""
			if od := f.ContainingOneof(); od != nil {
				got = string(od.Name())
			}
			assert.Equal(t, oneof, got, "%s.%s oneof", name, parts[1])
			if isMap {
				assert.Equal(t, protoreflect.StringKind, f.MapKey().Kind(), "%s.%s key", name, parts[1])
				assert.Equal(t, protoreflect.StringKind, f.MapValue().Kind(), "%s.%s value", name, parts[1])
			} else if f.Kind() == protoreflect.MessageKind {
				assert.Equal(t, typ, string(f.Message().FullName()), "%s.%s type", name, parts[1])
			}
		}
		assert.Equal(t, n, m.Fields().Len(), "%s field count", name)
		rr := m.ReservedRanges()
		if num, ok := reserved[name]; ok {
			assert.Equal(t, 1, rr.Len(), "%s reserved ranges", name)
			assert.True(t, rr.Has(num), "%s field %d reserved", name, num)
		} else {
			assert.Zero(t, rr.Len(), "%s reserves nothing", name)
		}
	}

	svc := inboundpb.File_inbound_proto.Services().ByName("InboundServerPolicies")
	require.NotNil(t, svc)
	assert.Equal(t, i+"InboundServerPolicies", string(svc.FullName()))
	assert.Equal(t, 2, svc.Methods().Len())
	get := svc.Methods().ByName("GetPort")
	require.NotNil(t, get)
	assert.False(t, get.IsStreamingServer() || get.IsStreamingClient(), "GetPort is unary")
	watch := svc.Methods().ByName("WatchPort")
	require.NotNil(t, watch)
	assert.True(t, watch.IsStreamingServer() && !watch.IsStreamingClient(), "WatchPort streams answers")
	for _, md := range []protoreflect.MethodDescriptor{get, watch} {
		assert.Equal(t, i+"PortSpec", string(md.Input().FullName()))
		assert.Equal(t, i+"Server", string(md.Output().FullName()))
	}
	assert.Equal(t, "/io.linkerd.proxy.inbound.InboundServerPolicies/GetPort", inboundpb.InboundServerPolicies_GetPort_FullMethodName)
	assert.Equal(t, "/io.linkerd.proxy.inbound.InboundServerPolicies/WatchPort", inboundpb.InboundServerPolicies_WatchPort_FullMethodName)
}

// Bytes as a Linkerd policy controller encodes them: a mesh-TLS
// authorization for one identity suffix, and a Detect with a rate limit.
func TestInboundWireBytes(t *testing.T) {
	authn := &inboundpb.Authn{Permit: &inboundpb.Authn_MeshTLS{MeshTLS: &inboundpb.Authn_PermitMeshTLS{
		Clients: &inboundpb.Authn_PermitMeshTLS_Identities{Identities: &inboundpb.Authn_PermitMeshTLS_PermitClientIdentities{
			Suffixes: []*inboundpb.IdentitySuffix{{Parts: []string{"ns"}}},
		}},
	}}}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(authn)
	require.NoError(t, err)
	// Authn.meshTLS (2) > PermitMeshTLS.identities (2) > suffixes (2) > parts (1) "ns".
	assert.Equal(t, []byte{0x12, 0x08, 0x12, 0x06, 0x12, 0x04, 0x0a, 0x02, 'n', 's'}, b)

	// An empty suffix list entry is still sent: it matches every identity.
	anyID := &inboundpb.Authn_PermitMeshTLS_PermitClientIdentities{Suffixes: []*inboundpb.IdentitySuffix{{}}}
	b, err = proto.Marshal(anyID)
	require.NoError(t, err)
	assert.Equal(t, []byte{0x12, 0x00}, b)

	detect := &inboundpb.ProxyProtocol{Kind: &inboundpb.ProxyProtocol_Detect_{Detect: &inboundpb.ProxyProtocol_Detect{
		HttpLocalRateLimit: &inboundpb.HttpLocalRateLimit{Total: &inboundpb.HttpLocalRateLimit_Limit{RequestsPerSecond: 5}},
	}}}
	b, err = proto.Marshal(detect)
	require.NoError(t, err)
	// ProxyProtocol.detect (1) > http_local_rate_limit (4) > total (2) > requestsPerSecond (1) 5.
	assert.Equal(t, []byte{0x0a, 0x06, 0x22, 0x04, 0x12, 0x02, 0x08, 0x05}, b)
}

// The inbound, outbound and identity packages live together in one binary
// (this test's): their files and message names are registered side by side
// without a conflict, and the inbound file resolves its shared imports.
func TestInboundRegistersBesideTheOtherAPIs(t *testing.T) {
	for path, want := range map[string]protoreflect.FileDescriptor{
		"inbound.proto":  inboundpb.File_inbound_proto,
		"outbound.proto": outboundpb.File_outbound_proto,
		"identity.proto": identitypb.File_identity_proto,
	} {
		fd, err := protoregistry.GlobalFiles.FindFileByPath(path)
		require.NoError(t, err, path)
		assert.Equal(t, want.Package(), fd.Package(), path)
	}
	for _, name := range []protoreflect.FullName{
		"io.linkerd.proxy.inbound.HttpRoute", "io.linkerd.proxy.outbound.HttpRoute",
		"io.linkerd.proxy.inbound.GrpcRoute", "io.linkerd.proxy.outbound.GrpcRoute",
		"io.linkerd.proxy.inbound.ProxyProtocol", "io.linkerd.proxy.outbound.ProxyProtocol",
	} {
		_, err := protoregistry.GlobalTypes.FindMessageByName(name)
		assert.NoError(t, err, name)
	}
	imports := inboundpb.File_inbound_proto.Imports()
	var paths []string
	for n := 0; n < imports.Len(); n++ {
		paths = append(paths, imports.Get(n).Path())
		assert.False(t, imports.Get(n).IsPlaceholder(), imports.Get(n).Path())
	}
	assert.ElementsMatch(t, []string{"google/protobuf/duration.proto", "grpc_route.proto", "http_route.proto", "meta.proto", "net.proto"}, paths)
}
