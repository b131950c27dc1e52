package profiles

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const header = "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata:\n  name: web.ns.svc.cluster.local\n"

func withRoute(route string) string {
	return header + "spec:\n  routes:\n  - name: r\n" + route
}

func TestParseServiceProfilesDocuments(t *testing.T) {
	data := "# leading comment\n---\n" + header + "spec: {}\n--- # second\n" +
		strings.Replace(header, "web", "api", 1) + "spec:\n  routes:\n  - name: all\n    condition: {pathRegex: '/.*'}\n---\n"
	sps, err := ParseServiceProfiles([]byte(data))
	require.NoError(t, err)
	require.Len(t, sps, 2)
	assert.Equal(t, "web.ns.svc.cluster.local", sps[0].Name)
	assert.Equal(t, DefaultRetryBudget(), sps[0].RetryBudget, "no retryBudget means the default")
	assert.Equal(t, "api.ns.svc.cluster.local", sps[1].Name)
	assert.Equal(t, []Route{{Condition: PathRegex("/.*"), Labels: map[string]string{"route": "all"}}}, sps[1].Routes)
}

func TestParseServiceProfileErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"bad YAML", header + "spec:\n  routes: [\n", "document 1: bad YAML"},
		{"wrong kind", "apiVersion: linkerd.io/v1alpha2\nkind: Service\nmetadata: {name: a.b}\nspec: {}\n", `document 1: kind: "Service" is not supported`},
		{"wrong version", "apiVersion: linkerd.io/v1\nkind: ServiceProfile\nmetadata: {name: a.b}\nspec: {}\n", `apiVersion: "linkerd.io/v1" is not supported`},
		{"no name", "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {}\nspec: {}\n", "metadata: name: required"},
		{"bad name", "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: 'a b'}\nspec: {}\n", `metadata.name: "a b" is not a fully qualified service name`},
		{"unknown spec field", header + "spec:\n  rutes: []\n", "spec.rutes: unknown field"},
		{"route without name", header + "spec:\n  routes:\n  - condition: {method: GET}\n", "spec.routes[0]: name: required"},
		{"route without condition", withRoute(""), "spec.routes[0].condition: required"},
		{"unknown condition", withRoute("    condition: {path: /x}\n"), "spec.routes[0].condition.path: unknown field (known: all, any, method, not, pathRegex)"},
		{"empty condition", withRoute("    condition: {}\n"), "spec.routes[0].condition: no condition set"},
		{"bad regex", withRoute("    condition: {pathRegex: '/a(b'}\n"), "spec.routes[0].condition.pathRegex: bad regex"},
		{"long regex", withRoute("    condition: {pathRegex: '" + strings.Repeat("a", 1025) + "'}\n"), "spec.routes[0].condition.pathRegex: regex of 1025 bytes is longer than the limit of 1024"},
		{"nested bad regex", withRoute("    condition:\n      all:\n      - not: {pathRegex: '*'}\n"), "spec.routes[0].condition.all[0].not.pathRegex: bad regex"},
		{"bad method", withRoute("    condition: {method: 'GE T'}\n"), `spec.routes[0].condition.method: "GE T" is not an HTTP method`},
		{"bad duration", withRoute("    condition: {method: GET}\n    timeout: 3 seconds\n"), `spec.routes[0].timeout: "3 seconds" is not a duration`},
		{"retryable not bool", withRoute("    condition: {method: GET}\n    isRetryable: maybe\n"), "spec.routes[0].isRetryable: must be true or false"},
		{"class without condition", withRoute("    condition: {method: GET}\n    responseClasses:\n    - isFailure: true\n"), "spec.routes[0].responseClasses[0].condition: required"},
		{"unknown response condition", withRoute("    condition: {method: GET}\n    responseClasses:\n    - condition: {code: 500}\n"), "spec.routes[0].responseClasses[0].condition.code: unknown field"},
		{"status both zero", withRoute("    condition: {method: GET}\n    responseClasses:\n    - condition: {status: {}}\n"), "spec.routes[0].responseClasses[0].condition.status: min and max are both unset"},
		{"status out of range", withRoute("    condition: {method: GET}\n    responseClasses:\n    - condition: {status: {min: 500, max: 1000}}\n"), "outside the status codes 100-999"},
		{"status reversed", withRoute("    condition: {method: GET}\n    responseClasses:\n    - condition: {status: {min: 599, max: 500}}\n"), "min 599 is greater than max 500"},
		{"ratio out of range", header + "spec:\n  retryBudget: {retryRatio: 1001, minRetriesPerSecond: 1, ttl: 10s}\n", "spec.retryBudget.retryRatio: 1001 is outside [0, 1000]"},
		{"ratio negative", header + "spec:\n  retryBudget: {retryRatio: -1, minRetriesPerSecond: 1, ttl: 10s}\n", "spec.retryBudget.retryRatio: -1 is outside [0, 1000]"},
		{"ttl out of range", header + "spec:\n  retryBudget: {retryRatio: 0.2, minRetriesPerSecond: 1, ttl: 1000s}\n", "spec.retryBudget.ttl: 16m40s is outside [1s, 60s]"},
		{"bad ttl", header + "spec:\n  retryBudget: {retryRatio: 0.2, minRetriesPerSecond: 1, ttl: ten}\n", `spec.retryBudget.ttl: "ten" is not a duration`},
		{"budget missing field", header + "spec:\n  retryBudget: {retryRatio: 0.2, ttl: 10s}\n", "spec.retryBudget.minRetriesPerSecond: required"},
		{"bad quantity", header + "spec:\n  dstOverrides:\n  - {authority: a.ns.svc.cluster.local:80, weight: 1x}\n", `spec.dstOverrides[0].weight: "1x" has an unknown suffix "x"`},
		{"negative quantity", header + "spec:\n  dstOverrides:\n  - {authority: a.ns.svc.cluster.local:80, weight: -1}\n", `spec.dstOverrides[0].weight: "-1" is negative`},
		{"bad override authority", header + "spec:\n  dstOverrides:\n  - {authority: 'a b:80', weight: 1}\n", `spec.dstOverrides[0].authority: "a b:80" is not a host name`},
		{"missing weight", header + "spec:\n  dstOverrides:\n  - {authority: a.ns.svc.cluster.local}\n", "spec.dstOverrides[0].weight: required"},
		{"bad opaque port", header + "spec:\n  opaquePorts: [0]\n", `spec.opaquePorts[0]: "0" is not a port`},
		{"too deep", withRoute("    condition: " + strings.Repeat("{not: ", 40) + "{method: GET}" + strings.Repeat("}", 40) + "\n"), "nested deeper than 32"},
		{"second document", header + "spec: {}\n---\n" + header + "spec:\n  opaquePorts: [x]\n", "document 2: spec.opaquePorts[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sps, err := ParseServiceProfiles([]byte(tt.yaml))
			assert.ErrorContains(t, err, tt.want)
			assert.Nil(t, sps)
		})
	}
	t.Run("too many routes", func(t *testing.T) {
		var b strings.Builder
		b.WriteString(header + "spec:\n  routes:\n")
		for range MaxRoutes + 1 {
			b.WriteString("  - {name: r, condition: {method: GET}}\n")
		}
		_, err := ParseServiceProfiles([]byte(b.String()))
		assert.ErrorContains(t, err, "spec.routes: 257 routes is more than the limit of 256")
	})
}

