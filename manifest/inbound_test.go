package manifest

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pod0 is the pod of Linkerd's index tests (mk_pod "ns-0", "pod-0"),
// labelled app=app-0, with a named port admin=8080 and HTTP probes of 5432.
const pod0 = `
apiVersion: v1
kind: Pod
metadata:
  name: pod-0
  namespace: ns-0
  labels: {app: app-0}
spec:
  serviceAccountName: sa-0
  containers:
  - name: container-0
    ports:
    - {name: admin, containerPort: 8080, protocol: TCP}
    - {name: db, containerPort: 5432}
    livenessProbe:
      httpGet: {path: /liveness-container-1, port: 5432}
    readinessProbe:
      httpGet: {path: "/ready-container-1?verbose=1", port: db}
  initContainers:
  - name: init-0
    ports:
    - {name: metrics, containerPort: 9990}
`

func server(name, port, extra string) string {
	return `
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata:
  name: ` + name + `
  namespace: ns-0
` + extra + `
spec:
  podSelector: {matchLabels: {app: app-0}}
  port: ` + port + `
  proxyProtocol: HTTP/1
`
}

// inbound builds the Server of pod-0's port and checks that authz compiles it.
func inbound(t *testing.T, r *Resources, port uint16, opts InboundOptions) *authz.Server {
	t.Helper()
	s, err := r.InboundServer("ns-0", "pod-0", port, opts)
	require.NoError(t, err)
	_, err = authz.Compile(s)
	require.NoError(t, err)
	return s
}

var defaultRoute = authz.Route{
	Meta:  authz.DefaultMeta("default"),
	Rules: []authz.Rule{{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/"}}}}},
}

func allNetworks() []authz.Network {
	return []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}, {Net: netip.MustParsePrefix("::/0")}}
}

// TestInboundServerSelection ports the Server selection cases of Linkerd's
// policy controller: policy-controller/k8s/index/src/inbound/tests/server.rs
// (links_named_server_port, links_unnamed_server_port,
// server_update_deselects_pod) and policy-test/tests/inbound_api.rs
// (servers_ordered_by_creation).
func TestInboundServerSelection(t *testing.T) {
	for _, tc := range []struct {
		name, upstream string
		docs           []string
		port           uint16
		want           authz.Meta
	}{
		{"named port", "tests/server.rs links_named_server_port",
			[]string{server("srv-admin", "admin", "")}, 8080,
			authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "srv-admin"}},
		{"named port of an init container", "workload.rs pod_tcp_ports_by_name",
			[]string{server("srv-metrics", "metrics", "")}, 9990,
			authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "srv-metrics"}},
		{"named port elsewhere is not selected", "tests/server.rs links_named_server_port",
			[]string{server("srv-admin", "admin", "")}, 8081,
			authz.DefaultMeta("all-unauthenticated")},
		{"unnamed port", "tests/server.rs links_unnamed_server_port",
			[]string{server("srv-8080", "8080", "")}, 8080,
			authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "srv-8080"}},
		{"server deselects pod", "tests/server.rs server_update_deselects_pod",
			[]string{`
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: srv-0, namespace: ns-0}
spec:
  podSelector: {matchLabels: {label: value}}
  port: 2222
`}, 2222, authz.DefaultMeta("all-unauthenticated")},
		{"server in another namespace", "index.rs reindex_servers",
			[]string{`
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: srv-0, namespace: ns-1}
spec: {podSelector: {}, port: 8080}
`}, 8080, authz.DefaultMeta("all-unauthenticated")},
		{"match expressions", "CRD podSelector",
			[]string{`
apiVersion: policy.linkerd.io/v1beta1
kind: Server
metadata: {name: srv-expr, namespace: ns-0}
spec:
  podSelector:
    matchExpressions:
    - {key: app, operator: In, values: [app-0, app-1]}
    - {key: canary, operator: DoesNotExist}
    - {key: tier, operator: NotIn, values: [db]}
  port: 8080
  proxyProtocol: HTTP/1
`}, 8080, authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "srv-expr"}},
		{"match expressions exclude", "CRD podSelector",
			[]string{`
apiVersion: policy.linkerd.io/v1beta2
kind: Server
metadata: {name: srv-expr, namespace: ns-0}
spec:
  podSelector:
    matchExpressions: [{key: app, operator: NotIn, values: [app-0]}]
  port: 8080
`}, 8080, authz.DefaultMeta("all-unauthenticated")},
		{"older server wins", "policy-test/tests/inbound_api.rs servers_ordered_by_creation",
			[]string{
				server("srv-a", "8080", "  creationTimestamp: 2024-01-02T00:00:00Z"),
				server("srv-b", "8080", "  creationTimestamp: 2024-01-01T00:00:00Z"),
			}, 8080, authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "srv-b"}},
		{"same age: first by name", "index.rs reindex_servers",
			[]string{server("srv-b", "8080", ""), server("srv-a", "admin", "")}, 8080,
			authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "srv-a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustParse(t, append([]string{pod0}, tc.docs...)...)
			s := inbound(t, r, tc.port, InboundOptions{})
			assert.Equal(t, tc.want, s.Meta, "upstream: %s", tc.upstream)
			if !s.Meta.IsDefault() {
				assert.Equal(t, authz.ProtocolHTTP1, s.Protocol)
				// accessPolicy defaults to deny: no authorizations.
				assert.Empty(t, s.Authorizations)
				assert.Equal(t, []authz.Route{defaultRoute}, s.Routes)
			}
		})
	}
}

