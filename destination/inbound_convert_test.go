package destination_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

const inboundYAML = `
apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: shop, labels: {app: books}}
spec:
  containers:
  - name: books
    ports: [{name: http, containerPort: 7000}]
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: books-http, namespace: shop, annotations: {inmesh.io/max-concurrent-requests: "64"}}
spec:
  podSelector: {matchLabels: {app: books}}
  port: http
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: web-and-shop, namespace: shop}
spec:
  identities: ["web.shop.serviceaccount.identity.linkerd.cluster.local", "*.shop.serviceaccount.identity.linkerd.cluster.local"]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: NetworkAuthentication
metadata: {name: pods, namespace: shop}
spec:
  networks: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16]}, {cidr: "fd00::/8"}]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: books-from-web, namespace: shop}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books-http}
  requiredAuthenticationRefs:
  - {group: policy.linkerd.io, kind: MeshTLSAuthentication, name: web-and-shop}
  - {group: policy.linkerd.io, kind: NetworkAuthentication, name: pods}
---
apiVersion: policy.linkerd.io/v1beta3
kind: HTTPRoute
metadata: {name: orders, namespace: shop}
spec:
  parentRefs: [{group: policy.linkerd.io, kind: Server, name: books-http}]
  rules:
  - matches: [{path: {type: Exact, value: /orders}, method: POST}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {add: [{name: x-from, value: mesh}]}
---
apiVersion: policy.linkerd.io/v1alpha1
kind: HTTPLocalRateLimitPolicy
metadata: {name: books, namespace: shop}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books-http}
  total: {requestsPerSecond: 100}
  identity: {requestsPerSecond: 20}
  overrides:
  - requestsPerSecond: 50
    clientRefs: [{kind: ServiceAccount, name: web}]
`

// TestInboundServerWireRoundTrip: the inbound policy a pod port gets from
// its manifests survives the InboundServerPolicies wire form both ways,
// and its encoding carries what Linkerd's controller sends: the Server's
// meta in its labels map, each authorization's metadata and labels, the
// detect protocol's 10 s timeout, routes and rate limit.
func TestInboundServerWireRoundTrip(t *testing.T) {
	res, err := manifest.Parse([]byte(inboundYAML))
	require.NoError(t, err)
	for _, port := range []uint16{7000, 9090} {
		srv, err := res.InboundServer("shop", "books-0", port, manifest.InboundOptions{
			ProbeNetworks: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}})
		require.NoError(t, err)
		msg := destination.ServerToProto(srv)
		b, err := proto.Marshal(msg)
		require.NoError(t, err)
		var back inboundpb.Server
		require.NoError(t, proto.Unmarshal(b, &back))
		got, err := destination.ServerFromProto(&back)
		require.NoError(t, err)
		assert.Empty(t, cmp.Diff(srv, got, cmpopts.EquateEmpty(), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
			cmpopts.IgnoreUnexported(policy.HeaderMatch{})), "port %d", port)
		_, err = authz.Compile(got)
		require.NoError(t, err)
	}

	srv, err := res.InboundServer("shop", "books-0", 7000, manifest.InboundOptions{})
	require.NoError(t, err)
	msg := destination.ServerToProto(srv)
	require.Equal(t, 64, srv.MaxConcurrentRequests)
	assert.Equal(t, map[string]string{"group": "policy.linkerd.io", "kind": "server", "name": "books-http",
		authz.AnnotationMaxConcurrentRequests: "64"}, msg.GetLabels(), "inmesh's limit of requests in flight as one more label")
	d := msg.GetProtocol().GetDetect()
	require.NotNil(t, d)
	assert.Equal(t, destination.InboundDetectTimeout, d.GetTimeout().AsDuration())
	assert.Equal(t, uint32(100), d.GetHttpLocalRateLimit().GetTotal().GetRequestsPerSecond())
	require.Len(t, d.GetHttpRoutes(), 1)
	require.Len(t, msg.GetAuthorizations(), 1)
	a := msg.GetAuthorizations()[0]
	assert.Equal(t, "authorizationpolicy", a.GetMetadata().GetResource().GetKind())
	assert.Equal(t, "authorizationpolicy", a.GetLabels()["kind"])
	ids := a.GetAuthentication().GetMeshTLS().GetIdentities()
	require.NotNil(t, ids)
	assert.Len(t, ids.GetIdentities(), 1)
	assert.Equal(t, []string{"shop", "serviceaccount", "identity", "linkerd", "cluster", "local"}, ids.GetSuffixes()[0].GetParts())
}

// TestInboundServerFromProtoErrorsNameTheField: a malformed Server is an
// error naming the field.
func TestInboundServerFromProtoErrorsNameTheField(t *testing.T) {
	_, err := destination.ServerFromProto(&inboundpb.Server{})
	assert.ErrorContains(t, err, "protocol.kind: no protocol set")
	_, err = destination.ServerFromProto(&inboundpb.Server{
		Protocol:       &inboundpb.ProxyProtocol{Kind: &inboundpb.ProxyProtocol_Opaque_{Opaque: &inboundpb.ProxyProtocol_Opaque{}}},
		Authorizations: []*inboundpb.Authz{{}},
	})
	assert.ErrorContains(t, err, "authorizations[0].authentication.permit: no permit set")
	_, err = destination.ServerFromProto(&inboundpb.Server{
		Protocol: &inboundpb.ProxyProtocol{Kind: &inboundpb.ProxyProtocol_Opaque_{Opaque: &inboundpb.ProxyProtocol_Opaque{}}},
		Labels:   map[string]string{authz.AnnotationMaxConcurrentRequests: "many"},
	})
	assert.ErrorContains(t, err, `labels: annotations["inmesh.io/max-concurrent-requests"]: "many" is not a positive integer`)
}

