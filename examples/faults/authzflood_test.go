package faults

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/authz"
	inmesh "github.com/inmesh/inmesh/mesh"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// lines counts the lines written to it and keeps the first few.
type lines struct {
	mu    sync.Mutex
	n     int
	first bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n += bytes.Count(p, []byte("\n"))
	if l.first.Len() < 8<<10 {
		l.first.Write(p)
	}
	return len(p), nil
}

func (l *lines) count() (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n, l.first.String()
}

// counter sums the data points of the counter name read from r.
func counter(t *testing.T, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	var sum int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sum += p.Value
				}
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					sum += int64(p.Value)
				}
			}
		}
	}
	return sum
}

// A flood of requests an inbound policy refuses, from concurrent
// plaintext clients: one route admits only a meshed identity (403 for
// every request), another admits anyone under a port rate limit of 5 a
// second (429 past it). The stack's log stays a few lines however many
// are refused, and inbound_http_authz_deny_total and
// inbound_http_local_ratelimit_total count exactly the 403s and 429s the
// clients saw.
func TestInboundPolicyRefusalFlood(t *testing.T) {
	all := []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}}
	route := func(name, path string, a authz.Authz) authz.Route {
		return authz.Route{
			Meta:           authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPRoute", Name: name},
			Rules:          []authz.Rule{{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: path}}}}},
			Authorizations: []authz.Authz{a},
		}
	}
	srvPolicy := &authz.Server{
		Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "Server", Name: "books-http"},
		Routes: []authz.Route{
			route("private", "/private", authz.Authz{
				Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "AuthorizationPolicy", Name: "web-only"},
				Networks: all, Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{webID}}},
			}),
			route("public", "/public", authz.Authz{
				Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "AuthorizationPolicy", Name: "anyone"},
				Networks: all,
			}),
		},
		RateLimit: &authz.RateLimit{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPLocalRateLimitPolicy", Name: "books"}, Total: 5},
	}
	var log lines
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	var reached atomic.Int64
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached.Add(1) })
	srv := inmesh.NewServer(app, inmesh.WithMeterProvider(mp),
		inmesh.WithLogger(slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		inmesh.WithInboundPolicy(authz.WithDefault(srvPolicy), authz.WithoutLocalhost()))
	t.Cleanup(srv.Close)
	addr := serveInbound(t, srv)

	n := size(50000, 3000) // requests to each route
	const workers = 8
	hc := client(workers)
	defer hc.CloseIdleConnections()
	codes := map[string]map[int]int64{"/private": {}, "/public": {}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs atomic.Int64
	jobs := make(chan string)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for path := range jobs {
				code, err := get(context.Background(), hc, addr, "books.default.svc.cluster.local:7000", path)
				if err != nil {
					errs.Add(1)
					continue
				}
				mu.Lock()
				codes[path][code]++
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	for i := range 2 * n {
		if i%2 == 0 {
			jobs <- "/private"
		} else {
			jobs <- "/public"
		}
	}
	close(jobs)
	wg.Wait()
	t.Logf("%d requests in %v: /private %v, /public %v", 2*n, time.Since(start).Round(time.Millisecond), codes["/private"], codes["/public"])
	require.Zero(t, errs.Load(), "requests without an answer")

	assert.Equal(t, map[int]int64{403: int64(n)}, codes["/private"], "every request to the meshed-only route is denied")
	limited := codes["/public"][429]
	assert.Equal(t, int64(n), codes["/public"][200]+limited, "the open route answers 200 or 429: %v", codes["/public"])
	assert.Positive(t, limited, "the rate limit refused none")
	assert.Equal(t, codes["/public"][200], reached.Load(), "only the admitted requests reach the app")

	assert.Equal(t, int64(n), counter(t, reader, authz.MetricDeny), authz.MetricDeny)
	assert.Equal(t, limited, counter(t, reader, authz.MetricLocalRateLimit), authz.MetricLocalRateLimit)

	// One line per kind of refusal per interval (ten seconds), whatever
	// the number of requests.
	logged, first := log.count()
	t.Logf("%d log lines:\n%s", logged, first)
	assert.LessOrEqual(t, logged, 30, "log lines for %d refused requests:\n%s", int64(n)+limited, first)
	assert.NotContains(t, strings.ToLower(first), "panic")
}
