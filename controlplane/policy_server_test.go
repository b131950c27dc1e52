package controlplane

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const authorsAuthority = "authors.default.svc.cluster.local:7001"

const authorsServiceYAML = `
apiVersion: v1
kind: Service
metadata:
  name: authors
  namespace: default
  annotations: {retry.linkerd.io/http: 5xx, timeout.linkerd.io/request: 2s}
spec:
  clusterIP: 10.96.0.71
  ports: [{port: 7001}]
`

func resources(t *testing.T, docs ...string) *manifest.Resources {
	t.Helper()
	var all string
	for _, d := range docs {
		all += "---\n" + d
	}
	r, err := manifest.Parse([]byte(all))
	require.NoError(t, err)
	return r
}

// TestPolicyTargetsAsLinkerd: the embedded control plane answers
// OutboundPolicies requests as Linkerd's policy controller does
// (policy-controller/grpc/src/outbound.rs lookup and lookup_authority,
// grpc/src/workload.rs, k8s/index/src/outbound/index.rs
// resource_routes_or_default and lookup_service, runtime/src/lib.rs
// lookup_ip), with its codes and messages. The addr rows follow
// policy-test/tests/outbound_api.rs (parent_with_no_routes: a Service's
// clusterIP gets the Service's policy; parent_does_not_exist: an unused
// address is NotFound).
func TestPolicyTargetsAsLinkerd(t *testing.T) {
	store := NewStore()
	store.SetManifests(resources(t, authorsServiceYAML))
	store.PutEndpoints("books.default.svc.cluster.local:7000", nil)
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	cc, err := grpc.NewClient(cp.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	api := outboundpb.NewOutboundPoliciesClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	const pod = `{"ns":"default","pod":"web-0"}`
	auth := func(a string) *outboundpb.TrafficSpec {
		return &outboundpb.TrafficSpec{SourceWorkload: pod, Target: &outboundpb.TrafficSpec_Authority{Authority: a}}
	}
	addr := func(a string) *outboundpb.TrafficSpec {
		return &outboundpb.TrafficSpec{SourceWorkload: pod, Target: &outboundpb.TrafficSpec_Addr{Addr: destination.AddrToProto(netip.MustParseAddrPort(a))}}
	}
	rawAddr := func(m *pb.TcpAddress) *outboundpb.TrafficSpec {
		return &outboundpb.TrafficSpec{SourceWorkload: pod, Target: &outboundpb.TrafficSpec_Addr{Addr: m}}
	}
	ip := destination.AddrToProto(netip.MustParseAddrPort("10.96.0.71:7001")).GetIp()
	for _, tc := range []struct {
		name       string
		spec       *outboundpb.TrafficSpec
		wantParent string // name:port of the parent, when served
		wantCode   codes.Code
		wantMsg    string
	}{
		{"the shorter form names the Service", auth("authors.default.svc:7001"), "authors:7001", codes.OK, ""},
		{"a port-less authority means port 80", auth("authors.default.svc.cluster.local"), "authors:80", codes.OK, ""},
		{"a port the Service does not declare gets the default policy", auth("authors.default.svc.cluster.local:7002"), "authors:7002", codes.OK, ""},
		{"a Service known from the endpoints alone gets the default policy", auth("books.default.svc.cluster.local:7000"), "books:7000", codes.OK, ""},
		{"a Service that does not exist", auth("nosuch.default.svc.cluster.local:7000"), "", codes.NotFound, "unknown target"},
		{"a name outside the cluster", auth("example.com:80"), "", codes.NotFound, "authority must be of the form <name>.<namespace>.svc.cluster.local"},
		{"no host", auth(":80"), "", codes.InvalidArgument, "authority must have a host"},
		{"no target", &outboundpb.TrafficSpec{SourceWorkload: pod}, "", codes.InvalidArgument, "target is required"},
		{"no source workload", &outboundpb.TrafficSpec{Target: &outboundpb.TrafficSpec_Authority{Authority: authorsAuthority}}, "", codes.InvalidArgument, "Invalid workload: "},
		{"a workload without a pod", &outboundpb.TrafficSpec{SourceWorkload: "default:", Target: &outboundpb.TrafficSpec_Authority{Authority: authorsAuthority}}, "", codes.InvalidArgument, "Invalid workload: default:"},
		{"a workload without a namespace", &outboundpb.TrafficSpec{SourceWorkload: "web-0", Target: &outboundpb.TrafficSpec_Authority{Authority: authorsAuthority}}, "", codes.InvalidArgument, "Invalid workload: web-0"},
		{"a JSON workload without a pod", &outboundpb.TrafficSpec{SourceWorkload: `{"ns":"default"}`, Target: &outboundpb.TrafficSpec_Authority{Authority: authorsAuthority}}, "", codes.InvalidArgument, `Invalid workload: {"ns":"default"}`},
		{"the old workload form", &outboundpb.TrafficSpec{SourceWorkload: "default:web-0", Target: &outboundpb.TrafficSpec_Authority{Authority: authorsAuthority}}, "authors:7001", codes.OK, ""},
		{"an external workload", &outboundpb.TrafficSpec{SourceWorkload: `{"ns":"default","external_workload":"vm-1"}`, Target: &outboundpb.TrafficSpec_Authority{Authority: authorsAuthority}}, "authors:7001", codes.OK, ""},
		{"a Service's clusterIP gets the Service's policy", addr("10.96.0.71:7001"), "authors:7001", codes.OK, ""},
		{"a clusterIP as an IPv4-mapped IPv6 address", addr("[::ffff:10.96.0.71]:7001"), "authors:7001", codes.OK, ""},
		{"an address that is no Service's clusterIP", addr("10.8.255.255:4191"), "", codes.NotFound, "No such service"},
		{"an IP literal authority names no Service", auth("10.96.0.71:7001"), "", codes.NotFound, "authority must be of the form <name>.<namespace>.svc.cluster.local"},
		{"an addr without a port", rawAddr(&pb.TcpAddress{Ip: ip}), "", codes.InvalidArgument, "port cannot be zero"},
		{"an addr with a port out of range", rawAddr(&pb.TcpAddress{Ip: ip, Port: 70000}), "", codes.InvalidArgument, "port outside valid range"},
		{"an addr without an IP", rawAddr(&pb.TcpAddress{Port: 7001}), "", codes.InvalidArgument, "traffic target must have an IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := api.Get(ctx, tc.spec)
			require.Equal(t, tc.wantCode, status.Code(err), "%v", err)
			if tc.wantCode != codes.OK {
				if tc.wantMsg != "" {
					assert.Equal(t, tc.wantMsg, status.Convert(err).Message())
				}
				return
			}
			r := got.GetMetadata().GetResource()
			assert.Equal(t, tc.wantParent, fmt.Sprintf("%s:%d", r.GetName(), r.GetPort()))
			routes := got.GetProtocol().GetDetect().GetHttp1().GetRoutes()
			require.NotEmpty(t, routes)
		})
	}

}

