package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const authors = "authors.default.svc.cluster.local:7001"

// authorsRoutes is the Service and HTTPRoute of the authors service: a
// prefix rule that marks requests with a header, and a rule with a 200ms
// request timeout.
func authorsRoutes(mark string) string {
	return `apiVersion: v1
kind: Service
metadata:
  name: authors
  namespace: default
  annotations: {retry.linkerd.io/http: 5xx, retry.linkerd.io/limit: "1"}
spec:
  ports: [{name: http, port: 7001}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: authors-routes, namespace: default}
spec:
  parentRefs: [{group: core, kind: Service, name: authors, port: 7001}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /authors}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-routed, value: ` + mark + `}]}
    backendRefs: [{name: authors, port: 7001}]
  - matches: [{path: {type: Exact, value: /slow}}]
    timeouts: {request: 200ms}
    backendRefs: [{name: authors, port: 7001}]
`
}

// The outbound proxy routes by an HTTPRoute served over the OutboundPolicies
// API by the control plane, from the same -destination address as the
// Destination API: the route's filter reaches the application, its
// timeout answers 504, a request no rule matches gets 404, the
// outbound_http_route_* series carry the route, /routes explains it, and an
// edit of the YAML routes within 2s without a restart.
func TestPolicyEndToEnd(t *testing.T) {
	needCurl(t)
	bin := build(t)
	dir := t.TempDir()
	profiles, policies := filepath.Join(dir, "profiles"), filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.Mkdir(policies, 0o755))
	routesFile := filepath.Join(policies, "authors.yaml")
	require.NoError(t, os.WriteFile(routesFile, []byte(authorsRoutes("v1")), 0o644))

	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/fail") {
			http.Error(w, "failed", http.StatusServiceUnavailable)
			return
		}
		if r.URL.Path == "/slow" {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		}
		fmt.Fprintf(w, "%s %s", r.URL.Path, r.Header.Get("X-Routed"))
	}))
	defer app.Close()
	appAddr := strings.TrimPrefix(app.URL, "http://")
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0",
		"-profiles", profiles, "-endpoints", endpoints, "-policies", policies, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)
	_, _, bIn, _ := startProxy(t, bin, dstAddr, appAddr)
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n", authors, bIn)), 0o644))
	dst.waitLog(t, loadedEndpointsRe)
	_, aOut, _, aMetrics := startProxy(t, bin, dstAddr, appAddr)

	get := func(path string) (int, string, string) {
		return curl(t, "-H", "Host: "+authors, "http://"+aOut+path)
	}
	require.Eventually(t, func() bool {
		status, _, body := get("/authors/1")
		return status == 200 && body == "/authors/1 v1"
	}, timeout, 50*time.Millisecond, "the HTTPRoute never routed")

	text := scrape(t, aMetrics)
	n, ok := metric(text, "outbound_http_route_request_statuses_total", `parent_name="authors"`, `parent_port="7001"`,
		`route_kind="HTTPRoute"`, `route_name="authors-routes"`, `http_status="200"`, `error=""`)
	assert.True(t, ok, "outbound_http_route_request_statuses_total for the route")
	assert.GreaterOrEqual(t, n, 1.0)
	_, ok = metric(text, "outbound_http_route_backend_requests_total", `route_name="authors-routes"`, `backend_name="authors"`, `backend_port="7001"`)
	assert.True(t, ok, "the backend series")

	resp, err := http.Get("http://" + aMetrics + "/routes?authority=" + authors + "&method=GET&path=/authors/1")
	require.NoError(t, err)
	explained, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(explained), `"model": "policy"`)
	assert.Contains(t, string(explained), `"route": "authors-routes"`)

	status, headers, _ := get("/slow")
	assert.Equal(t, 504, status, "the rule's request timeout")
	assert.Contains(t, headers, "l5d-proxy-error")
	_, ok = metric(scrape(t, aMetrics), "outbound_http_route_request_statuses_total", `route_name="authors-routes"`, `error="REQUEST_TIMEOUT"`)
	assert.True(t, ok, "the timeout's error label")

	status, _, _ = get("/elsewhere")
	assert.Equal(t, 404, status, "no rule matches")

	// A failing request is retried once (the Service's annotations).
	status, _, _ = get("/authors/fail")
	assert.Equal(t, 503, status)

	// Every family, series by series, with exactly Linkerd's label names.
	text = scrape(t, aMetrics)
	parent := []string{"parent_group", "parent_kind", "parent_namespace", "parent_name", "parent_port", "parent_section_name"}
	route := []string{"route_group", "route_kind", "route_namespace", "route_name"}
	backend := []string{"backend_group", "backend_kind", "backend_namespace", "backend_name", "backend_port", "backend_section_name"}
	cat := func(groups ...[]string) []string {
		var out []string
		for _, g := range groups {
			out = append(out, g...)
		}
		return out
	}
	for family, want := range map[string][]string{
		"outbound_http_route_request_duration_seconds_bucket":          cat(parent, route, []string{"hostname", "le"}),
		"outbound_http_route_request_duration_seconds_count":           cat(parent, route, []string{"hostname"}),
		"outbound_http_route_request_statuses_total":                   cat(parent, route, []string{"hostname", "http_status", "error"}),
		"outbound_http_route_retry_requests_total":                     cat(parent, route),
		"outbound_http_route_retry_limit_exceeded_total":               cat(parent, route),
		"outbound_http_route_backend_requests_total":                   cat(parent, route, backend),
		"outbound_http_route_backend_response_duration_seconds_bucket": cat(parent, route, backend, []string{"le"}),
		"outbound_http_route_backend_response_statuses_total":          cat(parent, route, backend, []string{"http_status", "error"}),
	} {
		series := seriesOf(text, family, `route_name="authors-routes"`)
		if assert.NotEmpty(t, series, family) {
			for _, labels := range series {
				assert.ElementsMatch(t, want, labelNames(labels), "%s{%s}", family, labels)
			}
		}
	}
	retried, _ := metric(text, "outbound_http_route_retry_requests_total", `route_name="authors-routes"`)
	assert.Equal(t, 1.0, retried)
	exceeded, _ := metric(text, "outbound_http_route_retry_limit_exceeded_total", `route_name="authors-routes"`)
	assert.Equal(t, 1.0, exceeded)
	attempts, _ := metric(text, "outbound_http_route_backend_response_statuses_total", `route_name="authors-routes"`, `http_status="503"`)
	assert.Equal(t, 2.0, attempts, "both attempts on the backend series")
	line, _ := metric(text, "outbound_http_route_request_statuses_total", `route_name="authors-routes"`, `http_status="503"`)
	assert.Equal(t, 1.0, line, "one logical request")
	t.Logf("a series: %s", seriesOf(text, "outbound_http_route_request_statuses_total", `http_status="503"`))

	// Editing the route changes routing without a restart, within 2s.
	require.NoError(t, os.WriteFile(routesFile, []byte(authorsRoutes("v2")), 0o644))
	editedAt := time.Now()
	require.Eventually(t, func() bool {
		_, _, body := get("/authors/1")
		return body == "/authors/1 v2"
	}, 2*time.Second, 20*time.Millisecond, "the edit did not take effect within 2s")
	t.Logf("route edit took effect after %v", time.Since(editedAt).Round(time.Millisecond))
}

// seriesOf returns the label text of every series of a family holding all
// the given label pairs.
func seriesOf(text, family string, pairs ...string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, family+"{")
		if !ok {
			continue
		}
		labels, _, _ := strings.Cut(rest, "} ")
		all := true
		for _, p := range pairs {
			all = all && strings.Contains(labels, p)
		}
		if all {
			out = append(out, labels)
		}
	}
	return out
}

// labelNames returns the names of a series' labels (values hold no quote
// here, so splitting on the quoted values is enough).
func labelNames(labels string) []string {
	var names []string
	for labels != "" {
		name, rest, ok := strings.Cut(labels, `="`)
		if !ok {
			break
		}
		names = append(names, strings.TrimPrefix(name, ","))
		_, labels, _ = strings.Cut(rest, `"`)
	}
	return names
}
