package manifest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatewayConformance parses an HTTPRoute of the Gateway API conformance
// suite (with the gw Service as its parent and the infra-backend-v1..3
// Services as backends), and returns a function that says which backend a
// request goes to ("" when no rule matches).
func gatewayConformance(t *testing.T, route string) func(method, target string, headers map[string]string) string {
	t.Helper()
	docs := []string{route}
	for _, svc := range []string{"gw", "infra-backend-v1", "infra-backend-v2", "infra-backend-v3"} {
		docs = append(docs, "apiVersion: v1\nkind: Service\nmetadata: {name: "+svc+"}\nspec: {ports: [{port: 8080}]}\n")
	}
	p := mustParse(t, docs...).Policy("default", "gw", 8080)
	require.NotNil(t, p)
	table, err := policy.Compile(p, policy.Options{})
	require.NoError(t, err)
	return func(method, target string, headers map[string]string) string {
		req := httptest.NewRequest(method, "http://gw.default.svc.cluster.local:8080"+target, nil)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		r, _ := table.Select(req)
		if r == nil {
			return ""
		}
		return r.Backends.Backends[0].Backend.Meta.Name
	}
}

const conformanceParent = `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: NAME}
spec:
  parentRefs: [{group: core, kind: Service, name: gw, port: 8080}]
  rules:
`

// TestGatewayHTTPRouteMatching holds the cases of the Gateway API
// conformance test conformance/tests/httproute-matching.go (and its
// manifest): a rule's matches are OR-ed, the longest path wins, a header
// match counts, prefixes are segment-aware.
func TestGatewayHTTPRouteMatching(t *testing.T) {
	backendOf := gatewayConformance(t, strings.Replace(conformanceParent, "NAME", "matching", 1)+`
  - matches:
    - path: {type: PathPrefix, value: /}
    - headers: [{name: version, value: one}]
    backendRefs: [{name: infra-backend-v1, port: 8080}]
  - matches:
    - path: {type: PathPrefix, value: /v2}
    - headers: [{name: version, value: two}]
    backendRefs: [{name: infra-backend-v2, port: 8080}]
`)
	for _, tc := range []struct {
		path    string
		headers map[string]string
		want    string
	}{
		{"/", nil, "infra-backend-v1"},
		{"/example", nil, "infra-backend-v1"},
		{"/", map[string]string{"Version": "one"}, "infra-backend-v1"},
		{"/v2", nil, "infra-backend-v2"},
		{"/v2/example", nil, "infra-backend-v2"},
		{"/", map[string]string{"Version": "two"}, "infra-backend-v2"},
		{"/v2/", nil, "infra-backend-v2"},
		{"/v2example", nil, "infra-backend-v1"},
		{"/foo/v2/example", nil, "infra-backend-v1"},
	} {
		assert.Equal(t, tc.want, backendOf(http.MethodGet, tc.path, tc.headers), "%s %v", tc.path, tc.headers)
	}
}

// TestGatewayHTTPRouteMethodMatching holds the cases of the Gateway API
// conformance test conformance/tests/httproute-method-matching.go (and its
// manifest): a method match ranks after the path and before header
// matches, and a request no rule matches gets none (a 404).
func TestGatewayHTTPRouteMethodMatching(t *testing.T) {
	backendOf := gatewayConformance(t, strings.Replace(conformanceParent, "NAME", "method-matching", 1)+`
  - matches: [{method: POST}]
    backendRefs: [{name: infra-backend-v1, port: 8080}]
  - matches: [{method: GET}]
    backendRefs: [{name: infra-backend-v2, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /path1}, method: GET}]
    backendRefs: [{name: infra-backend-v1, port: 8080}]
  - matches: [{headers: [{name: version, value: one}], method: PUT}]
    backendRefs: [{name: infra-backend-v2, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /path2}, headers: [{name: version, value: two}], method: POST}]
    backendRefs: [{name: infra-backend-v3, port: 8080}]
  - matches:
    - {path: {type: PathPrefix, value: /path3}, method: PATCH}
    - {path: {type: PathPrefix, value: /path4}, headers: [{name: version, value: three}], method: DELETE}
    backendRefs: [{name: infra-backend-v1, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /path5}}]
    backendRefs: [{name: infra-backend-v1, port: 8080}]
  - matches: [{method: PATCH}]
    backendRefs: [{name: infra-backend-v2, port: 8080}]
  - matches: [{headers: [{name: version, value: four}]}]
    backendRefs: [{name: infra-backend-v3, port: 8080}]
`)
	for _, tc := range []struct {
		method, path string
		headers      map[string]string
		want         string // "" for the 404 cases
	}{
		{"POST", "/", nil, "infra-backend-v1"},
		{"GET", "/", nil, "infra-backend-v2"},
		{"HEAD", "/", nil, ""},
		{"GET", "/path1", nil, "infra-backend-v1"},
		{"PUT", "/", map[string]string{"version": "one"}, "infra-backend-v2"},
		{"POST", "/path2", map[string]string{"version": "two"}, "infra-backend-v3"},
		{"PATCH", "/path3", nil, "infra-backend-v1"},
		{"DELETE", "/path4", map[string]string{"version": "three"}, "infra-backend-v1"},
		{"PUT", "/", nil, ""},
		{"DELETE", "/path4", nil, ""},
		{"PATCH", "/path5", nil, "infra-backend-v1"},
		// The method outranks the header match: the PATCH rule wins.
		{"PATCH", "/", map[string]string{"version": "four"}, "infra-backend-v2"},
	} {
		assert.Equal(t, tc.want, backendOf(tc.method, tc.path, tc.headers), "%s %s %v", tc.method, tc.path, tc.headers)
	}
}