// TestPolicyMessagesAsLinkerd: the OutboundPolicy messages carry what
// Linkerd's controller sends (policy-controller/grpc/src/outbound.rs
// to_proto and default_outbound_opaq_route, grpc/src/outbound/http.rs):
// an opaque port's policy is opaque with the default route "opaq" to the
// Service; the detect protocol's opaque fallback carries the same route;
// the deprecated requestTimeout mirrors timeouts.request.
func TestPolicyMessagesAsLinkerd(t *testing.T) {
	store := NewStore()
	store.SetManifests(resources(t, authorsServiceYAML, `
apiVersion: v1
kind: Service
metadata: {name: mysql}
spec: {ports: [{port: 3306}]}
`))
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	cc, err := grpc.NewClient(cp.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	api := outboundpb.NewOutboundPoliciesClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	get := func(a string) *outboundpb.OutboundPolicy {
		got, err := api.Get(ctx, &outboundpb.TrafficSpec{SourceWorkload: "default:web-0", Target: &outboundpb.TrafficSpec_Authority{Authority: a}})
		require.NoError(t, err)
		return got
	}
	checkOpaq := func(what string, routes []*outboundpb.OpaqueRoute, authority string) {
		require.Len(t, routes, 1, what)
		assert.Equal(t, "opaq", routes[0].GetMetadata().GetDefault(), what)
		require.Len(t, routes[0].GetRules(), 1, what)
		bs := routes[0].GetRules()[0].GetBackends().GetFirstAvailable().GetBackends()
		require.Len(t, bs, 1, what)
		assert.Equal(t, authority, bs[0].GetBackend().GetBalancer().GetDiscovery().GetDst().GetPath(), what)
	}

	opaque := get("mysql.default.svc.cluster.local:3306")
	require.NotNil(t, opaque.GetProtocol().GetOpaque(), "3306 is one of Linkerd's default opaque ports: %v", opaque.GetProtocol())
	checkOpaq("opaque", opaque.GetProtocol().GetOpaque().GetRoutes(), "mysql.default.svc.cluster.local:3306")

	detect := get(authorsAuthority)
	require.NotNil(t, detect.GetProtocol().GetDetect())
	checkOpaq("detect", detect.GetProtocol().GetDetect().GetOpaque().GetRoutes(), authorsAuthority)

	rule := detect.GetProtocol().GetDetect().GetHttp1().GetRoutes()[0].GetRules()[0]
	require.NotNil(t, rule.GetTimeouts().GetRequest())
	//lint:ignore SA1019 the deprecated field is what this checks
	assert.Equal(t, rule.GetTimeouts().GetRequest().AsDuration(), rule.GetRequestTimeout().AsDuration())
}

// TestInboundPortAsLinkerd: GetPort answers as Linkerd's controller does
// for a bad workload (InvalidArgument "Invalid workload: X", both workload
// forms accepted) and a pod it does not know (NotFound), and serves the
// default Server for a port no Server selects.
func TestInboundPortAsLinkerd(t *testing.T) {
	store := NewStore()
	r, err := manifest.Parse([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: web-0, namespace: default}\nspec: {containers: [{name: web}]}\n"))
	require.NoError(t, err)
	store.SetManifests(r)
	gs := serve(t, NewServer(store, WithLogger(quietLogger)))
	cc, err := grpc.NewClient(gs.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	api := inboundpb.NewInboundServerPoliciesClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	for _, tc := range []struct {
		workload string
		port     uint32
		code     codes.Code
		msg      string
	}{
		{"default:web-0", 8080, codes.OK, ""},
		{`{"ns":"default","pod":"web-0"}`, 8080, codes.OK, ""},
		{"web-0", 8080, codes.InvalidArgument, "Invalid workload: web-0"},
		{"default:web-0", 0, codes.InvalidArgument, "port outside valid range"},
		{"default:gone-0", 8080, codes.NotFound, ""},
	} {
		got, err := api.GetPort(ctx, &inboundpb.PortSpec{Workload: tc.workload, Port: tc.port})
		require.Equal(t, tc.code, status.Code(err), "%s %d: %v", tc.workload, tc.port, err)
		if tc.msg != "" {
			assert.Equal(t, tc.msg, status.Convert(err).Message())
		}
		if tc.code == codes.OK {
			assert.Equal(t, map[string]string{"group": "", "kind": "default", "name": "all-unauthenticated"}, got.GetLabels())
		}
	}

	// The cluster's default policy (the controller's --default-policy):
	// deny, an empty authorization list.
	store.SetInboundOptions(manifest.InboundOptions{DefaultMode: authz.Deny})
	got, err := api.GetPort(ctx, &inboundpb.PortSpec{Workload: "default:web-0", Port: 8080})
	require.NoError(t, err)
	assert.Equal(t, "deny", got.GetLabels()["name"])
	assert.Empty(t, got.GetAuthorizations())
}

// A route in the Service's namespace (a producer route) applies to every
// client; a route in another namespace (a consumer route) applies to the
// clients of its namespace alone, as Linkerd's policy controller builds
// its watches (policy-controller/k8s/index/src/outbound/index.rs: producer
// routes in every namespace's watch, consumer routes only in their own).
// A change to a consumer route reaches the streams of its namespace.
func TestConsumerRoutesOnlyForTheirNamespace(t *testing.T) {
	consumer := func(prefix string) string {
		return `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web-view, namespace: web}
spec:
  parentRefs: [{group: core, kind: Service, name: authors, namespace: default, port: 7001}]
  rules: [{matches: [{path: {type: PathPrefix, value: ` + prefix + `}}]}]
`
	}
	producer := `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: authors-api, namespace: default}
spec:
  parentRefs: [{group: core, kind: Service, name: authors, port: 7001}]
  rules: [{matches: [{path: {type: PathPrefix, value: /api}}]}]
`
	store := NewStore()
	store.SetManifests(resources(t, authorsServiceYAML, producer, consumer("/web")))
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	cc, err := grpc.NewClient(cp.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	api := outboundpb.NewOutboundPoliciesClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	routes := func(p *outboundpb.OutboundPolicy) []string {
		var names []string
		for _, r := range p.GetProtocol().GetDetect().GetHttp1().GetRoutes() {
			res := r.GetMetadata().GetResource()
			var prefix string
			for _, rule := range r.GetRules() {
				for _, m := range rule.GetMatches() {
					prefix = m.GetPath().GetPrefix()
				}
			}
			names = append(names, res.GetNamespace()+"/"+res.GetName()+prefix)
		}
		return names
	}
	spec := func(workload string) *outboundpb.TrafficSpec {
		return &outboundpb.TrafficSpec{SourceWorkload: workload, Target: &outboundpb.TrafficSpec_Authority{Authority: authorsAuthority}}
	}
	for _, tc := range []struct {
		workload string
		want     []string
	}{
		{`{"ns":"web","pod":"web-0"}`, []string{"default/authors-api/api", "web/web-view/web"}},
		{"web:web-0", []string{"default/authors-api/api", "web/web-view/web"}},
		{"shop:shop-0", []string{"default/authors-api/api"}},
		{"default:authors-0", []string{"default/authors-api/api"}},
	} {
		p, err := api.Get(ctx, spec(tc.workload))
		require.NoError(t, err)
		assert.ElementsMatch(t, tc.want, routes(p), tc.workload)
	}

	web, err := api.Watch(ctx, spec("web:web-0"))
	require.NoError(t, err)
	p, err := recvTimeout(t, web.Recv)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"default/authors-api/api", "web/web-view/web"}, routes(p))
	store.SetManifests(resources(t, authorsServiceYAML, producer, consumer("/web2")))
	p, err = recvTimeout(t, web.Recv)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"default/authors-api/api", "web/web-view/web2"}, routes(p), "the consumer's change reaches its namespace")
}