func TestProfileFor(t *testing.T) {
	sps, err := ParseServiceProfiles([]byte(header + `spec:
  routes:
  - name: GET /x
    condition: {method: GET, pathRegex: /x}
    timeout: 250ms
    isRetryable: true
  dstOverrides:
  - {authority: web-v2.ns.svc.cluster.local, weight: 0.25}
  - {authority: "web-v3.ns.svc.cluster.local:9000", weight: 750m}
  opaquePorts: {"3306": {}}
`))
	require.NoError(t, err)
	p := sps[0].ProfileFor(8080)
	assert.Equal(t, "web.ns.svc.cluster.local", p.FullyQualifiedName)
	assert.Equal(t, MatchAll{Method("GET"), PathRegex("/x")}, p.Routes[0].Condition, "fields of one condition combine with all")
	assert.Equal(t, 250*time.Millisecond, p.Routes[0].Timeout)
	assert.True(t, p.Routes[0].Retryable)
	assert.Equal(t, []endpoint.WeightedDst{
		{Authority: "web-v2.ns.svc.cluster.local:8080", Weight: 2500},
		{Authority: "web-v3.ns.svc.cluster.local:9000", Weight: 7500},
	}, p.DstOverrides)
	assert.False(t, p.OpaqueProtocol)
	assert.True(t, sps[0].ProfileFor(3306).OpaqueProtocol)
}

