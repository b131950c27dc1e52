package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// accrualService is a Service whose endpoints trip after three failures in
// a row and stay out for a minute.
func accrualService(name string) string {
	return `apiVersion: v1
kind: Service
metadata:
  name: ` + name + `
  namespace: default
  annotations:
    balancer.linkerd.io/failure-accrual: consecutive
    balancer.linkerd.io/failure-accrual-consecutive-max-failures: "3"
    balancer.linkerd.io/failure-accrual-consecutive-min-penalty: 1m
    balancer.linkerd.io/failure-accrual-consecutive-max-penalty: 1m
spec:
  ports: [{port: 80}]
`
}

// Endpoint health through the proxy binary, configured by a Service's
// failure-accrual annotations on the embedded control plane: of web's two
// endpoints, the failing one trips and gets no more requests, and the
// balancer families on /metrics say so (1 ready, 1 pending); down's only
// endpoint trips too, and the next request waits the failfast timeout and
// gets 504 FAIL_FAST; the queue is then in failfast, and the request after
// it gets 503 LOAD_SHED at once, counted by the queue's gate and the
// route's error label.
func TestEndpointHealthEndToEnd(t *testing.T) {
	needCurl(t)
	bin := build(t)
	dir := t.TempDir()
	profiles, policies := filepath.Join(dir, "profiles"), filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.Mkdir(policies, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(policies, "services.yaml"),
		[]byte(accrualService("web")+"---\n"+accrualService("down")), 0o644))

	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "good") }))
	defer good.Close()
	var badWeb, badDown atomic.Int64
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Host, "web.") {
			badWeb.Add(1)
		} else {
			badDown.Add(1)
		}
		http.Error(w, "failing", http.StatusInternalServerError)
	}))
	defer bad.Close()
	goodAddr, badAddr := strings.TrimPrefix(good.URL, "http://"), strings.TrimPrefix(bad.URL, "http://")
	const web, down = "web.default.svc.cluster.local:80", "down.default.svc.cluster.local:80"
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf(
		"- authority: %s\n  endpoints: [{addr: %s}, {addr: %s}]\n- authority: %s\n  endpoints: [{addr: %s}]\n",
		web, goodAddr, badAddr, down, badAddr)), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0",
		"-profiles", profiles, "-endpoints", endpoints, "-policies", policies, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)
	_, out, _, metricsAddr := startProxy(t, bin, dstAddr, goodAddr)

	get := func(authority string) (int, string) {
		status, headers, _ := curl(t, "-H", "Host: "+authority, "http://"+out+"/")
		return status, headers
	}
	// The policy (and with it the breaker) is in force once the route
	// series name the Service's default route.
	for _, a := range []string{"web", "down"} {
		require.Eventually(t, func() bool {
			get(a + ".default.svc.cluster.local:80")
			_, ok := metric(scrape(t, metricsAddr), "outbound_http_route_request_statuses_total", `parent_name="`+a+`"`, `route_name="http"`)
			return ok
		}, timeout, 50*time.Millisecond, "the policy of %s never arrived", a)
	}
	// Three failures in a row on the policy's path trip the endpoint; with
	// two endpoints, picks spread, so this takes a few more requests.
	for range 100 {
		get(web)
	}
	tripped := badWeb.Load()
	for range 50 {
		status, _ := get(web)
		assert.Equal(t, 200, status)
	}
	assert.Equal(t, tripped, badWeb.Load(), "requests reached the tripped endpoint")
	text := scrape(t, metricsAddr)
	webLabels := []string{`parent_name="web"`, `parent_namespace="default"`, `parent_port="80"`}
	ready, _ := metric(text, "outbound_http_balancer_endpoints", append(webLabels, `endpoint_state="ready"`)...)
	pending, _ := metric(text, "outbound_http_balancer_endpoints", append(webLabels, `endpoint_state="pending"`)...)
	p2c, _ := metric(text, "outbound_http_balancer_p2c_endpoints", webLabels...)
	assert.Equal(t, []float64{1, 1, 2}, []float64{ready, pending, p2c}, "ready, pending, p2c endpoints of web")
	resp, err := http.Get("http://" + metricsAddr + "/endpoints?authority=" + web)
	require.NoError(t, err)
	states, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(states), `"state": "tripped"`)

	// down: its only endpoint trips after three failures, then a request
	// fails fast, and the queue is in failfast: the next is shed at once.
	status, headers := 500, ""
	var waited time.Duration
	for i := 0; i < 4 && status == 500; i++ {
		start := time.Now()
		status, headers = get(down)
		waited = time.Since(start)
	}
	before := badDown.Load()
	assert.Equal(t, 504, status)
	assert.Contains(t, headers, "l5d-proxy-error: fail-fast")
	assert.GreaterOrEqual(t, waited, 3*time.Second, "the failfast timeout")
	start := time.Now()
	status, headers = get(down)
	assert.Less(t, time.Since(start), 3*time.Second, "shed without waiting")
	assert.Equal(t, 503, status)
	assert.Contains(t, headers, "l5d-proxy-error: load shed")
	assert.Equal(t, before, badDown.Load(), "a request reached the tripped endpoint")
	text = scrape(t, metricsAddr)
	downLabels := []string{`parent_name="down"`}
	for _, c := range []struct {
		name  string
		extra string
		want  float64
	}{
		{"outbound_http_balancer_endpoints", `endpoint_state="ready"`, 0},
		{"outbound_http_balancer_endpoints", `endpoint_state="pending"`, 1},
		{"outbound_http_balancer_queue_gate_shut_total", "", 1}, // the gate shut once and stayed shut
		{"outbound_http_balancer_queue_gate_timeout_total", "", 1},
		{"outbound_http_balancer_queue_length", "", 0},
		{"outbound_http_balancer_queue_gate_timeout_seconds", "", 3},
		{"outbound_http_route_request_statuses_total", `error="FAIL_FAST"`, 1},
		{"outbound_http_route_request_statuses_total", `error="LOAD_SHED"`, 1},
	} {
		v, ok := metric(text, c.name, append(downLabels, c.extra)...)
		assert.True(t, ok, "%s %s", c.name, c.extra)
		assert.Equal(t, c.want, v, "%s %s", c.name, c.extra)
	}
}
