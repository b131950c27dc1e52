package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inboundManifests are the inbound policy of the books pod's port, as a
// Linkerd user writes it: a Server for the port with an HTTPRoute for GET
// /books only, an AuthorizationPolicy admitting clients from a network,
// and a rate limit.
func inboundManifests(appPort uint16, network string, serverAnnotations ...string) string {
	annotations := "{}"
	if len(serverAnnotations) > 0 {
		annotations = "{" + strings.Join(serverAnnotations, ", ") + "}"
	}
	return fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: default, labels: {app: books}}
spec:
  containers: [{name: books, ports: [{name: http, containerPort: %d}]}]
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: books-http, namespace: default, annotations: %s}
spec:
  podSelector: {matchLabels: {app: books}}
  port: http
---
apiVersion: policy.linkerd.io/v1beta3
kind: HTTPRoute
metadata: {name: books-list, namespace: default}
spec:
  parentRefs: [{group: policy.linkerd.io, kind: Server, name: books-http}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /books}, method: GET}]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: NetworkAuthentication
metadata: {name: callers, namespace: default}
spec:
  networks: [%s]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: books-callers, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books-http}
  requiredAuthenticationRefs: [{group: policy.linkerd.io, kind: NetworkAuthentication, name: callers}]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: HTTPLocalRateLimitPolicy
metadata: {name: books, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books-http}
  total: {requestsPerSecond: 20}
