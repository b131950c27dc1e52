package controlplane

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/grpcroutepb"
	"github.com/inmesh/inmesh/proxyapi/httproutepb"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The cluster the answers tests serve, from files as a user writes them.
const (
	booksID = "books.default.serviceaccount.identity.linkerd.cluster.local"

	answersManifests = `
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 7000}, {name: postgres, port: 5432}]
---
apiVersion: v1
kind: Service
metadata:
  name: mysql
  namespace: default
  annotations: {config.linkerd.io/opaque-ports: "8080,9000-9001,admin"}
spec:
  ports: [{name: http, port: 8080}, {name: mysql, port: 3306}, {name: extra, port: 9001}, {name: admin, port: 9100}]
---
apiVersion: v1
kind: Pod
metadata: {name: pod-0, namespace: default, labels: {app: greeter}}
spec: {containers: [{name: greeter}]}
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: greeter-grpc, namespace: default}
spec: {podSelector: {matchLabels: {app: greeter}}, port: 8090, proxyProtocol: gRPC}
`

	answersEndpoints = `
- authority: books.default.svc.cluster.local:7000
  endpoints:
  - addr: 10.0.0.5:7000
    h2: true
    identity: ` + booksID + `
    labels: {pod: books-0}
  - addr: 10.0.0.6:7000
    opaque: true
    identity: ` + booksID + `
- authority: books.default.svc.cluster.local:5432
  endpoints:
  - addr: 10.0.0.5:5432
    h2: true
    identity: ` + booksID + `
  - addr: 10.0.0.6:5432
    h2: true
    opaque: false
    identity: ` + booksID + `
- authority: empty.default.svc.cluster.local:80
  endpoints: []
`
)

