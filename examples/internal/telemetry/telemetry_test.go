package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/mesh"
	"github.com/inmesh/inmesh/router"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A flood of distinct Hosts, more than the router labels, through the
// outbound stack: every family stays within the limit, and no series is
// folded into otel_metric_overflow while the library still labels it (the
// router's 10,000 dst values and its "other"). Under -race or -short, the
// router's bound is 2,100 (still past the SDK's default limit of 2,000).
func TestHostFloodSeriesBounded(t *testing.T) {
	bound := router.DefaultMaxAuthorities
	if testing.Short() || raceEnabled {
		bound = 2100
	}
	m, err := New(bound)
	require.NoError(t, err)
	defer m.Provider.Shutdown(context.Background())
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer app.Close()
	client := mesh.NewClient(mesh.WithMeterProvider(m.Provider), mesh.WithMaxAuthorities(bound),
		mesh.WithLogger(slog.New(slog.DiscardHandler)))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: 10 * time.Second}

	hosts := bound + 500
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				// Sent to the one loopback server, addressed to a distinct
				// IP-literal authority: no DNS, one connection.
				req, _ := http.NewRequest("GET", app.URL+"/", nil)
				req.Host = fmt.Sprintf("127.%d.%d.%d:80", 1+i>>16&255, i>>8&255, i&255)
				resp, err := hc.Do(req)
				if !assert.NoError(t, err) {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for i := range hosts {
		work <- i
	}
	close(work)
	wg.Wait()

	families, err := m.Registry.Gather()
	require.NoError(t, err)
	limit := CardinalityLimit(bound)
	seen := map[string]int{}
	for _, f := range families {
		seen[f.GetName()] = len(f.GetMetric())
		assert.LessOrEqual(t, len(f.GetMetric()), limit+1, "%s: series past the limit and its overflow series", f.GetName())
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				assert.NotEqual(t, "otel_metric_overflow", l.GetName(), "%s overflowed before the library's bound", f.GetName())
			}
		}
	}
	assert.Equal(t, bound+1, seen["route_request_total"], "one series per routed authority, and dst=other")
	assert.LessOrEqual(t, seen["request_total"], bound+1, "classify's authority labels share the mesh's bound")
	t.Logf("series per family: %v", seen)
}
