package manifest

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const authorsService = `
apiVersion: v1
kind: Service
metadata:
  name: authors
  namespace: default
  annotations:
    retry.linkerd.io/http: 5xx
    retry.linkerd.io/limit: "2"
    timeout.linkerd.io/request: 2s
spec:
  ports:
  - name: http
    port: 7001
`

const authorsRoute = `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: authors-routes
  namespace: default
spec:
  parentRefs:
  - {group: core, kind: Service, name: authors, port: 7001}
  hostnames: ["authors.default.svc.cluster.local"]
  rules:
  - matches:
    - path: {type: PathPrefix, value: /authors}
      method: GET
      headers: [{name: x-canary, value: "1"}]
      queryParams: [{type: RegularExpression, name: page, value: "[0-9]+"}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        add: [{name: x-added, value: a}]
        remove: [x-removed]
    backendRefs:
    - {name: authors, port: 7001, weight: 90}
    - {name: authors-next, port: 7001, weight: 10}
`

func mustParse(t *testing.T, docs ...string) *Resources {
	t.Helper()
	var all string
	for _, d := range docs {
		all += "---\n" + d
	}
	r, err := Parse([]byte(all))
	require.NoError(t, err)
	return r
}

func compiles(t *testing.T, p *policy.Policy) {
	t.Helper()
	_, err := policy.Compile(p, policy.Options{})
	require.NoError(t, err)
}

func TestDefaultRouteWithServiceAnnotations(t *testing.T) {
	r := mustParse(t, authorsService)
	p := r.Policy("default", "authors", 7001)
	require.NotNil(t, p)
	compiles(t, p)
	assert.Equal(t, policy.Metadata{Group: "core", Kind: "Service", Namespace: "default", Name: "authors", Port: 7001}, p.Parent)
	assert.Equal(t, policy.ProtocolDetect, p.Protocol)
	require.Len(t, p.HTTP1.Routes, 1)
	route := p.HTTP1.Routes[0]
	assert.True(t, route.Meta.IsDefault())
	assert.Equal(t, "http", route.Meta.Name)
	rule := route.Rules[0]
	assert.Equal(t, 2*time.Second, rule.Timeouts.Request)
	require.NotNil(t, rule.Retry)
	assert.Equal(t, uint32(2), rule.Retry.MaxRetries)
	assert.Equal(t, []policy.StatusRange{{Start: 500, End: 599}}, rule.Retry.StatusRanges)
	require.Len(t, rule.Backends.Backends, 1)
	assert.Equal(t, "authors.default.svc.cluster.local:7001", rule.Backends.Backends[0].Backend.Balancer.Authority)

	// As Linkerd's controller (resource_routes_or_default), a port the
	// Service does not declare and a Service it does not know get the
	// default policy: the default route to the Service port's balancer.
	for _, tc := range []struct {
		name string
		port uint16
	}{{"authors", 7002}, {"books", 7001}} {
		p := r.Policy("default", tc.name, tc.port)
		require.NotNil(t, p, "%s:%d", tc.name, tc.port)
		assert.Equal(t, policy.ProtocolDetect, p.Protocol)
		assert.Equal(t, "http", p.HTTP1.Routes[0].Meta.Name)
		assert.Equal(t, Authority("default", tc.name, tc.port), p.HTTP1.Routes[0].Rules[0].Backends.Backends[0].Backend.Balancer.Authority)
	}
}

// The failure-accrual annotations of a Service become the failure accrual
// of its policy, with Linkerd's defaults for what they leave out.
func TestFailureAccrualAnnotations(t *testing.T) {
	svc := func(annotations string) string {
		return "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  annotations: {" + annotations + "}\nspec:\n  ports: [{port: 80}]\n"
	}
	p := mustParse(t, svc("balancer.linkerd.io/failure-accrual: consecutive")).Policy("default", "a", 80)
	compiles(t, p)
	require.NotNil(t, p.HTTP1.FailureAccrual)
	assert.Equal(t, &policy.FailureAccrual{Consecutive: &policy.ConsecutiveFailures{MaxFailures: 7,
		Backoff: backoff.Policy{Min: time.Second, Max: time.Minute, Jitter: 0.5}}}, p.HTTP1.FailureAccrual)
	assert.Same(t, p.HTTP1.FailureAccrual, p.HTTP2.FailureAccrual)

	p = mustParse(t, svc(`balancer.linkerd.io/failure-accrual: unified, balancer.linkerd.io/failure-accrual-consecutive-max-failures: "3",
    balancer.linkerd.io/failure-accrual-consecutive-min-penalty: 2s, balancer.linkerd.io/failure-accrual-consecutive-max-penalty: 30s,
    balancer.linkerd.io/failure-accrual-consecutive-jitter-ratio: "0", balancer.alpha.linkerd.io/failure-accrual-success-rate-threshold: "0.9",
    balancer.alpha.linkerd.io/failure-accrual-success-rate-window: 5s, balancer.alpha.linkerd.io/failure-accrual-success-rate-min-requests: "20"`)).Policy("default", "a", 80)
	compiles(t, p)
	assert.Equal(t, &policy.FailureAccrual{Unified: &policy.UnifiedAccrual{SuccessRateThreshold: 0.9, Window: 5 * time.Second,
		MinRequests: 20, MaxConsecutiveFailures: 3, Backoff: backoff.Policy{Min: 2 * time.Second, Max: 30 * time.Second}}}, p.HTTP1.FailureAccrual)

	assert.Nil(t, mustParse(t, svc("")).Policy("default", "a", 80).HTTP1.FailureAccrual, "no annotation, no breaker")
}

