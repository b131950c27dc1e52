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
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A flood of distinct Hosts, more than the router labels, through the
// outbound stack: every family stays within the limit, and no series is
// folded into otel_metric_overflow while the library still labels it (the
// router's 10,000 dst values and its "other").
func TestHostFloodSeriesBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("12,000 requests")
	}
	m, err := New(0)
	require.NoError(t, err)
	defer m.Provider.Shutdown(context.Background())
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer app.Close()
	client := mesh.NewClient(mesh.WithMeterProvider(m.Provider), mesh.WithLogger(slog.New(slog.DiscardHandler)))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: 10 * time.Second}

	const hosts = profiles.DefaultMaxAuthorities + 2000
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
				req.Host = fmt.Sprintf("10.%d.%d.%d:80", i>>16&255, i>>8&255, i&255)
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
	limit := CardinalityLimit(0)
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
	assert.Equal(t, profiles.DefaultMaxAuthorities+1, seen["route_request_total"], "one series per routed authority, and dst=other")
	assert.LessOrEqual(t, seen["request_total"], 1001+1, "classify's authority bound")
	t.Logf("series per family: %v", seen)
}