func TestInboundUnknownPod(t *testing.T) {
	r := mustParse(t, pod0)
	_, err := r.InboundServer("ns-0", "pod-1", 8080, InboundOptions{})
	assert.ErrorContains(t, err, "ns-0/pod-1:8080: unknown pod")
	_, err = r.InboundServer("ns-1", "pod-0", 8080, InboundOptions{})
	assert.ErrorContains(t, err, "unknown pod")
}

// TestInboundDefaultModes ports
// policy-controller/k8s/index/src/inbound/tests/annotation.rs
// (default_policy_annotated, opaque_annotated, authenticated_annotated):
// the mode of a port no Server selects, from the pod's annotation or the
// controller's default.
func TestInboundDefaultModes(t *testing.T) {
	cluster := []authz.Network{{Net: netip.MustParsePrefix("10.0.0.0/8")}}
	anyID := authz.Authentication{MeshTLS: &authz.MeshTLS{Suffixes: [][]string{{}}}}
	for _, tc := range []struct {
		name        string
		annotations string
		optsMode    authz.Mode
		want        authz.Mode
		wantAuthz   []authz.Authz
		opaque      bool
	}{
		{name: "controller default", want: authz.AllUnauthenticated,
			wantAuthz: []authz.Authz{{Meta: authz.DefaultMeta("all-unauthenticated"), Networks: allNetworks()}}},
		{name: "controller mode deny", optsMode: authz.Deny, want: authz.Deny},
		{name: "annotated cluster-unauthenticated", optsMode: authz.Deny,
			annotations: `config.linkerd.io/default-inbound-policy: cluster-unauthenticated`,
			want:        authz.ClusterUnauthenticated,
			wantAuthz:   []authz.Authz{{Meta: authz.DefaultMeta("cluster-unauthenticated"), Networks: cluster}}},
		{name: "annotated all-authenticated",
			annotations: `config.linkerd.io/default-inbound-policy: all-authenticated`,
			want:        authz.AllAuthenticated,
			wantAuthz:   []authz.Authz{{Meta: authz.DefaultMeta("all-authenticated"), Networks: allNetworks(), Authentication: anyID}}},
		{name: "annotated audit", annotations: `config.linkerd.io/default-inbound-policy: audit`, want: authz.Audit,
			wantAuthz: []authz.Authz{{Meta: authz.DefaultMeta("audit"), Networks: allNetworks()}}},
		{name: "require identity: all", annotations: `config.linkerd.io/proxy-require-identity-inbound-ports: "2222"`,
			want:      authz.AllAuthenticated,
			wantAuthz: []authz.Authz{{Meta: authz.DefaultMeta("all-authenticated"), Networks: allNetworks(), Authentication: anyID}}},
		{name: "require identity: cluster", optsMode: authz.ClusterUnauthenticated,
			annotations: `config.linkerd.io/proxy-require-identity-inbound-ports: "2000-3000"`,
			want:        authz.ClusterAuthenticated,
			wantAuthz:   []authz.Authz{{Meta: authz.DefaultMeta("cluster-authenticated"), Networks: cluster, Authentication: anyID}}},
		{name: "require identity: deny unchanged", optsMode: authz.Deny,
			annotations: `config.linkerd.io/proxy-require-identity-inbound-ports: "2222"`, want: authz.Deny},
		{name: "require identity: other port", annotations: `config.linkerd.io/proxy-require-identity-inbound-ports: "8080"`,
			want:      authz.AllUnauthenticated,
			wantAuthz: []authz.Authz{{Meta: authz.DefaultMeta("all-unauthenticated"), Networks: allNetworks()}}},
		{name: "opaque", annotations: `config.linkerd.io/opaque-ports: "2222"`, want: authz.AllUnauthenticated, opaque: true,
			wantAuthz: []authz.Authz{{Meta: authz.DefaultMeta("all-unauthenticated"), Networks: allNetworks()}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pod-0\n  namespace: ns-0\n"
			if tc.annotations != "" {
				doc += "  annotations:\n    " + tc.annotations + "\n"
			}
			r := mustParse(t, doc)
			s := inbound(t, r, 2222, InboundOptions{DefaultMode: tc.optsMode,
				ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
			assert.Equal(t, authz.DefaultMeta(string(tc.want)), s.Meta)
			assert.Equal(t, tc.wantAuthz, s.Authorizations)
			if tc.opaque {
				assert.Equal(t, authz.ProtocolOpaque, s.Protocol)
			} else {
				assert.Equal(t, authz.ProtocolDetect, s.Protocol)
			}
			assert.Nil(t, s.RateLimit)
		})
	}
}

const (
	netFoo = `
apiVersion: policy.linkerd.io/v1alpha1
kind: NetworkAuthentication
metadata: {name: net-foo, namespace: ns-0}
spec:
  networks: [{cidr: 10.0.0.0/8}]
`
	mtlsBar = `
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: mtls-bar, namespace: ns-1}
spec:
  identities: [foo.bar]
`
)

func authorizationPolicy(name, target, refs string) string {
	return `
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: ` + name + `, namespace: ns-0}
spec:
  targetRef: ` + target + `
  requiredAuthenticationRefs: ` + refs + "\n"
}

// TestInboundAuthorizationPolicies ports
// policy-controller/k8s/index/src/inbound/tests/authorization_policy.rs
// (links_authorization_policy_with_mtls_name,
// links_authorization_policy_with_service_account,
// authorization_targets_namespace) and the MeshTLSAuthentication identity
// forms of policy-controller/core/src/identity_match.rs (parse_star) and
// .../inbound/meshtls_authentication.rs.
func TestInboundAuthorizationPolicies(t *testing.T) {
	srv := `{group: policy.linkerd.io, kind: Server, name: srv-8080}`
	meta := authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "authz-foo"}
	for _, tc := range []struct {
		name, upstream string
		docs           []string
		opts           InboundOptions
		want           []authz.Authz
	}{
		{"mtls name and network", "authorization_policy.rs links_authorization_policy_with_mtls_name",
			[]string{netFoo, mtlsBar, authorizationPolicy("authz-foo", srv, `
  - {group: policy.linkerd.io, kind: NetworkAuthentication, name: net-foo}
  - {group: policy.linkerd.io, kind: MeshTLSAuthentication, name: mtls-bar, namespace: ns-1}`)},
			InboundOptions{},
			[]authz.Authz{{Meta: meta, Networks: []authz.Network{{Net: netip.MustParsePrefix("10.0.0.0/8")}},
				Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{"foo.bar"}}}}}},
		{"service account", "authorization_policy.rs links_authorization_policy_with_service_account",
			[]string{netFoo, authorizationPolicy("authz-foo", srv, `
  - {group: policy.linkerd.io, kind: NetworkAuthentication, name: net-foo}
  - {kind: ServiceAccount, name: foo}`)},
			InboundOptions{TrustDomain: "cluster.example.com"},
			[]authz.Authz{{Meta: meta, Networks: []authz.Network{{Net: netip.MustParsePrefix("10.0.0.0/8")}},
				Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{
					Identities: []string{"foo.ns-0.serviceaccount.identity.linkerd.cluster.example.com"}}}}}},
		{"namespace target", "authorization_policy.rs authorization_targets_namespace",
			[]string{netFoo, mtlsBar, authorizationPolicy("authz-foo", `{kind: Namespace, name: ns-0}`, `
  - {group: policy.linkerd.io, kind: NetworkAuthentication, name: net-foo}
  - {group: policy.linkerd.io, kind: MeshTLSAuthentication, name: mtls-bar, namespace: ns-1}`)},
			InboundOptions{},
			[]authz.Authz{{Meta: meta, Networks: []authz.Network{{Net: netip.MustParsePrefix("10.0.0.0/8")}},
				Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{"foo.bar"}}}}}},
		{"missing authentication: policy ignored", "authorization_policy.rs links_authorization_policy_with_mtls_name (before the authentications exist)",
			[]string{authorizationPolicy("authz-foo", srv, `
  - {group: policy.linkerd.io, kind: NetworkAuthentication, name: net-foo}
  - {group: policy.linkerd.io, kind: MeshTLSAuthentication, name: mtls-bar, namespace: ns-1}`)},
			InboundOptions{}, nil},
		{"no authentication: unauthenticated from anywhere", "index.rs policy_client_authz",
			[]string{authorizationPolicy("authz-foo", srv, `[]`)},
			InboundOptions{}, []authz.Authz{{Meta: meta, Networks: allNetworks()}}},
		{"identity forms", "core/src/identity_match.rs parse_star; meshtls_authentication.rs",
			[]string{`
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: ids, namespace: ns-0}
spec:
  identities: ["*", "*.a.b", exact.id]
`, authorizationPolicy("authz-foo", srv, `[{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: ids}]`)},
			InboundOptions{TrustDomain: "example.org", ControlNamespace: "mesh"},
			[]authz.Authz{{Meta: meta, Networks: allNetworks(), Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{
				Identities: []string{"exact.id"},
				Suffixes:   [][]string{{}, {"a", "b"}},
			}}}}},
		{"identity references", "meshtls_authentication.rs",
			[]string{`
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: ids, namespace: ns-0}
spec:
  identityRefs:
  - {kind: ServiceAccount, name: web}
  - {kind: ServiceAccount, name: api, namespace: ns-2}
  - {kind: Namespace, name: ns-3}
`, authorizationPolicy("authz-foo", srv, `[{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: ids}]`)},
			InboundOptions{TrustDomain: "example.org", ControlNamespace: "mesh"},
			[]authz.Authz{{Meta: meta, Networks: allNetworks(), Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{
				Identities: []string{"web.ns-0.serviceaccount.identity.mesh.example.org", "api.ns-2.serviceaccount.identity.mesh.example.org"},
				Suffixes:   [][]string{{"ns-3", "serviceaccount", "identity", "mesh", "example", "org"}},
			}}}}},
		{"route target is not a server authorization", "index.rs client_authzs",
			[]string{authorizationPolicy("authz-foo", `{group: policy.linkerd.io, kind: HTTPRoute, name: r}`, `[]`)},
			InboundOptions{}, nil},
		{"other server", "index.rs client_authzs",
			[]string{authorizationPolicy("authz-foo", `{group: policy.linkerd.io, kind: Server, name: srv-other}`, `[]`)},
			InboundOptions{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustParse(t, append([]string{pod0, server("srv-8080", "8080", "")}, tc.docs...)...)
			s, err := r.InboundServer("ns-0", "pod-0", 8080, tc.opts)
			require.NoError(t, err)
			assert.Equal(t, tc.want, s.Authorizations, "upstream: %s", tc.upstream)
			_, err = authz.Compile(s)
			require.NoError(t, err)
		})
	}
}

