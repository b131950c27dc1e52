package profileroute

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var seriesName = regexp.MustCompile(`^([a-z_]+)(\{(.*)\})? `)
var labelName = regexp.MustCompile(`([a-z_]+)="`)

// series returns, for each series name in an exposition, the sorted set of
// label names it has.
func series(t *testing.T, text string) map[string][]string {
	out := map[string][]string{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := seriesName.FindStringSubmatch(line)
		require.NotNil(t, m, "line %q", line)
		set := map[string]bool{}
		for _, n := range out[m[1]] {
			set[n] = true
		}
		for _, l := range labelName.FindAllStringSubmatch(m[3], -1) {
			set[l[1]] = true
		}
		var names []string
		for n := range set {
			names = append(names, n)
		}
		sort.Strings(names)
		out[m[1]] = names
	}
	return out
}

// With the SDK and the Prometheus exporter configured as the README says,
// the exposition holds Linkerd's series names and label names, and nothing
// else.
func TestExposition(t *testing.T) {
	m := testutil.NewMetrics(t)
	up := newUpstream()
	src := profiles.NewStaticSource(map[string]*profiles.Profile{testAuthority: profileWith(budget10s, retryRoute("/0.5"))})
	router := NewRouter(src, WithMeterProvider(m.Provider), WithLogger(quietLogger), WithLocalAuthorities(testAuthority))
	defer router.Close()
	// Outbound: router then classify; inbound: router then classify.
	inbound := router.Handler(classify.NewHandler(up, classify.WithMeterProvider(m.Provider)))
	srv := testutil.NewServer(t, inbound)
	client := &http.Client{Transport: router.Transport(classify.NewTransport(testutil.NewTransport(t, testutil.H1), classify.WithMeterProvider(m.Provider)))}
	get := func(path string) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Host = testAuthority
		resp, err := client.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	require.Eventually(t, func() bool {
		get("/load-profile")
		return len(m.Lines(t, "route_request_total", `rt_load_profile="test"`, `direction="outbound"`)) > 0 &&
			len(m.Lines(t, "route_request_total", `rt_load_profile="test"`, `direction="inbound"`)) > 0
	}, testutil.Timeout, 5*time.Millisecond)
	get("/0.5") // retried: 533 then 200
	up.mu.Lock()
	up.calls["/0.5"] = 0
	up.mu.Unlock()
	src.Set(testAuthority, profileWith(&profiles.RetryBudget{RetryRatio: 0, MinRetriesPerSecond: 0, TTL: time.Second}, retryRoute("/0.5")))
	require.Eventually(t, func() bool { return router.Table(testAuthority).RetryBudget().MinRetriesPerSecond == 0 }, testutil.Timeout, 5*time.Millisecond)
	get("/0.5") // retryable, no budget

	text := m.Scrape(t)
	got := series(t, text)
	target := []string{"direction", "dst"}
	resp := []string{"classification", "error", "grpc_status", "status_code"}
	withRT := func(base []string, extra ...string) []string {
		out := append(append([]string{}, base...), extra...)
		sort.Strings(out)
		return out
	}
	want := map[string][]string{
		"request_total":                    {"authority", "direction"},
		"response_total":                   withRT([]string{"authority", "direction"}, resp...),
		"response_latency_ms_bucket":       {"authority", "direction", "le", "status_code"},
		"response_latency_ms_count":        {"authority", "direction", "status_code"},
		"response_latency_ms_sum":          {"authority", "direction", "status_code"},
		"route_request_total":              withRT(target, "rt_load_profile", "rt_route"),
		"route_response_total":             withRT(target, append(resp, "rt_load_profile", "rt_route")...),
		"route_response_latency_ms_bucket": withRT(target, "le", "rt_load_profile", "rt_route", "status_code"),
		"route_response_latency_ms_count":  withRT(target, "rt_load_profile", "rt_route", "status_code"),
		"route_response_latency_ms_sum":    withRT(target, "rt_load_profile", "rt_route", "status_code"),
		"route_actual_request_total":       withRT(target, "rt_load_profile", "rt_route"),
		"route_actual_response_total":      withRT(target, append(resp, "rt_load_profile", "rt_route")...),
		"route_retryable_total":            withRT(target, "rt_route", "skipped"),
	}
	assert.Equal(t, want, got, "exposition:\n%s", text)
	assert.Contains(t, text, "# TYPE route_response_latency_ms histogram")
	assert.Contains(t, text, "# HELP request_total Total count of HTTP requests.")
	for _, le := range []string{"1", "2", "3", "4", "5", "10", "20", "30", "40", "50", "100", "200", "300", "400", "500",
		"1000", "2000", "3000", "4000", "5000", "10000", "20000", "30000", "40000", "50000", "+Inf"} {
		assert.Contains(t, text, `le="`+le+`"`)
	}
	assert.Contains(t, text, `route_retryable_total{direction="outbound",dst="profiles.test.svc.cluster.local:80",rt_route="/0.5",skipped="no_budget"} 1`)
	assert.Contains(t, text, `request_total{authority="profiles.test.svc.cluster.local:80",direction="inbound"}`)
	assert.NotContains(t, text, "otel_scope")
	assert.NotContains(t, text, "_milliseconds")
	assert.NotContains(t, text, "target_info")
}

// Random paths and hosts create no more series than routes × statuses ×
// classes: hosts past the bound share dst="other".
func TestCardinality(t *testing.T) {
	m := testutil.NewMetrics(t)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader([]int{200, 404, 500}[len(r.URL.Path)%3])
	})
	src := profiles.NewStaticSource(nil)
	router := NewRouter(src, WithMeterProvider(m.Provider), WithLogger(quietLogger), WithMaxAuthorities(10))
	defer router.Close()
	srv := testutil.NewServer(t, up)
	client := &http.Client{Transport: router.Transport(classify.NewTransport(testutil.NewTransport(t, testutil.H1),
		classify.WithMeterProvider(m.Provider), classify.WithMaxAuthorities(10)))}
	for i := range 10000 {
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/%x", srv.URL, rand.Uint64()>>uint(rand.IntN(60))), nil)
		req.Host = fmt.Sprintf("h%d.example.com:%d", rand.IntN(1000), 80+i%7)
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	lines := m.Lines(t, "route_response_total")
	// 11 dst values (10 watched + other) × 3 statuses, default route only.
	assert.LessOrEqual(t, len(lines), 11*3)
	assert.NotEmpty(t, m.Lines(t, "route_response_total", `dst="other"`))
	assert.LessOrEqual(t, len(m.Lines(t, "response_total")), 11*3)
	for _, l := range lines {
		assert.NotContains(t, l, "rt_", "no route labels from paths")
	}
}