// answersPlane serves answersManifests and answersEndpoints, loaded from
// files, over a real gRPC connection.
func answersPlane(t *testing.T) (*Store, *grpc.ClientConn) {
	t.Helper()
	dir := t.TempDir()
	man := filepath.Join(dir, "manifests")
	require.NoError(t, os.Mkdir(man, 0o755))
	writeFile(t, filepath.Join(man, "cluster.yaml"), answersManifests)
	eps := filepath.Join(dir, "endpoints.yaml")
	writeFile(t, eps, answersEndpoints)
	store := NewStore()
	require.NoError(t, store.LoadManifests(filepath.Join(man, "cluster.yaml")))
	require.NoError(t, store.LoadEndpoints(eps))
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	cc, err := grpc.NewClient(cp.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return store, cc
}

func tlsID(id string) *pb.TlsIdentity {
	name := &pb.TlsIdentity_DnsLikeIdentity{Name: id}
	return &pb.TlsIdentity{Strategy: &pb.TlsIdentity_DnsLikeIdentity_{DnsLikeIdentity: name}, ServerName: name}
}

func hintH2() *pb.ProtocolHint {
	return &pb.ProtocolHint{Protocol: &pb.ProtocolHint_H2_{H2: &pb.ProtocolHint_H2{}}}
}

func hintOpaque() *pb.ProtocolHint {
	return &pb.ProtocolHint{Protocol: &pb.ProtocolHint_Opaque_{Opaque: &pb.ProtocolHint_Opaque{}}}
}

func tcpAddr(t *testing.T, s string) *pb.TcpAddress {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	require.NoError(t, err)
	return destination.AddrToProto(ap)
}

// TestGetAnswersAsLinkerd: Destination Get answers as Linkerd's controller
// (item 17 of issue 28), each case naming the upstream file that decides
// it and the upstream test it follows when there is one.
func TestGetAnswersAsLinkerd(t *testing.T) {
	_, cc := answersPlane(t)
	api := pb.NewDestinationClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	setLabels := map[string]string{"namespace": "default", "service": "books"}

	for _, tc := range []struct {
		name, upstream string
		path           string
		want           *pb.Update
		code           codes.Code
		msg            string
	}{
		{
			name: "an identity is also the TLS server name; a meshed endpoint is hinted h2",
			// createWeightedAddr sets TlsIdentity.ServerName to the identity.
			upstream: "controller/api/destination/endpoint_translator.go (createWeightedAddr); server_test.go TestGet \"Returns endpoints (IPv4)\"",
			path:     "books.default.svc.cluster.local:7000",
			want: &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{MetricLabels: setLabels, Addrs: []*pb.WeightedAddr{
				{Addr: tcpAddr(t, "10.0.0.5:7000"), Weight: 10000, MetricLabels: map[string]string{"pod": "books-0"}, TlsIdentity: tlsID(booksID), ProtocolHint: hintH2()},
				{Addr: tcpAddr(t, "10.0.0.6:7000"), Weight: 10000, TlsIdentity: tlsID(booksID), ProtocolHint: hintOpaque()},
			}}}},
		},
		{
			name:     "a meshed endpoint on a default opaque port is hinted opaque, unless the file says opaque: false",
			upstream: "controller/api/destination/endpoint_translator.go (createWeightedAddr: opaque port wins over h2); server_test.go TestGet \"Return endpoint opaque protocol controlled by a server\"",
			path:     "books.default.svc.cluster.local:5432",
			want: &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{MetricLabels: setLabels, Addrs: []*pb.WeightedAddr{
				{Addr: tcpAddr(t, "10.0.0.5:5432"), Weight: 10000, TlsIdentity: tlsID(booksID), ProtocolHint: hintOpaque()},
				{Addr: tcpAddr(t, "10.0.0.6:5432"), Weight: 10000, TlsIdentity: tlsID(booksID), ProtocolHint: hintH2()},
			}}}},
		},
		{
			name:     "a Service that does not exist",
			upstream: "controller/api/destination/server.go (Get: kerrors.IsNotFound)",
			path:     "nosuch.default.svc.cluster.local:80",
			code:     codes.NotFound, msg: "Service nosuch.default not found",
		},
		{
			name:     "a name outside the cluster",
			upstream: "controller/api/destination/server.go (Get: parseK8sServiceName); server_test.go TestGet \"Returns error if not valid service name\"",
			path:     "linkerd.io:80",
			code:     codes.InvalidArgument, msg: "Invalid authority: linkerd.io:80",
		},
		{
			name:     "a name with too many labels",
			upstream: "controller/api/destination/server.go (parseK8sServiceName: invalid k8s service)",
			path:     "a.b.c.d.svc.cluster.local:80",
			code:     codes.InvalidArgument, msg: "Invalid authority: a.b.c.d.svc.cluster.local:80",
		},
		{
			name:     "an IP address",
			upstream: "controller/api/destination/server.go (Get: IP queries)",
			path:     "10.0.0.5:7000",
			code:     codes.InvalidArgument, msg: "IP queries not supported by Get API: host=10.0.0.5",
		},
		{
			name:     "a bad port",
			upstream: "controller/api/destination/server.go (getHostAndPort)",
			path:     "books.default.svc.cluster.local:0",
			code:     codes.InvalidArgument, msg: "Invalid authority: books.default.svc.cluster.local:0",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Logf("upstream: %s", tc.upstream)
			st, err := api.Get(ctx, &pb.GetDestination{Path: tc.path})
			require.NoError(t, err)
			m, err := recvTimeout(t, st.Recv)
			if tc.code != codes.OK {
				require.Equal(t, tc.code, status.Code(err), "%v", err)
				assert.Equal(t, tc.msg, status.Convert(err).Message())
				return
			}
			require.NoError(t, err)
			assert.Empty(t, cmp.Diff(tc.want, m, protocmp.Transform()))
		})
	}
}