// TestInboundAccessPolicy ports policy-test/tests/inbound_api.rs
// (server_with_audit_policy): a Server's accessPolicy adds its mode's
// authorization beside the AuthorizationPolicies.
func TestInboundAccessPolicy(t *testing.T) {
	r := mustParse(t, pod0, `
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: srv-8080, namespace: ns-0}
spec: {podSelector: {}, port: 8080, accessPolicy: audit}
`, authorizationPolicy("authz-foo", `{group: policy.linkerd.io, kind: Server, name: srv-8080}`, `[{kind: ServiceAccount, name: web}]`))
	s := inbound(t, r, 8080, InboundOptions{})
	require.Len(t, s.Authorizations, 2)
	assert.Equal(t, authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "authz-foo"}, s.Authorizations[0].Meta)
	assert.Equal(t, authz.Authz{Meta: authz.DefaultMeta("audit"), Networks: allNetworks()}, s.Authorizations[1])
	assert.Equal(t, authz.ProtocolDetect, s.Protocol)
}

func httpRoute(name, group, server string) string {
	version := "gateway.networking.k8s.io/v1"
	if group == "policy.linkerd.io" {
		version = "policy.linkerd.io/v1beta3"
	}
	return `
apiVersion: ` + version + `
kind: HTTPRoute
metadata: {name: ` + name + `, namespace: ns-0}
spec:
  parentRefs: [{group: policy.linkerd.io, kind: Server, name: ` + server + `}]
  rules:
  - matches: [{path: {type: Exact, value: /foo}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-a, value: "1"}]}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: x-b, value: "1"}]}
`
}