`, appPort, annotations, network)
}

// TestInboundPolicyThroughTheProxies: the embedded control plane serves
// the books pod's inbound policy from the manifests in -policies; the
// books proxy (-workload default:books-0, callers sharing its machine, so
// no localhost authorization) enforces it per request: 404 off the route,
// 200 on it, 429 past the rate limit; a network authorization that
// excludes loopback answers 403 once the edit is loaded, without a
// restart; a bad manifest keeps that policy; a limit of one request in
// flight answers a second 503 at once; refused requests never reach the
// app, and each is counted in Linkerd's families, the allowed ones in the
// inbound response_total with the Server, route and authorization.
func TestInboundPolicyThroughTheProxies(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(policies, 0o755))
	var reached atomic.Int32
	slowIn, release := make(chan struct{}, 1), make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if r.URL.Path == "/books/slow" {
			slowIn <- struct{}{}
			<-release
		}
		fmt.Fprint(w, r.URL.Path)
	}))
	defer app.Close()
	appAddr := strings.TrimPrefix(app.URL, "http://")
	appPort := netip.MustParseAddrPort(appAddr).Port()
	policyFile := filepath.Join(policies, "books.yaml")
	require.NoError(t, os.WriteFile(policyFile, []byte(inboundManifests(appPort, "{cidr: 0.0.0.0/0}")), 0o644))
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644))

	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0",
		"-endpoints", endpoints, "-policies", policies, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)
	b := start(t, filepath.Join(bin, "proxy"), []string{"INMESH_CONTROL_BACKOFF_DELAY=100ms"},
		"-destination", dstAddr, "-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-app", appAddr, "-metrics", "127.0.0.1:0",
		"-workload", "default:books-0", "-trust-localhost=false")
	_, bIn, bMetrics := b.waitLog(t, listenRe("outbound")), b.waitLog(t, listenRe("inbound")), b.waitLog(t, listenRe("metrics"))
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n", books, bIn)), 0o644))
	dst.waitLog(t, loadedEndpointsRe)
	_, aOut, _, _ := startProxy(t, bin, dstAddr, appAddr)
	get := func(path string) int {
		status, _, _ := curl(t, "-H", "Host: "+books, "http://"+aOut+path)
		return status
	}

	// The proxy's first inbound request waits for the Server's policy:
	// off its route, 404 at once (never the default policy's 200).
	require.Equal(t, 404, get("/authors/1"), "the Server's routes from the first request")
	assert.Equal(t, 200, get("/books/1"), "the route admits")
	before := reached.Load()
	assert.Equal(t, 404, get("/authors/1"), "no route of the Server")
	assert.Equal(t, before, reached.Load(), "refused requests never reach the app")

	// total: 20 a second, burst 20: of 100 requests in a row on a kept
	// connection, some are limited.
	limited := 0
	for range 100 {
		req, err := http.NewRequest("GET", "http://"+aOut+"/books/1", nil)
		require.NoError(t, err)
		req.Host = books
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 429 {
			limited++
		}
	}
	assert.Positive(t, limited, "the rate limit")

	// /routes explains an inbound request: the Server, the route and the
	// authorization that decide it, or its denial.
	explain := func(query string) string {
		resp, err := http.Get("http://" + bMetrics + "/routes?direction=inbound&" + query)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, "%s", b)
		return string(b)
	}
	text := explain("method=GET&path=/books/1&client=10.1.2.3")
	assert.Contains(t, text, `"name": "books-http"`)
	assert.Contains(t, text, `"name": "books-list"`)
	assert.Contains(t, text, `"name": "books-callers"`)
	assert.Contains(t, text, `"decision": "allow"`)
	assert.Contains(t, explain("method=POST&path=/books/1"), `"decision": "no route"`)

	// The edit: the network authorization now excludes loopback.
	edited := time.Now()
	require.NoError(t, os.WriteFile(policyFile, []byte(inboundManifests(appPort, "{cidr: 0.0.0.0/0, except: [127.0.0.0/8]}")), 0o644))
	require.Eventually(t, func() bool { return get("/books/1") == 403 }, timeout, 20*time.Millisecond, "loopback denied")
	t.Logf("the edit was enforced %v after it was written (files checked every 100ms)", time.Since(edited).Round(time.Millisecond))
	assert.Contains(t, explain("method=GET&path=/books/1&client=127.0.0.1"), `"decision": "deny"`)

	// A bad manifest is refused, naming it, and the last good policy
	// stays in force.
	require.NoError(t, os.WriteFile(policyFile, []byte(inboundManifests(appPort, "{cidr: not-a-network}")), 0o644))
	dst.waitLog(t, regexp.MustCompile(`rejected a control-plane file.*books\.yaml`))
	assert.Equal(t, 403, get("/books/1"), "the last good policy stays")

	// inmesh's own limit of requests in flight, from the Server's
	// annotation: with one request held in the app, the next is refused
	// at once.
	require.NoError(t, os.WriteFile(policyFile, []byte(inboundManifests(appPort, "{cidr: 0.0.0.0/0}",
		`inmesh.io/max-concurrent-requests: "1"`)), 0o644))
	require.Eventually(t, func() bool { return get("/books/1") == 200 }, timeout, 100*time.Millisecond, "loopback allowed again")
	held := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+aOut+"/books/slow", nil)
		req.Host = books
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			held <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	<-slowIn
	// (The proxies here have no identities: a plaintext peer gets the
	// bare status, without l5d-proxy-error, as from Linkerd's proxy.)
	status, _, _ := curl(t, "-H", "Host: "+books, "http://"+aOut+"/books/1")
	assert.Equal(t, 503, status, "past the limit of requests in flight")
	close(release)
	assert.Equal(t, 200, <-held, "the held request completes")

	text = scrape(t, bMetrics)
	srv := []string{`srv_group="policy.linkerd.io"`, `srv_kind="server"`, `srv_name="books-http"`, `srv_port="` + fmt.Sprint(appPort) + `"`}
	_, ok := metric(text, "inbound_http_route_not_found_total", srv...)
	assert.True(t, ok, "route not found counted")
	_, ok = metric(text, "inbound_http_authz_allow_total", append(srv, `route_name="books-list"`, `authz_kind="authorizationpolicy"`, `authz_name="books-callers"`)...)
	assert.True(t, ok, "allowed counted")
	_, ok = metric(text, "inbound_http_authz_deny_total", append(srv, `route_name="books-list"`)...)
	assert.True(t, ok, "denied counted")
	_, ok = metric(text, "inbound_http_local_ratelimit_total", append(srv, `ratelimit_scope="total"`, `ratelimit_name="books"`)...)
	assert.True(t, ok, "limited counted")
	v, ok := metric(text, "inbound_http_concurrency_limit_total", srv...)
	assert.True(t, ok, "the in-flight refusal counted")
	assert.Equal(t, 1.0, v)
	_, ok = metric(text, "response_total", append(srv, `direction="inbound"`, `route_name="books-list"`,
		`authz_name="books-callers"`, `status_code="200"`, `classification="success"`)...)
	assert.True(t, ok, "allowed requests in response_total with their Server, route and authorization")
}