// TestGetSaysNothingWithoutEndpoints: a Service port without endpoints, or
// a port the Service does not declare, gets no message at all until it has
// endpoints (controller/api/destination/watcher/filtered_listener_group.go
// publishNoEndpoints sends only removes; Linkerd never sends
// no_endpoints); endpoints that go away are removed.
func TestGetSaysNothingWithoutEndpoints(t *testing.T) {
	store, cc := answersPlane(t)
	api := pb.NewDestinationClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	for _, authority := range []string{
		"empty.default.svc.cluster.local:80",   // a Service without endpoints
		"books.default.svc.cluster.local:7001", // a port books does not declare
	} {
		t.Run(authority, func(t *testing.T) {
			st, err := api.Get(ctx, &pb.GetDestination{Path: authority})
			require.NoError(t, err)
			type result struct {
				m   *pb.Update
				err error
			}
			first := make(chan result, 1)
			go func() {
				m, err := st.Recv()
				first <- result{m, err}
			}()
			// An absence: the old answer, no_endpoints, came at once.
			select {
			case r := <-first:
				t.Fatalf("a message for a Service port without endpoints: %v %v", r.m, r.err)
			case <-time.After(300 * time.Millisecond):
			}
			store.PutEndpoints(authority, []endpoint.Endpoint{endpoint1})
			var r result
			select {
			case r = <-first:
			case <-time.After(defaultTestTimeout):
				t.Fatal("no message after the endpoints came")
			}
			m, err := r.m, r.err
			require.NoError(t, err)
			require.NotNil(t, m.GetAdd(), "the first message is the first endpoint, not no_endpoints: %v", m)
			assert.Len(t, m.GetAdd().GetAddrs(), 1)
			store.PutEndpoints(authority, nil)
			m, err = recvTimeout(t, st.Recv)
			require.NoError(t, err)
			assert.Empty(t, cmp.Diff(&pb.Update{Update: &pb.Update_Remove{Remove: &pb.AddrSet{Addrs: []*pb.TcpAddress{tcpAddr(t, "10.0.0.9:80")}}}},
				m, protocmp.Transform()), "an emptied set is a remove")
		})
	}
}

var endpoint1 = ep("10.0.0.9:80", false)