// TestInboundRoutes ports
// policy-controller/k8s/index/src/inbound/tests/http_routes.rs
// (route_attaches_to_server, routes_created_for_probes) and
// policy-test/tests/inbound_api.rs (default_http_routes,
// server_with_http_route): the default and probe routes, which an
// attached route removes, and route-level authorizations.
func TestInboundRoutes(t *testing.T) {
	probeNets := []netip.Prefix{netip.MustParsePrefix("10.0.0.1/24")}
	probeRoute := authz.Route{
		Meta: authz.DefaultMeta("probe"),
		Rules: []authz.Rule{{Matches: []policy.HTTPRouteMatch{
			{Method: "GET", Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/liveness-container-1"}},
			{Method: "GET", Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/ready-container-1"}},
		}}},
		Authorizations: []authz.Authz{{Meta: authz.DefaultMeta("probe"),
			Networks: []authz.Network{{Net: netip.MustParsePrefix("10.0.0.1/24")}}}},
	}
	routeMeta := func(group, name string) authz.Meta { return authz.Meta{Group: group, Kind: "HTTPRoute", Name: name} }
	routeAuthz := authorizationPolicy("authz-route", `{group: policy.linkerd.io, kind: HTTPRoute, name: route-foo}`, `[{kind: ServiceAccount, name: web}]`)
	for _, tc := range []struct {
		name, upstream string
		docs           []string
		opts           InboundOptions
		want           []authz.Meta
	}{
		{"default server with probes", "http_routes.rs routes_created_for_probes",
			nil, InboundOptions{ProbeNetworks: probeNets},
			[]authz.Meta{authz.DefaultMeta("default"), authz.DefaultMeta("probe")}},
		{"no probe networks: no probe route", "inbound_api.rs default_http_routes",
			nil, InboundOptions{}, []authz.Meta{authz.DefaultMeta("default")}},
		{"server without routes keeps probes", "http_routes.rs routes_created_for_probes",
			[]string{server("srv-5432", "5432", "")}, InboundOptions{ProbeNetworks: probeNets},
			[]authz.Meta{authz.DefaultMeta("default"), authz.DefaultMeta("probe")}},
		{"route removes default and probe", "http_routes.rs route_attaches_to_server",
			[]string{server("srv-5432", "5432", ""), httpRoute("route-foo", "policy.linkerd.io", "srv-5432")},
			InboundOptions{ProbeNetworks: probeNets},
			[]authz.Meta{routeMeta("policy.linkerd.io", "route-foo")}},
		{"route to another server", "http_routes.rs route_attaches_to_server",
			[]string{server("srv-5432", "5432", ""), httpRoute("route-foo", "policy.linkerd.io", "srv-other")},
			InboundOptions{ProbeNetworks: probeNets},
			[]authz.Meta{authz.DefaultMeta("default"), authz.DefaultMeta("probe")}},
		{"routes by age then name", "grpc/src/inbound/http.rs to_route_list",
			[]string{server("srv-5432", "5432", ""),
				httpRoute("route-b", "gateway.networking.k8s.io", "srv-5432"),
				httpRoute("route-a", "gateway.networking.k8s.io", "srv-5432"),
				`
apiVersion: policy.linkerd.io/v1beta3
kind: HTTPRoute
metadata: {name: route-c, namespace: ns-0, creationTimestamp: 2024-01-01T00:00:00Z}
spec:
  parentRefs: [{group: policy.linkerd.io, kind: Server, name: srv-5432}]
`},
			InboundOptions{},
			[]authz.Meta{routeMeta("policy.linkerd.io", "route-c"),
				routeMeta("gateway.networking.k8s.io", "route-a"), routeMeta("gateway.networking.k8s.io", "route-b")}},
		{"server parent with a port: route ignored", "inbound/routes.rs ParentRef",
			[]string{server("srv-5432", "5432", ""), `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: route-foo, namespace: ns-0}
spec:
  parentRefs: [{group: policy.linkerd.io, kind: Server, name: srv-5432, port: 5432}]
`}, InboundOptions{}, []authz.Meta{authz.DefaultMeta("default")}},
		{"server parent in another namespace: route ignored", "inbound/routes.rs ParentRef",
			[]string{server("srv-5432", "5432", ""), `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: route-foo, namespace: ns-1}
spec:
  parentRefs: [{group: policy.linkerd.io, kind: Server, name: srv-5432, namespace: ns-0}]
`}, InboundOptions{}, []authz.Meta{authz.DefaultMeta("default")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustParse(t, append(append([]string{pod0}, tc.docs...), routeAuthz)...)
			s := inbound(t, r, 5432, tc.opts)
			var got []authz.Meta
			for _, rt := range s.Routes {
				got = append(got, rt.Meta)
				switch rt.Meta.Name {
				case "probe":
					assert.Equal(t, probeRoute, rt)
				case "default":
					assert.Equal(t, defaultRoute, rt)
				}
			}
			assert.Equal(t, tc.want, got, "upstream: %s", tc.upstream)
		})
	}

	t.Run("route-level authorizations and inbound filters", func(t *testing.T) {
		// http_routes.rs mk_authorization_policy: a policy targeting the
		// route authorizes that route only.
		r := mustParse(t, pod0, server("srv-5432", "5432", ""), httpRoute("route-foo", "policy.linkerd.io", "srv-5432"),
			httpRoute("route-bar", "gateway.networking.k8s.io", "srv-5432"), routeAuthz)
		s := inbound(t, r, 5432, InboundOptions{})
		require.Len(t, s.Routes, 2)
		assert.Empty(t, s.Authorizations)
		assert.Equal(t, "route-bar", s.Routes[0].Meta.Name)
		assert.Empty(t, s.Routes[0].Authorizations)
		foo := s.Routes[1]
		assert.Equal(t, []authz.Authz{{
			Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "authz-route"},
			Networks: allNetworks(),
			Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{
				Identities: []string{"web.ns-0.serviceaccount.identity.linkerd.cluster.local"}}},
		}}, foo.Authorizations)
		require.Len(t, foo.Rules, 1)
		assert.Equal(t, []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathExact, Value: "/foo"}}}, foo.Rules[0].Matches)
		// The response header modifier does not apply inbound.
		require.Len(t, foo.Rules[0].Filters, 1)
		assert.NotNil(t, foo.Rules[0].Filters[0].RequestHeaders)
	})

	t.Run("grpc server takes no http routes", func(t *testing.T) {
		r := mustParse(t, pod0, `
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: srv-grpc, namespace: ns-0}
spec: {podSelector: {}, port: 5432, proxyProtocol: gRPC}
`, httpRoute("route-foo", "policy.linkerd.io", "srv-grpc"))
		s := inbound(t, r, 5432, InboundOptions{ProbeNetworks: probeNets})
		assert.Equal(t, authz.ProtocolGRPC, s.Protocol)
		assert.Empty(t, s.Routes)
	})
}