func TestParseWeight(t *testing.T) {
	for in, want := range map[string]uint32{
		"1": 10000, "500m": 5000, "0.5": 5000, "1000m": 10000, "0": 0, "1e3": 10_000_000, "2k": 20_000_000,
		"1Ki": 10_240_000, "1u": 10, "0.0001": 10, "1n": 10, " 3 ": 30000, "1E1": 100000,
	} {
		got, err := parseWeight(in)
		if assert.NoError(t, err, in) {
			assert.Equal(t, want, got, in)
		}
	}
	for _, in := range []string{"", "x", "1x", "-1", "+1", "1..2", "1e99", "1G", "."} {
		_, err := parseWeight(in)
		assert.Error(t, err, in)
	}
}

func TestRetryBudgetValidate(t *testing.T) {
	assert.NoError(t, DefaultRetryBudget().Validate())
	assert.ErrorContains(t, RetryBudget{RetryRatio: 10000, TTL: time.Second}.Validate(), "retryRatio")
	assert.ErrorContains(t, RetryBudget{RetryRatio: -1, TTL: time.Second}.Validate(), "retryRatio")
	assert.ErrorContains(t, RetryBudget{RetryRatio: 0.1, TTL: 1000 * time.Second}.Validate(), "ttl")
	assert.ErrorContains(t, RetryBudget{RetryRatio: 0.1}.Validate(), "ttl")
	assert.ErrorContains(t, RetryBudget{RetryRatio: 0.1, MinRetriesPerSecond: 1 << 31, TTL: time.Second}.Validate(), "minRetriesPerSecond")
}

// As Linkerd's controller: a method is upper-cased, so `method: delete`
// matches a DELETE request (methods are case-sensitive on the wire).
func TestMethodIsUpperCased(t *testing.T) {
	sps, err := ParseServiceProfiles([]byte(header + "spec:\n  routes:\n  - name: del\n    condition: {method: delete, pathRegex: /books/.*}\n  - name: purge\n    condition: {method: Purge}\n"))
	require.NoError(t, err)
	table, err := Compile(sps[0].ProfileFor(80), Options{})
	require.NoError(t, err)
	del := httptest.NewRequest(http.MethodDelete, "/books/1", nil)
	assert.Equal(t, "del", table.Select(del).Labels["route"])
	purge := httptest.NewRequest("PURGE", "/x", nil)
	assert.Equal(t, "purge", table.Select(purge).Labels["route"])
	assert.True(t, table.Select(httptest.NewRequest(http.MethodGet, "/books/1", nil)).IsDefault())
}

func TestParseServiceProfileDuplicateKey(t *testing.T) {
	_, err := ParseServiceProfiles([]byte(header + "spec:\n  routes:\n  - name: a\n    name: b\n    condition: {method: GET}\n"))
	assert.ErrorContains(t, err, `document 1: spec.routes[0].name: duplicate key "name"`)
}

// A ServiceProfile whose name can never be a request's authority is named
// as such when loaded.
func TestNameProblem(t *testing.T) {
	for name, bad := range map[string]bool{
		"stock":                           true,
		"stock.default.svc":               true,
		"stock.svc.cluster.local":         true,
		"stock.default.svc.cluster.local": false,
		"stock.default.svc.example.org":   false,
		"api.example.com":                 false,
		"stock.default":                   false, // two labels: maybe an external domain
	} {
		err := (&ServiceProfile{Name: name}).NameProblem()
		assert.Equal(t, bad, err != nil, "%s: %v", name, err)
		if bad {
			assert.ErrorContains(t, err, "is not a fully qualified service name")
		}
	}
}
