package mesh

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// countingExporter counts the spans it is given and drops them: the cost
// measured is the spans' making and batching, not an exporter's.
type countingExporter struct{ n atomic.Int64 }

func (e *countingExporter) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	e.n.Add(int64(len(s)))
	return nil
}
func (e *countingExporter) Shutdown(context.Context) error { return nil }

// benchProfile routes GET /books/{id} of authority (ip:port), a route that
// never retries, as examples/bench's tracing scenario does.
func benchProfile(b *testing.B, authority string) profiles.Source {
	sps, err := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: 127.0.0.1}
spec:
  routes:
  - name: GET /books/{id}
    condition: {method: GET, pathRegex: '/books/[^/]+'}
`))
	require.NoError(b, err)
	ap := netip.MustParseAddrPort(authority)
	return profiles.NewStaticSource(map[string]*profiles.Profile{authority: sps[0].ProfileFor(uint32(ap.Port()))})
}

// benchRoundTrips measures serial HTTP/1 round trips on loopback through
// the outbound and inbound stacks made with opts.
func benchRoundTrips(b *testing.B, opts ...Option) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	late := &lateHandler{}
	addr := serveH2C(b, late)
	opts = append([]Option{WithProfiles(benchProfile(b, addr))}, opts...)
	server := NewServer(app, append(ServerOptions(opts...), WithLocalAuthorities(addr))...)
	b.Cleanup(server.Close)
	late.h.Store(server)
	client := NewClient(ClientOptions(opts...)...)
	b.Cleanup(client.Close)
	url := "http://" + addr + "/books/1"
	get := func() {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		resp, err := client.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	for range 20 {
		get() // the route table and the connection
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		get()
	}
}

type lateHandler struct{ h atomic.Pointer[Server] }

func (l *lateHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { l.h.Load().ServeHTTP(w, r) }

// BenchmarkTraceRoundTrip compares a round trip through both stacks
// without a tracer and with the SDK's, sampling every trace and batching
// its spans to an exporter that drops them (examples/bench's tracing
// scenario, without otelhttp). spans/op is the spans one round trip makes.
func BenchmarkTraceRoundTrip(b *testing.B) {
	b.Run("untraced", func(b *testing.B) { benchRoundTrips(b) })
	b.Run("traced", func(b *testing.B) {
		exp := &countingExporter{}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(exp))
		benchRoundTrips(b, WithTracerProvider(tp))
		n := b.N
		require.NoError(b, tp.Shutdown(context.Background()))
		b.ReportMetric(float64(exp.n.Load())/float64(n+20), "spans/op")
	})
}