const rateLimit0 = `
apiVersion: policy.linkerd.io/v1alpha1
kind: HTTPLocalRateLimitPolicy
metadata: {name: ratelimit-0, namespace: ns-0, creationTimestamp: 2024-01-02T00:00:00Z}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: srv-8080}
  total: {requestsPerSecond: 1000}
  overrides:
  - requestsPerSecond: 500
    clientRefs: [{kind: ServiceAccount, name: client-0}]
`

// TestInboundRateLimit ports
// policy-controller/k8s/index/src/inbound/tests/ratelimit_policy.rs
// (ratelimit_policy_with_server) and the one-per-Server rule of
// policy-controller/k8s/status/src/index.rs.
func TestInboundRateLimit(t *testing.T) {
	want := &authz.RateLimit{
		Meta:      authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPLocalRateLimitPolicy", Name: "ratelimit-0"},
		Total:     1000,
		Overrides: []authz.Override{{RPS: 500, Identities: []string{"client-0.ns-0.serviceaccount.identity.linkerd.cluster.example.com"}}},
	}
	opts := InboundOptions{TrustDomain: "cluster.example.com"}

	t.Run("with server", func(t *testing.T) {
		r := mustParse(t, pod0, server("srv-8080", "8080", ""), rateLimit0)
		s := inbound(t, r, 8080, opts)
		assert.Equal(t, want, s.RateLimit)
	})
	t.Run("the oldest wins", func(t *testing.T) {
		r := mustParse(t, pod0, server("srv-8080", "8080", ""), rateLimit0, `
apiVersion: policy.linkerd.io/v1alpha1
kind: HTTPLocalRateLimitPolicy
metadata: {name: ratelimit-a, namespace: ns-0}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: srv-8080}
  identity: {requestsPerSecond: 5}
`)
		s := inbound(t, r, 8080, opts)
		assert.Equal(t, want, s.RateLimit)
	})
	t.Run("an override with empty client refs", func(t *testing.T) {
		// Linkerd's CRD requires clientRefs but allows it empty; such an
		// override limits nobody, as Linkerd's proxy reads it, and the
		// Server stands.
		r := mustParse(t, pod0, server("srv-8080", "8080", ""), strings.Replace(rateLimit0,
			"clientRefs: [{kind: ServiceAccount, name: client-0}]", "clientRefs: []", 1))
		s := inbound(t, r, 8080, opts)
		require.NotNil(t, s.RateLimit)
		assert.Equal(t, uint32(1000), s.RateLimit.Total)
		assert.Empty(t, s.RateLimit.Overrides)
	})
	t.Run("default server has none", func(t *testing.T) {
		r := mustParse(t, pod0, rateLimit0)
		s := inbound(t, r, 8080, opts)
		assert.Nil(t, s.RateLimit)
	})
	t.Run("opaque server has none", func(t *testing.T) {
		r := mustParse(t, pod0, `
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: srv-8080, namespace: ns-0}
spec: {podSelector: {}, port: 8080, proxyProtocol: opaque}
`, rateLimit0)
		s := inbound(t, r, 8080, opts)
		assert.Nil(t, s.RateLimit)
		assert.Equal(t, authz.ProtocolOpaque, s.Protocol)
	})
}

