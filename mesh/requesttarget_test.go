package mesh

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Linkerd's proxy writes target_addr, target_ip and target_port on every
// request_total, response_total and response_latency_ms series
// (InboundEndpointLabels, OutboundEndpointLabels in
// linkerd/app/core/src/metrics.rs): inbound the address the connection
// was accepted on, policy or not; outbound the endpoint's.
func TestRequestMetricsCarryTheTarget(t *testing.T) {
	const books = "books.default.svc.cluster.local:7000"
	m := testutil.NewMetrics(t)
	server := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		WithMeterProvider(m.Provider), WithLogger(quiet))
	defer server.Close()
	addr := serveMeshed(t, server)
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {{Addr: addr, H2: true}}})
	require.NoError(t, err)
	client := NewClient(WithEndpoints(eps), WithMeterProvider(m.Provider), WithLogger(quiet))
	defer client.Close()
	get(t, client, "http://"+books+"/")

	// The server may count its response after the client has it.
	require.Eventually(t, func() bool {
		_, n := m.Select(t, "response_latency_ms_count", `direction="inbound"`)
		return n == 1
	}, testutil.Timeout, 5*time.Millisecond)
	target := []string{`target_addr="` + addr.String() + `"`, `target_ip="127.0.0.1"`, `target_port="` + fmt.Sprint(addr.Port()) + `"`}
	for _, dir := range []string{"inbound", "outbound"} {
		for _, fam := range []string{"request_total", "response_total", "response_latency_ms_count"} {
			lines, _ := m.Select(t, fam, append([]string{`direction="` + dir + `"`}, target...)...)
			assert.Len(t, lines, 1, "%s %s:\n%s", dir, fam, strings.Join(m.Lines(t, fam), "\n"))
		}
	}
}

// The inbound target labels cost a request nothing: each label set has a
// handler of its own, made once.
func TestInboundTargetLabelsAllocateNothing(t *testing.T) {
	h := newEndpointLabels(classify.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) })),
		classify.NewTLSLabels(false))
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4143}))
	h.ServeHTTP(w, r)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) }))
}
