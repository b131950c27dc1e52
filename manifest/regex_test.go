package manifest_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/policy"
)

// TestRouteRegexTheProxiesCannotCompileIsRefusedAtLoad: a RegularExpression
// match (path, header or query parameter) that the proxies' compiler
// refuses is refused by the loader, naming the file, the document and the
// field, for a route of a Service (outbound) or of a Server (inbound), an
// HTTPRoute or a GRPCRoute, as Linkerd's policy controller does not index
// a route whose regex does not parse
// (policy-controller/k8s/index/src/routes/http.rs path_match,
// header_match, query_param_match). Served, such a route makes every
// client refuse the whole policy of its parent: the Service stays on its
// last table or its default route, and a fresh inbound port falls to the
// default policy once its wait is over. A regex the proxies compile loads.
func TestRouteRegexTheProxiesCannotCompileIsRefusedAtLoad(t *testing.T) {
	const service = `apiVersion: v1
kind: Service
metadata: {name: a, namespace: default}
spec: {ports: [{name: http, port: 80}]}
---
`
	const server = `apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: a-http, namespace: default}
spec: {podSelector: {matchLabels: {app: a}}, port: 80}
---
`
	httpRoute := func(parent, match string) string {
		return `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: default}
spec:
  parentRefs: [` + parent + `]
  rules:
  - matches: [` + match + `]
`
	}
	const toService = `{kind: Service, group: core, name: a, port: 80}`
	const toServer = `{kind: Server, group: policy.linkerd.io, name: a-http}`
	long := strings.Repeat("a", policy.MaxRegexLen+1)
	for _, tc := range []struct {
		name, yaml string
		want       string // "" when it loads
	}{
		{
			name: "path of a Service's route",
			yaml: service + httpRoute(toService, `{path: {type: RegularExpression, value: "/(["}}`),
			want: "routes.yaml: document 2 (HTTPRoute default/r): spec.rules[0].matches[0].path.value: bad regular expression: error parsing regexp: missing closing ]: `[`",
		},
		{
			name: "header of a Service's route",
			yaml: service + httpRoute(toService, `{headers: [{type: RegularExpression, name: x, value: "(["}]}`),
			want: "routes.yaml: document 2 (HTTPRoute default/r): spec.rules[0].matches[0].headers[0].value: bad regular expression: error parsing regexp: missing closing ]: `[`",
		},
		{
			name: "query parameter of a Service's route",
			yaml: service + httpRoute(toService, `{queryParams: [{type: RegularExpression, name: x, value: "a**"}]}`),
			want: "routes.yaml: document 2 (HTTPRoute default/r): spec.rules[0].matches[0].queryParams[0].value: bad regular expression: error parsing regexp: invalid nested repetition operator: `**`",
		},
		{
			name: "path of a Server's route (inbound)",
			yaml: server + httpRoute(toServer, `{path: {type: RegularExpression, value: "/admin(["}}`),
			want: "routes.yaml: document 2 (HTTPRoute default/r): spec.rules[0].matches[0].path.value: bad regular expression: error parsing regexp: missing closing ]: `[`",
		},
		{
			name: "longer than the proxies take",
			yaml: service + httpRoute(toService, `{path: {type: RegularExpression, value: "`+long+`"}}`),
			want: "routes.yaml: document 2 (HTTPRoute default/r): spec.rules[0].matches[0].path.value: bad regular expression: regex of 1025 bytes is longer than the limit of 1024",
		},
		{
			name: "header of a GRPCRoute",
			yaml: service + `apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: g, namespace: default}
spec:
  parentRefs: [` + toService + `]
  rules:
  - matches: [{headers: [{type: RegularExpression, name: x, value: ")("}]}]
`,
			want: "routes.yaml: document 2 (GRPCRoute default/g): spec.rules[0].matches[0].headers[0].value: bad regular expression: error parsing regexp: unexpected ): `)(`",
		},
		{
			name: "a regex the proxies compile",
			yaml: service + httpRoute(toService, `{path: {type: RegularExpression, value: "/books/[0-9]+"}, headers: [{type: RegularExpression, name: x, value: "a|ab"}], queryParams: [{type: RegularExpression, name: q, value: ".*"}]}`),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := manifest.LoadFiles(manifest.File{Name: "routes.yaml", Data: []byte(tc.yaml)})
			if tc.want == "" {
				require.NoError(t, err)
				_, err = policy.Compile(r.Policy("default", "a", 80), policy.Options{})
				assert.NoError(t, err, "the clients compile what loads")
				return
			}
			if err == nil {
				if _, cerr := policy.Compile(r.Policy("default", "a", 80), policy.Options{}); cerr != nil {
					t.Logf("loaded; every client refuses the policy served for a:80: %v", cerr)
				}
			}
			require.Error(t, err, "loads")
			assert.Equal(t, tc.want, err.Error())
		})
	}
}