func TestInboundMaxConcurrentRequests(t *testing.T) {
	r := mustParse(t, pod0, server("srv-8080", "8080", "  annotations: {inmesh.io/max-concurrent-requests: \"7\"}"))
	assert.Equal(t, 7, inbound(t, r, 8080, InboundOptions{}).MaxConcurrentRequests)
	assert.Equal(t, 0, inbound(t, r, 5432, InboundOptions{}).MaxConcurrentRequests)
}

// TestInboundParseErrors checks that bad inbound resources are errors naming
// the file, the document and the field, with Linkerd's admission rules
// (policy-controller/runtime/src/admission.rs).
func TestInboundParseErrors(t *testing.T) {
	ap := func(target, refs string) string {
		return "apiVersion: policy.linkerd.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: a, namespace: ns-0}\nspec:\n  targetRef: " +
			target + "\n  requiredAuthenticationRefs: " + refs + "\n"
	}
	srvRef := "{group: policy.linkerd.io, kind: Server, name: s}"
	for _, tc := range []struct{ name, doc, want string }{
		{"pod unknown field", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, prots: []}]\n",
			"document 1 (Pod default/p): spec.containers[0].prots: unknown field"},
		{"pod bad port", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, ports: [{containerPort: 0}]}]\n",
			"spec.containers[0].ports[0].containerPort: 0 is not a port"},
		{"pod bad probe port", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, livenessProbe: {httpGet: {path: /, port: Web_Port}}}]\n",
			"spec.containers[0].livenessProbe.httpGet.port: \"Web_Port\" is not a port name"},
		{"pod bad default policy", "apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {config.linkerd.io/default-inbound-policy: allow}}\n",
			"metadata.annotations.config.linkerd.io/default-inbound-policy: default inbound policy: \"allow\""},
		{"pod bad require identity ports", "apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {config.linkerd.io/proxy-require-identity-inbound-ports: x}}\n",
			"metadata.annotations.config.linkerd.io/proxy-require-identity-inbound-ports: \"x\" is not a port"},
		{"server accessPolicy", "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: s}\nspec: {podSelector: {}, port: 80, accessPolicy: allow}\n",
			"document 1 (Server default/s): spec.accessPolicy: default inbound policy: \"allow\""},
		{"server accessPolicy before v1beta3", "apiVersion: policy.linkerd.io/v1beta1\nkind: Server\nmetadata: {name: s}\nspec: {podSelector: {}, port: 80, accessPolicy: deny}\n",
			"spec.accessPolicy: unknown field"},
		{"server operator", "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: s}\nspec:\n  podSelector: {matchExpressions: [{key: a, operator: Has}]}\n  port: 80\n",
			"spec.podSelector.matchExpressions[0].operator: \"Has\" is not In, NotIn, Exists or DoesNotExist"},
		{"server In without values", "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: s}\nspec:\n  podSelector: {matchExpressions: [{key: a, operator: In}]}\n  port: 80\n",
			"spec.podSelector.matchExpressions[0].values: required"},
		{"server protocol", "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: s}\nspec: {podSelector: {}, port: 80, proxyProtocol: HTTP/3}\n",
			"spec.proxyProtocol: \"HTTP/3\" is not"},
		{"server no selector", "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: s}\nspec: {port: 80}\n",
			"spec.podSelector: required"},
		{"server bad concurrency", "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: s, annotations: {inmesh.io/max-concurrent-requests: \"-1\"}}\nspec: {podSelector: {}, port: 80}\n",
			"metadata.annotations[\"inmesh.io/max-concurrent-requests\"]"},
		{"authz two mtls", ap(srvRef, "[{kind: ServiceAccount, name: a}, {group: policy.linkerd.io, kind: MeshTLSAuthentication, name: m}]"),
			"document 1 (AuthorizationPolicy ns-0/a): spec.requiredAuthenticationRefs[1]: at most one MeshTLSAuthentication or ServiceAccount"},
		{"authz two networks", ap(srvRef, "[{group: policy.linkerd.io, kind: NetworkAuthentication, name: a}, {group: policy.linkerd.io, kind: NetworkAuthentication, name: b}]"),
			"spec.requiredAuthenticationRefs[1]: at most one NetworkAuthentication"},
		{"authz bad ref kind", ap(srvRef, "[{kind: Secret, name: a}]"),
			"spec.requiredAuthenticationRefs[0]: Secret ns-0/a is not a MeshTLSAuthentication"},
		{"authz bad target", ap("{kind: Service, name: web}", "[]"),
			"spec.targetRef: Service ns-0/web is not a target"},
		{"authz other namespace", ap("{kind: Namespace, name: ns-1}", "[]"),
			"spec.targetRef.name: \"ns-1\" is not the policy's namespace \"ns-0\""},
		{"authz missing refs", "apiVersion: policy.linkerd.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: a}\nspec: {targetRef: " + srvRef + "}\n",
			"spec.requiredAuthenticationRefs: required"},
		{"meshtls empty", "apiVersion: policy.linkerd.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: m}\nspec: {identities: []}\n",
			"document 1 (MeshTLSAuthentication default/m): spec: identities or identityRefs must name at least one identity"},
		{"meshtls namespace ref with namespace", "apiVersion: policy.linkerd.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: m}\nspec: {identityRefs: [{kind: Namespace, name: a, namespace: b}]}\n",
			"spec.identityRefs[0].namespace: a Namespace reference takes no namespace"},
		{"network empty", "apiVersion: policy.linkerd.io/v1alpha1\nkind: NetworkAuthentication\nmetadata: {name: net}\nspec: {networks: []}\n",
			"spec.networks: must list at least one network"},
		{"network except outside", "apiVersion: policy.linkerd.io/v1alpha1\nkind: NetworkAuthentication\nmetadata: {name: net}\nspec: {networks: [{cidr: 10.0.0.0/8, except: [192.168.0.0/16]}]}\n",
			"spec.networks[0].except[0]: 192.168.0.0/16 is not inside 10.0.0.0/8"},
		{"network except all", "apiVersion: policy.linkerd.io/v1alpha1\nkind: NetworkAuthentication\nmetadata: {name: net}\nspec: {networks: [{cidr: 10.0.0.0/8, except: [10.0.0.0/8]}]}\n",
			"spec.networks[0].except[0]: 10.0.0.0/8 excludes all of 10.0.0.0/8"},
		{"network bad cidr", "apiVersion: policy.linkerd.io/v1alpha1\nkind: NetworkAuthentication\nmetadata: {name: net}\nspec: {networks: [{cidr: 10.0.0.0/33}]}\n",
			"spec.networks[0].cidr: \"10.0.0.0/33\" is not a network"},
		{"ratelimit target", "apiVersion: policy.linkerd.io/v1alpha1\nkind: HTTPLocalRateLimitPolicy\nmetadata: {name: l}\nspec: {targetRef: {kind: Service, name: s}}\n",
			"document 1 (HTTPLocalRateLimitPolicy default/l): spec.targetRef: Service default/s is not a Server"},
		{"ratelimit identity above total", "apiVersion: policy.linkerd.io/v1alpha1\nkind: HTTPLocalRateLimitPolicy\nmetadata: {name: l}\nspec:\n  targetRef: {group: policy.linkerd.io, kind: Server, name: s}\n  total: {requestsPerSecond: 10}\n  identity: {requestsPerSecond: 20}\n",
			"spec.identity.requestsPerSecond: 20 is more than total.requestsPerSecond 10"},
		{"ratelimit client ref", "apiVersion: policy.linkerd.io/v1alpha1\nkind: HTTPLocalRateLimitPolicy\nmetadata: {name: l}\nspec:\n  targetRef: {group: policy.linkerd.io, kind: Server, name: s}\n  overrides: [{requestsPerSecond: 1, clientRefs: [{kind: Namespace, name: x}]}]\n",
			"spec.overrides[0].clientRefs[0]: Namespace /x is not a ServiceAccount"},
		{"ratelimit override without client refs", "apiVersion: policy.linkerd.io/v1alpha1\nkind: HTTPLocalRateLimitPolicy\nmetadata: {name: l}\nspec:\n  targetRef: {group: policy.linkerd.io, kind: Server, name: s}\n  overrides: [{requestsPerSecond: 1}]\n",
			"spec.overrides[0].clientRefs: required"},
		{"ratelimit unknown field", "apiVersion: policy.linkerd.io/v1alpha1\nkind: HTTPLocalRateLimitPolicy\nmetadata: {name: l}\nspec:\n  targetRef: {group: policy.linkerd.io, kind: Server, name: s}\n  totals: {requestsPerSecond: 1}\n",
			"spec.totals: unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			assert.ErrorContains(t, err, tc.want)
		})
	}

	t.Run("file named", func(t *testing.T) {
		path := t.TempDir() + "/inbound.yaml"
		require.NoError(t, os.WriteFile(path, []byte(pod0+"---\napiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: s, namespace: ns-0}\nspec: {podSelector: {}, port: 80, proxyProtocol: h3}\n"), 0o644))
		_, err := Load(path)
		assert.ErrorContains(t, err, "inbound.yaml: document 2 (Server ns-0/s): spec.proxyProtocol: \"h3\" is not")
	})
}