func TestHTTPRouteWeightsAndUnknownBackend(t *testing.T) {
	r := mustParse(t, authorsService, authorsRoute)
	p := r.Policy("default", "authors", 7001)
	require.NotNil(t, p)
	compiles(t, p)
	require.Len(t, p.HTTP1.Routes, 1)
	assert.Equal(t, p.HTTP1.Routes, p.HTTP2.Routes)
	route := p.HTTP1.Routes[0]
	assert.Equal(t, policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "default", Name: "authors-routes"}, route.Meta)
	assert.Equal(t, []policy.HostMatch{{Exact: "authors.default.svc.cluster.local"}}, route.Hosts)
	rule := route.Rules[0]
	m := rule.Matches[0]
	assert.Equal(t, &policy.PathMatch{Kind: policy.PathPrefix, Value: "/authors"}, m.Path)
	assert.Equal(t, "GET", m.Method)
	assert.Equal(t, []policy.HeaderMatch{{Name: "x-canary", Value: "1"}}, m.Headers)
	assert.Equal(t, []policy.QueryParamMatch{{Name: "page", Value: "[0-9]+", Regex: true}}, m.QueryParams)
	assert.Equal(t, []policy.Header{{Name: "x-added", Value: "a"}}, rule.Filters[0].RequestHeaders.Add)

	d := rule.Backends
	assert.Equal(t, policy.DistributionRandomAvailable, d.Kind)
	require.Len(t, d.Backends, 2)
	assert.Equal(t, uint32(90), d.Backends[0].Weight)
	assert.Equal(t, uint32(10), d.Backends[1].Weight)
	assert.Equal(t, "authors.default.svc.cluster.local:7001", d.Backends[0].Backend.Balancer.Authority)
	assert.Empty(t, d.Backends[0].Filters)
	// authors-next has no Service manifest: its share fails with 500.
	unknown := d.Backends[1]
	assert.Nil(t, unknown.Backend.Balancer)
	assert.Equal(t, "authors-next", unknown.Backend.Meta.Name)
	require.Len(t, unknown.Filters, 1)
	require.NotNil(t, unknown.Filters[0].FailureInjector)
	assert.Equal(t, 500, unknown.Filters[0].FailureInjector.Status)
	assert.Equal(t, "Service not found authors-next", unknown.Filters[0].FailureInjector.Message, "policy-controller/grpc/src/outbound/http.rs")

	// The Service's annotations apply to the route that sets none.
	assert.Equal(t, 2*time.Second, rule.Timeouts.Request)
	assert.Equal(t, uint32(2), rule.Retry.MaxRetries)
}

func TestRouteAnnotationsOverrideService(t *testing.T) {
	route := `
apiVersion: policy.linkerd.io/v1beta3
kind: HTTPRoute
metadata:
  name: authors
  namespace: default
  annotations:
    retry.linkerd.io/http: gateway-error,429
    timeout.linkerd.io/response: 300ms
spec:
  parentRefs: [{kind: Service, group: "", name: authors}]
  rules:
  - {}
  - timeouts: {request: 1s}
`
	p := mustParse(t, authorsService, route).Policy("default", "authors", 7001)
	require.NotNil(t, p)
	compiles(t, p)
	rt := p.HTTP1.Routes[0]
	assert.Equal(t, "policy.linkerd.io", rt.Meta.Group)
	r0 := rt.Rules[0]
	// The route's retry annotation replaces the Service's retry policy as a
	// whole: its own conditions, the default limit.
	assert.Equal(t, []policy.StatusRange{{Start: 502, End: 504}, {Start: 429, End: 429}}, r0.Retry.StatusRanges)
	assert.Equal(t, uint32(policy.DefaultMaxRetries), r0.Retry.MaxRetries)
	// Its timeout annotation replaces the Service's timeouts.
	assert.Equal(t, policy.Timeouts{Response: 300 * time.Millisecond}, r0.Timeouts)
	// A rule's timeouts.request fills in the request timeout the
	// annotations leave unset.
	assert.Equal(t, policy.Timeouts{Request: time.Second, Response: 300 * time.Millisecond}, rt.Rules[1].Timeouts)
	// Without backendRefs, a rule goes to the parent Service.
	assert.Equal(t, policy.DistributionFirstAvailable, r0.Backends.Kind)
	assert.Equal(t, "authors.default.svc.cluster.local:7001", r0.Backends.Backends[0].Backend.Balancer.Authority)
}

