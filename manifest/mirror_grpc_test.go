package manifest

import (
	"testing"

	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGRPCRequestMirrorManifests parses the RequestMirror filters of the
// Gateway API conformance manifests grpcroute-request-mirror.yaml and
// mesh/grpcroute-request-mirror.yaml (kubernetes-sigs/gateway-api
// conformance/tests/), with the percent and fraction a GRPCRoute's filter
// takes as an HTTPRoute's does, into the mirrors of each rule of a
// GRPCRoute: header modifiers stay filters, the mirrors become the rule's.
func TestGRPCRequestMirrorManifests(t *testing.T) {
	route := `apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: grpc-request-mirror}
spec:
  parentRefs: [{group: core, kind: Service, name: gw, port: 8080}]
  rules:
  - matches: [{headers: [{name: x-mirror-only, value: "true"}]}]
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: grpc-infra-backend-v2, port: 8080}}
    backendRefs: [{name: grpc-infra-backend-v1, port: 8080}]
  - matches: [{headers: [{name: x-mirror-and-modify, value: "true"}]}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: X-Header-Set, value: set-overwrites-values}], remove: [X-Header-Remove]}
    - type: RequestMirror
      requestMirror: {backendRef: {name: grpc-infra-backend-v2, port: 8080}}
    backendRefs: [{name: grpc-infra-backend-v1, port: 8080}]
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: grpc-infra-backend-v2, port: 8080}, percent: 20}
    - type: RequestMirror
      requestMirror: {backendRef: {name: grpc-infra-backend-v2, port: 8080}, fraction: {numerator: 1, denominator: 3}}
    backendRefs: [{name: grpc-infra-backend-v1, port: 8080}]
  - matches: [{method: {service: grpc.testing.TestService, method: UnaryCall}}]
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: nowhere, port: 8080}}
    backendRefs: [{name: grpc-infra-backend-v1, port: 8080}]
`
	docs := []string{route}
	for _, svc := range []string{"gw", "grpc-infra-backend-v1", "grpc-infra-backend-v2"} {
		docs = append(docs, "apiVersion: v1\nkind: Service\nmetadata: {name: "+svc+"}\nspec: {ports: [{port: 8080}]}\n")
	}
	p := mustParse(t, docs...).Policy("default", "gw", 8080)
	require.NotNil(t, p)
	_, err := policy.Compile(p, policy.Options{})
	require.NoError(t, err)
	require.Len(t, p.GRPC.Routes, 1)
	rules := p.GRPC.Routes[0].Rules
	require.Len(t, rules, 4)
	mirror := func(n, d uint32) policy.Mirror {
		return policy.Mirror{Meta: policy.Metadata{Group: "core", Kind: "Service", Namespace: "default", Name: "grpc-infra-backend-v2", Port: 8080},
			Authority: "grpc-infra-backend-v2.default.svc.cluster.local:8080", Ratio: policy.Ratio{Numerator: n, Denominator: d}}
	}
	assert.Equal(t, []policy.Mirror{mirror(0, 0)}, rules[0].Mirrors)
	assert.Empty(t, rules[0].Filters)
	assert.Equal(t, []policy.Mirror{mirror(0, 0)}, rules[1].Mirrors)
	require.Len(t, rules[1].Filters, 1)
	assert.NotNil(t, rules[1].Filters[0].RequestHeaders)
	assert.Equal(t, []policy.Mirror{mirror(20, 100), mirror(1, 3)}, rules[2].Mirrors)
	assert.Empty(t, rules[3].Mirrors, "a mirror of an unknown Service is dropped")
}

// TestGRPCRequestMirrorErrors: an invalid RequestMirror filter of a
// GRPCRoute is refused with the file's document and field named, and the
// HTTP-only filters stay refused.
func TestGRPCRequestMirrorErrors(t *testing.T) {
	head := "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - filters:\n    - type: RequestMirror\n"
	for _, tc := range []struct{ name, doc, want string }{
		{"no requestMirror", head, "spec.rules[0].filters[0].requestMirror: required by type"},
		{"no port", head + "      requestMirror: {backendRef: {name: b}}\n", "requestMirror.backendRef.port: required for a Service"},
		{"percent", head + "      requestMirror: {backendRef: {name: b, port: 1}, percent: 101}\n", "requestMirror.percent: 101 is more than 100"},
		{"both", head + "      requestMirror: {backendRef: {name: b, port: 1}, percent: 5, fraction: {numerator: 1}}\n", "only one of percent or fraction may be specified"},
		{"fraction", head + "      requestMirror: {backendRef: {name: b, port: 1}, fraction: {numerator: 3, denominator: 2}}\n", "numerator 3 is more than denominator 2"},
		{"a redirect is HTTP only", "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - filters:\n    - type: RequestRedirect\n      requestRedirect: {statusCode: 301}\n", "spec.rules[0].filters[0].requestRedirect"},
		{"on a backendRef", "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - backendRefs: [{name: b, port: 1, filters: [{type: RequestMirror}]}]\n", "filter \"RequestMirror\" is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFiles(File{Name: "grpc.yaml", Data: []byte(tc.doc)})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "grpc.yaml: document 1 (GRPCRoute default/r)")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