// TestInboundProbePaths ports the probe rules of
// policy-controller/k8s/index/src/inbound/workload.rs (pod_http_probes): a
// named probe port resolves through its own container's ports, the paths
// lose their queries and are sorted without duplicates.
func TestInboundProbePaths(t *testing.T) {
	r := mustParse(t, `
apiVersion: v1
kind: Pod
metadata: {name: pod-0, namespace: ns-0}
spec:
  containers:
  - name: a
    ports: [{name: web, containerPort: 8080}]
    livenessProbe: {httpGet: {path: "/z?x=1", port: web}}
    readinessProbe: {httpGet: {path: /a, port: 8080}}
    startupProbe: {httpGet: {port: 8080}}
  - name: b
    livenessProbe: {httpGet: {path: /other, port: web}}
  initContainers:
  - name: i
    ports: [{name: web, containerPort: 9090}]
    startupProbe: {httpGet: {path: /a, port: web}}
`)
	paths := func(port uint16) []string {
		s := inbound(t, r, port, InboundOptions{ProbeNetworks: authz.AllNetworks})
		var out []string
		for _, rt := range s.Routes {
			if rt.Meta.Name == "probe" {
				for _, m := range rt.Rules[0].Matches {
					out = append(out, m.Path.Value)
				}
			}
		}
		return out
	}
	assert.Equal(t, []string{"/", "/a", "/z"}, paths(8080))
	assert.Equal(t, []string{"/a"}, paths(9090))
	assert.Nil(t, paths(8081))
}