func TestGRPCRoute(t *testing.T) {
	svc := `
apiVersion: v1
kind: Service
metadata:
  name: greeter
  namespace: apps
  annotations: {retry.linkerd.io/grpc: "unavailable, internal"}
spec:
  ports: [{port: 9000}]
`
	route := `
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: greeter, namespace: apps}
spec:
  parentRefs: [{kind: Service, group: core, name: greeter, port: 9000}]
  rules:
  - matches:
    - method: {service: helloworld.Greeter, method: SayHello}
      headers: [{name: x-user, type: RegularExpression, value: "a.*"}]
    backendRefs: [{name: greeter, port: 9000}]
`
	r := mustParse(t, svc, route)
	p := r.Policy("apps", "greeter", 9000)
	require.NotNil(t, p)
	compiles(t, p)
	assert.Equal(t, policy.ProtocolGRPC, p.Protocol)
	require.Len(t, p.GRPC.Routes, 1)
	rule := p.GRPC.Routes[0].Rules[0]
	assert.Equal(t, policy.GRPCRouteMatch{Service: "helloworld.Greeter", Method: "SayHello",
		Headers: []policy.HeaderMatch{{Name: "x-user", Value: "a.*", Regex: true}}}, rule.Matches[0])
	assert.Equal(t, []codes.Code{codes.Unavailable, codes.Internal}, rule.Retry.GRPCCodes)
	assert.Equal(t, "greeter.apps.svc.cluster.local:9000", rule.Backends.Backends[0].Backend.Balancer.Authority)
}

func TestRoutesOfOtherParentsDoNotApply(t *testing.T) {
	route := `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: gw, namespace: default}
spec:
  parentRefs: [{name: my-gateway}, {kind: Service, group: core, name: authors, port: 9999}]
`
	p := mustParse(t, authorsService, route).Policy("default", "authors", 7001)
	require.NotNil(t, p)
	assert.True(t, p.HTTP1.Routes[0].Meta.IsDefault())
}