// TestInboundGRPCServerWireRoundTrip: a gRPC Server's routes (service and
// method matches, header matches, header modifiers and failure injection,
// route-level authorizations) survive the wire both ways.
func TestInboundGRPCServerWireRoundTrip(t *testing.T) {
	srv := &authz.Server{
		Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-grpc"},
		Protocol: authz.ProtocolGRPC,
		Authorizations: []authz.Authz{{Meta: authz.DefaultMeta("all-unauthenticated"),
			Networks: []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}}}},
		GRPCRoutes: []authz.GRPCRoute{{
			Meta: authz.Meta{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Name: "books"},
			Rules: []authz.GRPCRule{{
				Matches: []policy.GRPCRouteMatch{{Service: "books.Books", Method: "Get",
					Headers: []policy.HeaderMatch{{Name: "x-tenant", Value: "a"}}}},
				Filters: []policy.Filter{
					{RequestHeaders: &policy.HeaderModifier{Set: []policy.Header{{Name: "x-from", Value: "mesh"}}}},
					{GRPCFailureInjector: &policy.GRPCFailureInjector{Code: 14, Message: "injected", Ratio: policy.Ratio{Numerator: 1, Denominator: 2}}},
				},
			}},
			Authorizations: []authz.Authz{{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "web"},
				Networks:       []authz.Network{{Net: netip.MustParsePrefix("10.0.0.0/8"), Except: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}},
				Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Suffixes: [][]string{{"default", "serviceaccount"}}}}}},
		}},
	}
	b, err := proto.Marshal(destination.ServerToProto(srv))
	require.NoError(t, err)
	var back inboundpb.Server
	require.NoError(t, proto.Unmarshal(b, &back))
	require.Len(t, back.GetProtocol().GetGrpc().GetRoutes(), 1)
	got, err := destination.ServerFromProto(&back)
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(srv, got, cmpopts.EquateEmpty(), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
		cmpopts.IgnoreUnexported(policy.HeaderMatch{})))
	_, err = authz.Compile(got)
	require.NoError(t, err)
}

// An override of a Server's rate limit that limits nobody is left out, and
// the Server stands, as Linkerd's proxy reads it
// (linkerd/proxy/server-policy/src/local_rate_limit.rs): Linkerd's
// controller sends an HTTPLocalRateLimitPolicy override with empty
// clientRefs as one without identities.
func TestInboundRateLimitOverridesAsLinkerdReadsThem(t *testing.T) {
	ids := func(names ...string) *inboundpb.HttpLocalRateLimit_Override_ClientIdentities {
		c := &inboundpb.HttpLocalRateLimit_Override_ClientIdentities{}
		for _, n := range names {
			c.Identities = append(c.Identities, &inboundpb.Identity{Name: n})
		}
		return c
	}
	rps := func(n uint32) *inboundpb.HttpLocalRateLimit_Limit {
		return &inboundpb.HttpLocalRateLimit_Limit{RequestsPerSecond: n}
	}
	for _, tt := range []struct {
		name      string
		overrides []*inboundpb.HttpLocalRateLimit_Override
		want      []authz.Override
	}{
		{"no clients", []*inboundpb.HttpLocalRateLimit_Override{{Limit: rps(10), Clients: ids()}}, nil},
		{"no client list", []*inboundpb.HttpLocalRateLimit_Override{{Limit: rps(10)}}, nil},
		{"no rate", []*inboundpb.HttpLocalRateLimit_Override{{Clients: ids("a.ns.serviceaccount.identity.linkerd.cluster.local")}}, nil},
		{"zero rate", []*inboundpb.HttpLocalRateLimit_Override{{Limit: rps(0), Clients: ids("a.ns.serviceaccount.identity.linkerd.cluster.local")}}, nil},
		{"an empty name among others", []*inboundpb.HttpLocalRateLimit_Override{{Limit: rps(5), Clients: ids("", "a.ns.serviceaccount.identity.linkerd.cluster.local")}},
			[]authz.Override{{RPS: 5, Identities: []string{"a.ns.serviceaccount.identity.linkerd.cluster.local"}}}},
		{"the others kept", []*inboundpb.HttpLocalRateLimit_Override{{Limit: rps(10), Clients: ids()}, {Limit: rps(5), Clients: ids("b.ns.serviceaccount.identity.linkerd.cluster.local")}},
			[]authz.Override{{RPS: 5, Identities: []string{"b.ns.serviceaccount.identity.linkerd.cluster.local"}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := destination.ServerFromProto(&inboundpb.Server{
				Protocol: &inboundpb.ProxyProtocol{Kind: &inboundpb.ProxyProtocol_Detect_{Detect: &inboundpb.ProxyProtocol_Detect{
					HttpLocalRateLimit: &inboundpb.HttpLocalRateLimit{Total: rps(100), Overrides: tt.overrides}}}},
			})
			require.NoError(t, err)
			require.NotNil(t, s.RateLimit)
			assert.Equal(t, uint32(100), s.RateLimit.Total)
			assert.Equal(t, tt.want, s.RateLimit.Overrides)
			_, err = authz.Compile(s)
			assert.NoError(t, err, "the Server compiles")
		})
	}
}