const grpcRouteFoo = `
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: grpc-foo, namespace: ns-0}
spec:
  parentRefs: [{group: policy.linkerd.io, kind: Server, name: srv-5432}]
  rules:
  - matches: [{method: {service: helloworld.Greeter, method: SayHello}}]
`

// TestInboundGRPCRoutes ports the gRPC route rules of
// policy-controller/k8s/index/src/inbound/index.rs (grpc_routes, the
// default gRPC route) and policy-controller/k8s/status/src/index.rs
// (parent_has_conflicting_routes: a Server's HTTPRoutes conflict with its
// GRPCRoutes).
func TestInboundGRPCRoutes(t *testing.T) {
	grpcServer := `
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: srv-5432, namespace: ns-0}
spec: {podSelector: {}, port: 5432, proxyProtocol: gRPC}
`
	routeAuthz := authorizationPolicy("authz-grpc", `{group: gateway.networking.k8s.io, kind: GRPCRoute, name: grpc-foo}`, `[{kind: ServiceAccount, name: web}]`)

	t.Run("grpc server with a route", func(t *testing.T) {
		r := mustParse(t, pod0, grpcServer, grpcRouteFoo, routeAuthz)
		s := inbound(t, r, 5432, InboundOptions{})
		require.Len(t, s.GRPCRoutes, 1)
		g := s.GRPCRoutes[0]
		assert.Equal(t, authz.Meta{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Name: "grpc-foo"}, g.Meta)
		assert.Equal(t, []policy.GRPCRouteMatch{{Service: "helloworld.Greeter", Method: "SayHello"}}, g.Rules[0].Matches)
		require.Len(t, g.Authorizations, 1)
		assert.Equal(t, "authz-grpc", g.Authorizations[0].Meta.Name)
		assert.Empty(t, s.Routes)
	})
	t.Run("grpc server without routes", func(t *testing.T) {
		r := mustParse(t, pod0, grpcServer)
		s := inbound(t, r, 5432, InboundOptions{})
		// Linkerd's default gRPC route (policy-controller/core/src/inbound.rs).
		assert.Equal(t, []authz.GRPCRoute{{Meta: authz.DefaultMeta("default"),
			Rules: []authz.GRPCRule{{Matches: []policy.GRPCRouteMatch{{}}}}}}, s.GRPCRoutes)
	})
	t.Run("http routes conflict with grpc routes", func(t *testing.T) {
		r := mustParse(t, pod0, server("srv-5432", "5432", ""), grpcRouteFoo, httpRoute("route-foo", "policy.linkerd.io", "srv-5432"))
		s := inbound(t, r, 5432, InboundOptions{})
		assert.Equal(t, []authz.Route{defaultRoute}, s.Routes)
		assert.Empty(t, s.GRPCRoutes)
	})
}