func TestParseErrorsNameDocumentAndField(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"unknown kind", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "document 1 (ConfigMap default/x): kind: v1 ConfigMap is not read here"},
		{"no metadata", "apiVersion: v1\nkind: Service\n", "document 1: metadata: required"},
		{"bad name", "apiVersion: v1\nkind: Service\nmetadata: {name: Bad_Name}\n", "metadata.name: \"Bad_Name\" is not a DNS name"},
		{"duplicate key", "apiVersion: v1\nkind: Service\nkind: Service\nmetadata: {name: a}\n", "document 1: kind: duplicate key \"kind\""},
		{"bad port", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports: [{port: 70000}]\n", "document 1 (Service default/a): spec.ports[0].port: 70000 is not a port"},
		// Kubernetes' ValidateService (pkg/apis/core/validation): a port
		// once for each protocol; names required and distinct past one port.
		{"duplicate port", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports: [{name: web, port: 80}, {name: admin, port: 80}]\n", "document 1 (Service default/a): spec.ports[1].port: 80/TCP is also ports[0]"},
		{"duplicate port, explicit protocol", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports: [{name: web, port: 80}, {name: admin, port: 80, protocol: TCP}]\n", "spec.ports[1].port: 80/TCP is also ports[0]"},
		{"unnamed second port", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports: [{name: x, port: 80}, {port: 81}]\n", "spec.ports[1].name: required when a Service has more than one port"},
		{"duplicate port name", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports: [{name: x, port: 80}, {name: x, port: 81}]\n", "spec.ports[1].name: \"x\" is also the name of ports[0]"},
		{"bad protocol", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports: [{port: 80, protocol: HTTP}]\n", "spec.ports[0].protocol: \"HTTP\" is not TCP, UDP or SCTP"},
		{"bad retry annotation", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {retry.linkerd.io/http: 6xx}}\n", "metadata.annotations.retry.linkerd.io/http: \"6xx\""},
		{"bad grpc annotation", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {retry.linkerd.io/grpc: aborted}}\n", "metadata.annotations.retry.linkerd.io/grpc: \"aborted\""},
		{"bad timeout annotation", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {timeout.linkerd.io/request: soon}}\n", "metadata.annotations.timeout.linkerd.io/request: \"soon\" is not a duration"},
		{"bad limit", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {retry.linkerd.io/limit: many}}\n", "metadata.annotations.retry.linkerd.io/limit"},
		{"bad accrual mode", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {balancer.linkerd.io/failure-accrual: always}}\n", "metadata.annotations.balancer.linkerd.io/failure-accrual: \"always\" is not consecutive or unified"},
		{"accrual setting without mode", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {balancer.linkerd.io/failure-accrual-consecutive-max-failures: \"3\"}}\n", "metadata.annotations.balancer.linkerd.io/failure-accrual-consecutive-max-failures: needs balancer.linkerd.io/failure-accrual"},
		{"bad max failures", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {balancer.linkerd.io/failure-accrual: consecutive, balancer.linkerd.io/failure-accrual-consecutive-max-failures: lots}}\n", "failure-accrual-consecutive-max-failures: \"lots\" is not a whole number"},
		{"penalties inverted", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {balancer.linkerd.io/failure-accrual: consecutive, balancer.linkerd.io/failure-accrual-consecutive-max-penalty: 100ms}}\n", "failure-accrual-consecutive-max-penalty: 100ms is less than the minimum penalty 1s"},
		{"bad jitter", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {balancer.linkerd.io/failure-accrual: consecutive, balancer.linkerd.io/failure-accrual-consecutive-jitter-ratio: \"-1\"}}\n", "failure-accrual-consecutive-jitter-ratio: \"-1\" is not a number from 0 to 100"},
		{"success rate with consecutive", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {balancer.linkerd.io/failure-accrual: consecutive, balancer.alpha.linkerd.io/failure-accrual-success-rate-threshold: \"0.9\"}}\n", "failure-accrual-success-rate-threshold: applies only with balancer.linkerd.io/failure-accrual: unified"},
		{"bad success rate", "apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {balancer.linkerd.io/failure-accrual: unified, balancer.alpha.linkerd.io/failure-accrual-success-rate-threshold: \"1.5\"}}\n", "failure-accrual-success-rate-threshold: \"1.5\" is not a number from 0 to 1"},
		{"bad path type", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - matches:\n    - path: {type: Glob, value: /x}\n", "document 1 (HTTPRoute default/r): spec.rules[0].matches[0].path.type: \"Glob\""},
		{"relative path", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - matches:\n    - path: {value: x}\n", "spec.rules[0].matches[0].path.value: \"x\" does not start with /"},
		{"unknown rule field", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - backendRef: []\n", "spec.rules[0].backendRef: unknown field"},
		{"unsupported filter", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - filters: [{type: URLRewrite}]\n", "spec.rules[0].filters[0].type: filter \"URLRewrite\" is not supported"},
		{"backend not a Service", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - backendRefs: [{kind: Bucket, group: s3, name: b}]\n", "spec.rules[0].backendRefs[0]: backend s3/Bucket is not a Service"},
		{"bad weight", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - backendRefs: [{name: b, weight: -1}]\n", "spec.rules[0].backendRefs[0].weight"},
		{"grpc filter", "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - filters: [{type: RequestRedirect}]\n", "spec.rules[0].filters[0].type: filter \"RequestRedirect\" is not supported (supported: RequestHeaderModifier)"},
		{"grpc method", "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - matches: [{method: {type: RegularExpression, service: a}}]\n", "spec.rules[0].matches[0].method.type: \"RegularExpression\" is not supported"},
		{"old version", "apiVersion: gateway.networking.k8s.io/v1alpha1\nkind: HTTPRoute\nmetadata: {name: r}\n", `apiVersion: "gateway.networking.k8s.io/v1alpha1" is not an API version of HTTPRoute read here (want gateway.networking.k8s.io/v1 or policy.linkerd.io/v1beta3)`},
		{"old profile version", "apiVersion: linkerd.io/v1alpha1\nkind: ServiceProfile\nmetadata: {name: books.default.svc.cluster.local}\nspec: {routes: []}\n", `apiVersion: "linkerd.io/v1alpha1" is not an API version of ServiceProfile read here (want linkerd.io/v1alpha2)`},
		{"unknown kind", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: r}\n", "kind: v1 ConfigMap is not read here"},
		{"twice", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: a}\n", "document 2: Service default/a is also defined in document 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "a.yaml")
	bad := filepath.Join(dir, "b.yaml")
	require.NoError(t, os.WriteFile(good, []byte(authorsService+"---\n"+authorsRoute), 0o644))
	require.NoError(t, os.WriteFile(bad, []byte("# empty first\n---\napiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: \"N\"}\n"), 0o644))
	r, err := Load(good)
	require.NoError(t, err)
	assert.Len(t, r.Services, 1)
	assert.Len(t, r.HTTPRoutes, 1)
	_, err = Load(good, bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), bad+": document 2 (Service N/x): metadata.namespace: \"N\" is not a DNS label")
	empty := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(empty, []byte("# nothing yet\n"), 0o644))
	_, err = Load(good, empty)
	require.ErrorContains(t, err, empty+": empty file")
	_, err = Load(good, good)
	require.ErrorContains(t, err, "Service default/authors is also defined in "+good)
}

func TestParseAuthority(t *testing.T) {
	for _, a := range []string{"authors.default.svc.cluster.local:7001", "authors.default.svc.cluster.local.:7001", "authors.default.svc:7001", "authors.default:7001", "Authors.Default.svc.cluster.local:7001"} {
		ns, name, port, ok := ParseAuthority(a)
		assert.True(t, ok, a)
		assert.Equal(t, []any{"default", "authors", uint16(7001)}, []any{ns, name, port}, a)
	}
	for _, a := range []string{"authors:7001", "127.0.0.1:7001", "authors.default.svc.cluster.local", "a.b.example.com:80", "authors.default:0", "authors.default:+80", "a.b:99999"} {
		_, _, _, ok := ParseAuthority(a)
		assert.False(t, ok, a)
	}
}

func TestExampleManifests(t *testing.T) {
	paths, err := filepath.Glob("../examples/destination/policies/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	r, err := Load(paths...)
	require.NoError(t, err)
	p := r.Policy("default", "authors", 7001)
	require.NotNil(t, p)
	compiles(t, p)
	assert.Equal(t, "authors-routes", p.HTTP1.Routes[0].Meta.Name)
}

// A file may hold a service's ServiceProfile, Service and HTTPRoutes side
// by side, as users keep them: each reader takes its kinds; an unknown kind
// is still an error naming it, and a ServiceProfile defined twice across
// files is named.
func TestMixedKinds(t *testing.T) {
	dir := t.TempDir()
	mixed := filepath.Join(dir, "books.yaml")
	require.NoError(t, os.WriteFile(mixed, []byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  routes:
  - name: GET /books
    condition: {method: GET, pathRegex: /books}
---
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec:
  ports: [{port: 7000}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: books, namespace: default}
spec:
  parentRefs: [{group: core, kind: Service, name: books, port: 7000}]
  rules: [{backendRefs: [{name: books, port: 7000}]}]
`), 0o644))
	r, err := Load(mixed)
	require.NoError(t, err)
	require.Len(t, r.ServiceProfiles, 1)
	assert.Equal(t, "books.default.svc.cluster.local", r.ServiceProfiles[0].Name)
	assert.Len(t, r.Services, 1)
	assert.Len(t, r.HTTPRoutes, 1)

	again := filepath.Join(dir, "again.yaml")
	require.NoError(t, os.WriteFile(again, []byte("apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: books.default.svc.cluster.local}\nspec: {routes: []}\n"), 0o644))
	_, err = Load(mixed, again)
	assert.ErrorContains(t, err, "ServiceProfile default/books.default.svc.cluster.local is also defined in")

	_, err = Parse([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: books}\nspec: {}\n"))
	assert.ErrorContains(t, err, `document 1 (Deployment default/books): kind: apps/v1 Deployment is not read here`)
}

// The load biaser's annotations, as Linkerd's policy controller parses
// them (linkerd2 policy-controller parse_load_biaser_config, and its
// policy tests' load-bias cases): off unless penalize-failures is true;
// penalty 5s and max-retry-after 300s by default; a bad value names the
// annotation; honor-retry-after alone is no error.
func TestLoadBiaserAnnotations(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    map[string]string
		want *policy.LoadPenalty
		err  string
	}{
		{"absent", nil, nil, ""},
		{"off", map[string]string{AnnotationPenalizeFailures: "false"}, nil, ""},
		{"defaults", map[string]string{AnnotationPenalizeFailures: "true"},
			&policy.LoadPenalty{Penalty: 5 * time.Second, MaxRetryAfter: 300 * time.Second, PenaltyDecay: DefaultDecay}, ""},
		{"custom", map[string]string{AnnotationPenalizeFailures: "true", AnnotationLoadBiaserPenalty: "3s", AnnotationLoadBiaserMaxRetryAfter: "1m"},
			&policy.LoadPenalty{Penalty: 3 * time.Second, MaxRetryAfter: time.Minute, PenaltyDecay: DefaultDecay}, ""},
		{"not a bool", map[string]string{AnnotationPenalizeFailures: "yes"}, nil, AnnotationPenalizeFailures},
		{"bad penalty", map[string]string{AnnotationPenalizeFailures: "true", AnnotationLoadBiaserPenalty: "soon"}, nil, AnnotationLoadBiaserPenalty},
		{"penalty too large", map[string]string{AnnotationPenalizeFailures: "true", AnnotationLoadBiaserPenalty: "2000h"}, nil, "maximum supported value"},
		{"bad max-retry-after", map[string]string{AnnotationPenalizeFailures: "true", AnnotationLoadBiaserMaxRetryAfter: "-"}, nil, AnnotationLoadBiaserMaxRetryAfter},
		{"honor-retry-after alone", map[string]string{AnnotationHonorRetryAfter: "true"}, nil, ""},
		{"honor-retry-after not a bool", map[string]string{AnnotationHonorRetryAfter: "1"}, nil, AnnotationHonorRetryAfter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := loadBiaser(tc.a)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			_, err = failureAccrual(tc.a)
			assert.NoError(t, err, "honor-retry-after is not a failure-accrual parameter")
		})
	}

	// The Service's backends carry it in their policy.
	r, err := Parse([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: books, namespace: default, annotations: {" +
		AnnotationPenalizeFailures + ": 'true'}}\nspec: {ports: [{port: 7000}]}\n"))
	require.NoError(t, err)
	p := r.Policy("default", "books", 7000)
	require.NotNil(t, p)
	b := p.HTTP1.Routes[0].Rules[0].Backends.Backends[0].Backend
	require.NotNil(t, b.Balancer)
	assert.Equal(t, 5*time.Second, b.Balancer.Penalty.Penalty)
}

// TestTiedRoutesGoToTheOldest: routes whose matches tie are listed oldest
// first by creationTimestamp, those without one last, then by namespace
// and name, as Linkerd's policy controller lists them
// (policy-controller/grpc/src/outbound.rs, timestamp_then_name), so the
// router's first-of-equals rule picks the oldest route.
func TestTiedRoutesGoToTheOldest(t *testing.T) {
	route := func(name, created string) string {
		ts := ""
		if created != "" {
			ts = "\n  creationTimestamp: " + created
		}
		return `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: ` + name + `
  namespace: default` + ts + `
spec:
  parentRefs: [{group: core, kind: Service, name: authors, port: 7001}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /a}}]
`
	}
	r := mustParse(t, authorsService,
		route("a-undated", ""),
		route("b-newer", "2024-05-01T00:00:00Z"),
		route("c-oldest", "2023-01-01T10:00:00Z"),
		route("d-newer", "2024-05-01T00:00:00Z"))
	p := r.Policy("default", "authors", 7001)
	require.NotNil(t, p)
	var names []string
	for _, rt := range p.HTTP1.Routes {
		names = append(names, rt.Meta.Name)
	}
	assert.Equal(t, []string{"c-oldest", "b-newer", "d-newer", "a-undated"}, names)

	table, err := policy.Compile(p, policy.Options{})
	require.NoError(t, err)
	req := httptest.NewRequest("GET", "http://authors.default.svc.cluster.local:7001/a/1", nil)
	got, _ := table.Select(req)
	require.NotNil(t, got)
	assert.Equal(t, "c-oldest", got.Meta.Name)

	_, err = Parse([]byte(strings.Replace(route("x", "2023-01-01T10:00:00Z"), "2023-01-01T10:00:00Z", "yesterday", 1)))
	require.ErrorContains(t, err, `metadata.creationTimestamp: "yesterday" is not an RFC 3339 time`)
}

// TestTimeoutPrecedenceAsLinkerd: a rule's timeouts combine as Linkerd's
// policy controller combines them (policy-controller/k8s/index/src/
// outbound/index/http.rs convert_linkerd_rule, then grpc/src/outbound/
// http.rs): the route's annotations field by field, the rule's
// timeouts.request only where the annotations set no request timeout,
// and the Service's annotations only when nothing else set a timeout.
func TestTimeoutPrecedenceAsLinkerd(t *testing.T) {
	svc := `
apiVersion: v1
kind: Service
metadata:
  name: authors
  annotations: {timeout.linkerd.io/idle: 9s}
spec:
  ports: [{port: 7001}]
`
	route := func(annotations, ruleTimeouts string) string {
		return `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: authors
  annotations: {` + annotations + `}
spec:
  parentRefs: [{kind: Service, group: core, name: authors, port: 7001}]
  rules:
  - timeouts: {` + ruleTimeouts + `}
`
	}
	for _, tc := range []struct {
		name, annotations, rule string
		want                    policy.Timeouts
	}{
		{"annotations win over the rule's request (measured against Linkerd)",
			"timeout.linkerd.io/request: 3s, timeout.linkerd.io/response: 700ms", "request: 1s",
			policy.Timeouts{Request: 3 * time.Second, Response: 700 * time.Millisecond}},
		{"the rule's request fills in", "timeout.linkerd.io/response: 700ms", "request: 1s",
			policy.Timeouts{Request: time.Second, Response: 700 * time.Millisecond}},
		{"the rule alone", "", "request: 1s", policy.Timeouts{Request: time.Second}},
		{"a zero request timeout is none; the Service's apply", "", "request: 0s", policy.Timeouts{Idle: 9 * time.Second}},
		{"backendRequest is not applied", "", "backendRequest: 1s", policy.Timeouts{Idle: 9 * time.Second}},
		{"nothing on the route: the Service's", "", "", policy.Timeouts{Idle: 9 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustParse(t, svc, route(tc.annotations, tc.rule)).Policy("default", "authors", 7001)
			require.NotNil(t, p)
			assert.Equal(t, tc.want, p.HTTP1.Routes[0].Rules[0].Timeouts)
		})
	}
}

// TestProtocolByPort: which protocol a Service port's policy has, as
// Linkerd's policy controller decides (policy-controller/core/src/
// outbound.rs AppProtocol, k8s/index/src/outbound/index.rs opaque ports,
// grpc/src/outbound.rs to_proto): a port's appProtocol first, then the
// opaque-ports annotation (or the default opaque ports), then detection.
func TestProtocolByPort(t *testing.T) {
	svc := func(annotations, ports string) string {
		return `
apiVersion: v1
kind: Service
metadata:
  name: db
  annotations: {` + annotations + `}
spec:
  ports: [` + ports + `]
`
	}
	grpcRoute := `
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: db-grpc}
spec:
  parentRefs: [{kind: Service, group: core, name: db, port: 9000}]
  rules: [{}]
`
	for _, tc := range []struct {
		name, annotations, ports string
		port                     uint16
		extra                    string
		want                     policy.Protocol
	}{
		{"a default opaque port", "", "{port: 3306}", 3306, "", policy.ProtocolOpaque},
		{"another default opaque port", "", "{port: 11211}", 11211, "", policy.ProtocolOpaque},
		{"an ordinary port", "", "{port: 8080}", 8080, "", policy.ProtocolDetect},
		{"the annotation replaces the defaults", "config.linkerd.io/opaque-ports: \"8080\"", "{port: 3306}", 3306, "", policy.ProtocolDetect},
		{"the annotation names the port", "config.linkerd.io/opaque-ports: \"8080\"", "{port: 8080}", 8080, "", policy.ProtocolOpaque},
		{"the annotation's range", "config.linkerd.io/opaque-ports: \"25, 8000-8100\"", "{port: 8080}", 8080, "", policy.ProtocolOpaque},
		// controller/api/destination/watcher/opaque_ports_watcher.go isNamed.
		{"the annotation names the port by its name", "config.linkerd.io/opaque-ports: \"mysql\"", "{name: mysql, port: 3307}", 3307, "", policy.ProtocolOpaque},
		{"a name that looks like a range is the port's name", "config.linkerd.io/opaque-ports: \"8080-8090\"", "{name: 8080-8090, port: 9000}, {name: other, port: 8085}", 8085, "", policy.ProtocolDetect},
		{"appProtocol http: HTTP/1 only", "", "{port: 8080, appProtocol: http}", 8080, "", policy.ProtocolHTTP1},
		{"appProtocol h2c: HTTP/2 only", "", "{port: 8080, appProtocol: kubernetes.io/h2c}", 8080, "", policy.ProtocolHTTP2},
		{"appProtocol h2c with GRPCRoutes: gRPC", "", "{port: 9000, appProtocol: kubernetes.io/h2c}", 9000, grpcRoute, policy.ProtocolGRPC},
		{"appProtocol wins over a default opaque port", "", "{port: 3306, appProtocol: http}", 3306, "", policy.ProtocolHTTP1},
		{"appProtocol linkerd.io/opaque", "", "{port: 8080, appProtocol: linkerd.io/opaque}", 8080, "", policy.ProtocolOpaque},
		{"appProtocol linkerd.io/tcp", "", "{port: 8080, appProtocol: linkerd.io/tcp}", 8080, "", policy.ProtocolOpaque},
		{"an unknown appProtocol is opaque", "", "{port: 8080, appProtocol: mysql}", 8080, "", policy.ProtocolOpaque},
		{"appProtocol is case-insensitive", "", "{port: 8080, appProtocol: HTTP}", 8080, "", policy.ProtocolHTTP1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs := []string{svc(tc.annotations, tc.ports)}
			if tc.extra != "" {
				docs = append(docs, tc.extra)
			}
			p := mustParse(t, docs...).Policy("default", "db", tc.port)
			require.NotNil(t, p)
			assert.Equal(t, tc.want, p.Protocol)
			switch tc.want {
			case policy.ProtocolOpaque, policy.ProtocolDetect:
				// Opaque traffic, and what detection finds is not HTTP,
				// goes to the Service by the default route "opaq".
				require.Len(t, p.Opaque.Routes, 1)
				assert.Equal(t, policy.DefaultMetadata("opaq"), p.Opaque.Routes[0].Meta)
				assert.Equal(t, Authority("default", "db", tc.port), p.Opaque.Routes[0].Backends.Backends[0].Backend.Balancer.Authority)
			case policy.ProtocolHTTP1:
				assert.Equal(t, "http", p.HTTP1.Routes[0].Meta.Name)
			case policy.ProtocolHTTP2:
				assert.Equal(t, "http", p.HTTP2.Routes[0].Meta.Name)
			}
		})
	}
	_, err := Parse([]byte(svc(`config.linkerd.io/opaque-ports: "80-x"`, "{port: 80}")))
	require.ErrorContains(t, err, `metadata.annotations.config.linkerd.io/opaque-ports: "80-x" is not a port, a range of ports or the name of a port of the Service`)
}

// TestBackendRefWithoutPort: the Gateway API requires a port on a Service
// backendRef; Linkerd's controller sends such a backend as invalid, whose
// requests fail with 500 "missing port for backend Service NAME"
// (policy-controller/k8s/index/src/outbound/index/http.rs convert_backend).
func TestBackendRefWithoutPort(t *testing.T) {
	route := `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r}
spec:
  parentRefs: [{kind: Service, group: core, name: authors, port: 7001}]
  rules:
  - backendRefs: [{name: authors}, {name: authors, port: 7001}]
`
	p := mustParse(t, authorsService, route).Policy("default", "authors", 7001)
	require.NotNil(t, p)
	compiles(t, p)
	bs := p.HTTP1.Routes[0].Rules[0].Backends.Backends
	require.Len(t, bs, 2)
	assert.Equal(t, policy.DefaultMetadata("invalid"), bs[0].Backend.Meta)
	assert.Nil(t, bs[0].Backend.Balancer, "not the parent's port")
	require.Len(t, bs[0].Filters, 1)
	assert.Equal(t, &policy.FailureInjector{Status: 500, Message: "missing port for backend Service authors"}, bs[0].Filters[0].FailureInjector)
	assert.NotNil(t, bs[1].Backend.Balancer)
}

// LoadFiles reads files held in memory (such as an etcd key's value) with
// Load's rules, each error naming the file by the name it was given.
func TestLoadFilesNamesTheKey(t *testing.T) {
	good := File{Name: "/inmesh/manifests/authors", Data: []byte("apiVersion: v1\nkind: Service\nmetadata: {name: authors}\nspec: {ports: [{port: 7001}]}\n")}
	r, err := LoadFiles(good)
	require.NoError(t, err)
	require.Len(t, r.Services, 1)
	_, err = LoadFiles(good, File{Name: "/inmesh/manifests/bad", Data: []byte("apiVersion: v1\nkind: Service\nmetadata: {name: Bad}\n")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "/inmesh/manifests/bad: document 1")
	assert.Contains(t, err.Error(), "metadata.name")
	_, err = LoadFiles(File{Name: "/inmesh/manifests/empty"})
	assert.ErrorContains(t, err, "/inmesh/manifests/empty: empty file")
	_, err = LoadFiles(good, File{Name: "/inmesh/manifests/again", Data: good.Data})
	assert.ErrorContains(t, err, "/inmesh/manifests/again: Service default/authors is also defined in /inmesh/manifests/authors")
}

// SplitResources gives each resource of a file alone, named by kind,
// namespace and name, and refuses a bad file as Parse does.
func TestSplitResources(t *testing.T) {
	data := []byte("# comment\napiVersion: v1\nkind: Service\nmetadata: {name: authors}\nspec: {ports: [{port: 7001}]}\n---\n---\n" +
		"apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: authors.default.svc.cluster.local, namespace: default}\nspec: {routes: []}\n")
	docs, err := SplitResources(data)
	require.NoError(t, err)
	require.Len(t, docs, 2)
	assert.Equal(t, []string{"Service", "default", "authors"}, []string{docs[0].Kind, docs[0].Namespace, docs[0].Name})
	assert.Equal(t, []string{"ServiceProfile", "", "authors.default.svc.cluster.local"}, []string{docs[1].Kind, docs[1].Namespace, docs[1].Name})
	// A ServiceProfile in a client's namespace carries it.
	web, err := SplitResources([]byte("apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: authors.default.svc.cluster.local, namespace: web}\nspec: {routes: []}\n"))
	require.NoError(t, err)
	require.Len(t, web, 1)
	assert.Equal(t, "web", web[0].Namespace)
	for _, d := range docs {
		r, err := Parse(d.Data)
		require.NoError(t, err)
		assert.Len(t, r.objects(), 1)
	}
	_, err = SplitResources([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: Bad}\n"))
	assert.ErrorContains(t, err, "document 1")
}

func TestServicePortOncePerProtocol(t *testing.T) {
	// Kubernetes lets one port number serve TCP and UDP under two names.
	r := mustParse(t, "apiVersion: v1\nkind: Service\nmetadata: {name: dns}\nspec:\n  ports: [{name: tcp, port: 53}, {name: udp, port: 53, protocol: UDP}]\n")
	s := r.Service("default", "dns")
	require.NotNil(t, s)
	assert.Len(t, s.Ports, 2)
	assert.True(t, s.HasPort(53))
}

// Which retry an HTTPRoute's rules get beside a Service annotated
// retry.linkerd.io/http: 5xx, limit 3, as Linkerd's policy controller
// decides (policy-controller/k8s/index/src/outbound/index/http.rs
// parse_http_retry; grpc/src/outbound/http.rs falls back to the Service's
// retry when the route has none): a limit or a timeout of zero is unset,
// the gRPC annotation is not an HTTP route's, and a retry of the route's
// own without a limit makes one retry.
func TestRouteRetryAnnotationsAsLinkerd(t *testing.T) {
	svc := `
apiVersion: v1
kind: Service
metadata:
  name: authors
  namespace: default
  annotations: {retry.linkerd.io/http: 5xx, retry.linkerd.io/limit: "3"}
spec:
  ports: [{port: 7001}]
`
	service := &policy.Retry{MaxRetries: 3, StatusRanges: []policy.StatusRange{{Start: 500, End: 599}}}
	for _, tc := range []struct {
		name        string
		annotations string
		want        *policy.Retry // MaxRetries, StatusRanges and Timeout compared
	}{
		{"none: the Service's", "", service},
		{"limit 0 alone is unset: the Service's", `retry.linkerd.io/limit: "0"`, service},
		{"timeout 0 alone is unset: the Service's", `retry.linkerd.io/timeout: 0s`, service},
		{"the gRPC annotation is not an HTTP route's: the Service's", `retry.linkerd.io/grpc: unavailable`, service},
		{"conditions with limit 0: one retry", `retry.linkerd.io/http: gateway-error, retry.linkerd.io/limit: "0"`,
			&policy.Retry{MaxRetries: 1, StatusRanges: []policy.StatusRange{{Start: 502, End: 504}}}},
		{"a limit alone: the route's, with no conditions", `retry.linkerd.io/limit: "2"`, &policy.Retry{MaxRetries: 2}},
		{"a timeout alone: the route's, one retry", `retry.linkerd.io/timeout: 50ms`, &policy.Retry{MaxRetries: 1, Timeout: 50 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			route := `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: authors
  namespace: default
  annotations: {` + tc.annotations + `}
spec:
  parentRefs: [{kind: Service, group: core, name: authors, port: 7001}]
  rules: [{}]
`
			p := mustParse(t, svc, route).Policy("default", "authors", 7001)
			require.NotNil(t, p)
			got := p.HTTP1.Routes[0].Rules[0].Retry
			require.NotNil(t, got)
			assert.Equal(t, tc.want.MaxRetries, got.MaxRetries)
			assert.Equal(t, tc.want.StatusRanges, got.StatusRanges)
			assert.Equal(t, tc.want.Timeout, got.Timeout)
		})
	}
}

// Annotation durations are read as Linkerd's policy controller reads them;
// the cases are those of its parse_duration tests
// (policy-controller/k8s/index/src/outbound/index.rs).
func TestAnnotationDurationsAsLinkerd(t *testing.T) {
	for s, want := range map[string]time.Duration{
		"10s": 10 * time.Second, "500ms": 500 * time.Millisecond, "5m": 5 * time.Minute, "2h": 2 * time.Hour,
		"1d": 24 * time.Hour, "0": 0, "0s": 0, "0ms": 0, " 3s ": 3 * time.Second,
	} {
		d, err := parseDuration(s)
		if assert.NoError(t, err, s) {
			assert.Equal(t, want, d, s)
		}
	}
	for _, s := range []string{"0.5s", "0.0s", "0.5m", "5", "100", "999999999999999999d", "10x", "", "-5s", "-0.5s", "1m30s"} {
		_, err := parseDuration(s)
		assert.Error(t, err, s)
	}
	_, err := Parse([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {timeout.linkerd.io/request: 100}}\n"))
	assert.ErrorContains(t, err, `metadata.annotations.timeout.linkerd.io/request: "100" has no unit (did you mean 100s or 100ms?)`)
}

// An HTTPRoute rule's timeouts are Gateway API Durations (GEP-2257).
func TestRuleTimeoutsAreGatewayDurations(t *testing.T) {
	for s, ok := range map[string]bool{"10s": true, "1h30m": true, "0s": true, "500ms": true, "1h2m3s4ms": true,
		"1.5s": false, "1d": false, "0": false, "123456s": false, "1h2m3s4ms5s": false, "-1s": false} {
		_, err := parseGatewayDuration(s)
		assert.Equal(t, ok, err == nil, "%s: %v", s, err)
	}
}
