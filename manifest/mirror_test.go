package manifest

import (
	"testing"

	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRequestMirrorManifests parses the RequestMirror filters of the
// Gateway API conformance manifests httproute-request-mirror.yaml,
// httproute-request-multiple-mirrors.yaml and
// httproute-request-percentage-mirror.yaml (kubernetes-sigs/gateway-api
// conformance/tests/) into the mirrors of each rule: header modifiers stay
// filters, the mirrors become the rule's, percent and fraction their share.
func TestRequestMirrorManifests(t *testing.T) {
	route := conformanceParent + `
  - matches: [{path: {type: PathPrefix, value: /mirror}}]
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: infra-backend-v2, port: 8080}}
    backendRefs: [{name: infra-backend-v1, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /multi-mirror-and-modify-request-headers}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: X-Header-Set, value: set-overwrites-values}], remove: [X-Header-Remove]}
    - type: RequestMirror
      requestMirror: {backendRef: {name: infra-backend-v2, namespace: default, port: 8080}}
    - type: RequestMirror
      requestMirror: {backendRef: {name: infra-backend-v3, port: 8080}}
    backendRefs: [{name: infra-backend-v1, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /percent-mirror}}]
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: infra-backend-v2, port: 8080}, percent: 20}
    backendRefs: [{name: infra-backend-v1, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /percent-mirror-fraction}}]
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: infra-backend-v2, port: 8080}, fraction: {numerator: 25, denominator: 50}}
    backendRefs: [{name: infra-backend-v1, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /unknown-mirror}}]
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: nowhere, port: 8080}, fraction: {numerator: 3}}
    backendRefs: [{name: infra-backend-v1, port: 8080}]
`
	docs := []string{replaceName(route, "request-mirror")}
	for _, svc := range []string{"gw", "infra-backend-v1", "infra-backend-v2", "infra-backend-v3"} {
		docs = append(docs, "apiVersion: v1\nkind: Service\nmetadata: {name: "+svc+"}\nspec: {ports: [{port: 8080}]}\n")
	}
	p := mustParse(t, docs...).Policy("default", "gw", 8080)
	require.NotNil(t, p)
	_, err := policy.Compile(p, policy.Options{})
	require.NoError(t, err)
	rules := p.HTTP1.Routes[0].Rules
	require.Len(t, rules, 5)
	mirror := func(name string, n, d uint32) policy.Mirror {
		return policy.Mirror{Meta: policy.Metadata{Group: "core", Kind: "Service", Namespace: "default", Name: name, Port: 8080},
			Authority: name + ".default.svc.cluster.local:8080", Ratio: policy.Ratio{Numerator: n, Denominator: d}}
	}
	assert.Equal(t, []policy.Mirror{mirror("infra-backend-v2", 0, 0)}, rules[0].Mirrors)
	assert.Equal(t, []policy.Mirror{mirror("infra-backend-v2", 0, 0), mirror("infra-backend-v3", 0, 0)}, rules[1].Mirrors)
	require.Len(t, rules[1].Filters, 1)
	assert.NotNil(t, rules[1].Filters[0].RequestHeaders)
	assert.Equal(t, []policy.Mirror{mirror("infra-backend-v2", 20, 100)}, rules[2].Mirrors)
	assert.Equal(t, []policy.Mirror{mirror("infra-backend-v2", 25, 50)}, rules[3].Mirrors)
	assert.Empty(t, rules[4].Mirrors, "a mirror of an unknown Service is dropped")
}

func replaceName(doc, name string) string {
	out := []byte{}
	for i := 0; i < len(doc); i++ {
		if i+4 <= len(doc) && doc[i:i+4] == "NAME" {
			out = append(out, name...)
			i += 3
			continue
		}
		out = append(out, doc[i])
	}
	return string(out)
}

// TestRequestMirrorErrors checks that an invalid RequestMirror filter is
// refused with the field named, as the Gateway API's validation does.
func TestRequestMirrorErrors(t *testing.T) {
	head := "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - filters:\n    - type: RequestMirror\n"
	for _, tc := range []struct{ name, doc, want string }{
		{"no requestMirror", head, "spec.rules[0].filters[0].requestMirror: required by type"},
		{"no backendRef", head + "      requestMirror: {percent: 5}\n", "spec.rules[0].filters[0].requestMirror.backendRef: required"},
		{"no port", head + "      requestMirror: {backendRef: {name: b}}\n", "requestMirror.backendRef.port: required for a Service"},
		{"not a Service", head + "      requestMirror: {backendRef: {group: s3, kind: Bucket, name: b, port: 1}}\n", "backend s3/Bucket is not a Service"},
		{"both", head + "      requestMirror: {backendRef: {name: b, port: 1}, percent: 5, fraction: {numerator: 1}}\n", "only one of percent or fraction may be specified"},
		{"percent", head + "      requestMirror: {backendRef: {name: b, port: 1}, percent: 101}\n", "requestMirror.percent: 101 is more than 100"},
		{"fraction", head + "      requestMirror: {backendRef: {name: b, port: 1}, fraction: {numerator: 3, denominator: 2}}\n", "requestMirror.fraction: numerator 3 is more than denominator 2"},
		{"zero denominator", head + "      requestMirror: {backendRef: {name: b, port: 1}, fraction: {numerator: 0, denominator: 0}}\n", "fraction.denominator: must be at least 1"},
		{"on a backendRef", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - backendRefs: [{name: b, port: 1, filters: [{type: RequestMirror}]}]\n", "filter \"RequestMirror\" is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