// TestGetProfileAnswersAsLinkerd: Destination GetProfile answers as
// Linkerd's controller (item 18 of issue 28).
func TestGetProfileAnswersAsLinkerd(t *testing.T) {
	_, cc := answersPlane(t)
	api := pb.NewDestinationClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	budget := &pb.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, Ttl: durationpb.New(10 * time.Second)}
	svcRefs := func(name string, port uint32) (parent, profile *pb.Metadata) {
		return &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{Group: "core", Kind: "Service", Name: name, Namespace: "default", Port: port}}},
			&pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{Group: "linkerd.io"}}}
	}
	serviceProfile := func(name string, port uint32, opaque bool) *pb.DestinationProfile {
		parent, profile := svcRefs(name, port)
		return &pb.DestinationProfile{FullyQualifiedName: name + ".default.svc.cluster.local", RetryBudget: budget,
			OpaqueProtocol: opaque, ParentRef: parent, ProfileRef: profile}
	}

	for _, tc := range []struct {
		name, upstream string
		path           string
		want           *pb.DestinationProfile
		code           codes.Code
		msg            string
	}{
		{
			name:     "the Service's opaque-ports annotation makes a port opaque",
			upstream: "controller/api/destination/watcher/opaque_ports_watcher.go, opaque_ports_adaptor.go; server_test.go TestGetProfiles \"Return opaque protocol profile when using service name with opaque port annotation\"",
			path:     "mysql.default.svc.cluster.local:8080",
			want:     serviceProfile("mysql", 8080, true),
		},
		{
			name:     "a range of the annotation",
			upstream: "controller/api/destination/watcher/opaque_ports_watcher.go (parseServiceOpaquePorts)",
			path:     "mysql.default.svc.cluster.local:9001",
			want:     serviceProfile("mysql", 9001, true),
		},
		{
			name:     "the annotation names a port of the Service",
			upstream: "controller/api/destination/watcher/opaque_ports_watcher.go (parseServiceOpaquePorts, isNamed)",
			path:     "mysql.default.svc.cluster.local:9100",
			want:     serviceProfile("mysql", 9100, true),
		},
		{
			name:     "the annotation replaces the default opaque ports",
			upstream: "controller/api/destination/watcher/opaque_ports_watcher.go (addService)",
			path:     "mysql.default.svc.cluster.local:3306",
			want:     serviceProfile("mysql", 3306, false),
		},
		{
			name:     "without the annotation, Linkerd's default opaque ports",
			upstream: "controller/api/destination/watcher/opaque_ports_watcher.go (Subscribe: defaultOpaquePorts)",
			path:     "books.default.svc.cluster.local:5432",
			want:     serviceProfile("books", 5432, true),
		},
		{
			name:     "another port is not opaque",
			upstream: "controller/api/destination/profile_translator.go (toServiceProfile)",
			path:     "books.default.svc.cluster.local:7000",
			want:     serviceProfile("books", 7000, false),
		},
		{
			name:     "a port the Service does not define gets an empty profile",
			upstream: "controller/api/destination/server.go (subscribeToServiceProfile: svcDefinesPort)",
			path:     "books.default.svc.cluster.local:7001",
			want:     &pb.DestinationProfile{},
		},
		{
			name:     "a ClusterIP gets its Service's profile",
			upstream: "controller/api/destination/server.go (getProfileByIP, getSvcID); server_test.go TestGetProfiles \"Return profile when using cluster IP\"",
			path:     "10.96.0.10:7000",
			want:     serviceProfile("books", 7000, false),
		},
		{
			name:     "a pod IP gets its endpoint: address, labels, identity, hint",
			upstream: "controller/api/destination/endpoint_profile_translator.go; server_test.go TestGetProfiles \"Return profile with endpoint when using pod IP\"",
			path:     "10.0.0.5:7000",
			want: &pb.DestinationProfile{RetryBudget: budget, Endpoint: &pb.WeightedAddr{Addr: tcpAddr(t, "10.0.0.5:7000"), Weight: 10000,
				MetricLabels: map[string]string{"pod": "books-0", "namespace": "default"}, TlsIdentity: tlsID(booksID), ProtocolHint: hintH2()}},
		},
		{
			name:     "a pod IP on an opaque port",
			upstream: "controller/api/destination/endpoint_profile_translator.go; server_test.go TestGetProfiles \"Return opaque protocol profile with endpoint when using pod IP and opaque protocol port\"",
			path:     "10.0.0.5:5432",
			want: &pb.DestinationProfile{RetryBudget: budget, OpaqueProtocol: true, Endpoint: &pb.WeightedAddr{Addr: tcpAddr(t, "10.0.0.5:5432"), Weight: 10000,
				MetricLabels: map[string]string{"namespace": "default"}, TlsIdentity: tlsID(booksID), ProtocolHint: hintOpaque()}},
		},
		{
			name:     "an address outside the cluster on a default opaque port",
			upstream: "server_test.go TestGetProfiles \"Return profile with opaque protocol when using an opaque port with an external IP\"",
			path:     "172.0.0.1:3306",
			want:     &pb.DestinationProfile{RetryBudget: budget, OpaqueProtocol: true, Endpoint: &pb.WeightedAddr{Addr: tcpAddr(t, "172.0.0.1:3306"), Weight: 10000}},
		},
		{
			name:     "an address outside the cluster on another port",
			upstream: "server_test.go TestGetProfiles \"Return default profile when IP does not map to service or pod\", \"... non-opaque protocol when using an arbitrary port with an external IP\"",
			path:     "172.0.0.1:80",
			want:     &pb.DestinationProfile{RetryBudget: budget, Endpoint: &pb.WeightedAddr{Addr: tcpAddr(t, "172.0.0.1:80"), Weight: 10000}},
		},
		{
			name:     "a Service that does not exist",
			upstream: "controller/api/destination/server.go (subscribeToServiceProfile: the lister's error, code Unknown)",
			path:     "nosuch.default.svc.cluster.local:80",
			code:     codes.Unknown, msg: `service "nosuch" not found`,
		},
		{
			name:     "a name outside the cluster",
			upstream: "controller/api/destination/server.go (getProfileByName); server_test.go TestGetProfiles \"Returns error if not valid service name\"",
			path:     "linkerd.io:80",
			code:     codes.InvalidArgument, msg: `invalid service "linkerd.io": "name linkerd.io does not match cluster domain cluster.local"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Logf("upstream: %s", tc.upstream)
			st, err := api.GetProfile(ctx, &pb.GetDestination{Path: tc.path})
			require.NoError(t, err)
			m, err := recvTimeout(t, st.Recv)
			if tc.code != codes.OK {
				require.Equal(t, tc.code, status.Code(err), "%v", err)
				assert.Equal(t, tc.msg, status.Convert(err).Message())
				return
			}
			require.NoError(t, err)
			assert.Empty(t, cmp.Diff(tc.want, m, protocmp.Transform()))
		})
	}
}

// TestPolicyAnswersAsLinkerd: OutboundPolicies and InboundServerPolicies
// answer as Linkerd's policy controller (item 19 of issue 28).
func TestPolicyAnswersAsLinkerd(t *testing.T) {
	store, cc := answersPlane(t)
	out := outboundpb.NewOutboundPoliciesClient(cc)
	in := inboundpb.NewInboundServerPoliciesClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	spec := func(authority string) *outboundpb.TrafficSpec {
		return &outboundpb.TrafficSpec{SourceWorkload: "default:pod-0", Target: &outboundpb.TrafficSpec_Authority{Authority: authority}}
	}

	t.Run("every HTTP rule carries timeouts, empty when none is set", func(t *testing.T) {
		t.Log("upstream: policy-controller/grpc/src/outbound/http.rs (convert_outbound_route, default_outbound_service_route: timeouts: Some(...))")
		p, err := out.Get(ctx, spec("books.default.svc.cluster.local:7000"))
		require.NoError(t, err)
		detect := p.GetProtocol().GetDetect()
		for _, routes := range [][]*outboundpb.HttpRoute{detect.GetHttp1().GetRoutes(), detect.GetHttp2().GetRoutes()} {
			require.NotEmpty(t, routes)
			for _, r := range routes {
				for _, rule := range r.GetRules() {
					require.NotNil(t, rule.GetTimeouts(), "rule of %v", r.GetMetadata())
					assert.True(t, proto.Equal(&httproutepb.Timeouts{}, rule.GetTimeouts()))
				}
			}
		}
	})
	t.Run("every gRPC rule carries timeouts, empty when none is set", func(t *testing.T) {
		t.Log("upstream: policy-controller/grpc/src/outbound/grpc.rs (timeouts: Some(http_route::Timeouts{...}))")
		r, err := manifest.Parse([]byte(answersManifests + `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: books-grpc, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules: [{matches: [{method: {service: books.Books}}]}]
`))
		require.NoError(t, err)
		store.SetManifests(r)
		defer func() {
			r, err := manifest.Parse([]byte(answersManifests))
			require.NoError(t, err)
			store.SetManifests(r)
		}()
		p, err := out.Get(ctx, spec("books.default.svc.cluster.local:7000"))
		require.NoError(t, err)
		routes := p.GetProtocol().GetGrpc().GetRoutes()
		require.NotEmpty(t, routes)
		for _, route := range routes {
			for _, rule := range route.GetRules() {
				require.NotNil(t, rule.GetTimeouts())
				assert.True(t, proto.Equal(&httproutepb.Timeouts{}, rule.GetTimeouts()))
			}
		}
	})
	t.Run("a Service that does not exist is NotFound unknown target", func(t *testing.T) {
		t.Log("upstream: policy-controller/grpc/src/outbound.rs (get and watch: Ok(None) => not_found(\"unknown target\"))")
		_, err := out.Get(ctx, spec("nosuch.default.svc.cluster.local:80"))
		require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
		assert.Equal(t, "unknown target", status.Convert(err).Message())
		st, err := out.Watch(ctx, spec("nosuch.default.svc.cluster.local:80"))
		require.NoError(t, err)
		_, err = recvTimeout(t, st.Recv)
		require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
		assert.Equal(t, "unknown target", status.Convert(err).Message())
	})
	t.Run("a gRPC Server without GRPCRoutes gets the default gRPC route", func(t *testing.T) {
		t.Log("upstream: policy-controller/core/src/inbound.rs (InboundRoute<GrpcRouteMatch>::default), k8s/index/src/inbound/index.rs (grpc_routes)")
		srv, err := in.GetPort(ctx, &inboundpb.PortSpec{Workload: "default:pod-0", Port: 8090})
		require.NoError(t, err)
		want := []*inboundpb.GrpcRoute{{
			Metadata: &pb.Metadata{Kind: &pb.Metadata_Default{Default: "default"}},
			Rules:    []*inboundpb.GrpcRoute_Rule{{Matches: []*grpcroutepb.GrpcRouteMatch{{Rpc: &grpcroutepb.GrpcRpcMatch{}}}}},
		}}
		assert.Empty(t, cmp.Diff(want, srv.GetProtocol().GetGrpc().GetRoutes(), protocmp.Transform()))
	})
}
