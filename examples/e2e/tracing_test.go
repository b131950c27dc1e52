package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// otlpReceiver is an OTLP/gRPC trace collector on loopback that keeps the
// spans it is sent, with the service.name of their resource.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	service string
	span    *tracepb.Span
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, receivedSpan{service, s})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) received() []receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedSpan(nil), r.spans...)
}

func startReceiver(t *testing.T) (*otlpReceiver, string) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	r := &otlpReceiver{}
	collectortrace.RegisterTraceServiceServer(srv, r)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return r, lis.Addr().String()
}

// A request from an application instrumented with otelhttp, through two
// examples/proxy hops (outbound on proxy A, inbound on proxy B) to an
// application instrumented with otelhttp, makes one connected trace: the
// proxies export their spans over OTLP/gRPC to a collector on loopback,
// the applications theirs in process, and every span has the one trace
// ID and the parent the path says: client -> A's client span (its route
// never retries: one attempt, no span of its own) -> B's server span ->
// the application's server span. It is the first request through the
// proxies.
func TestTraceThroughTwoProxies(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "books.yaml"), []byte(profile("")), 0o644))
	receiver, otlpAddr := startReceiver(t)

	// The applications propagate W3C trace context only (otelhttp's
	// default is the global propagator, which propagates nothing).
	w3c := propagation.TraceContext{}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	app := httptest.NewServer(otelhttp.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"id":"%s"}`, strings.TrimPrefix(r.URL.Path, "/books/"))
	}), "books-app", otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(w3c)))
	defer app.Close()
	appAddr := strings.TrimPrefix(app.URL, "http://")

	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0", "-profiles", profiles, "-endpoints", endpoints, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)
	proxy := func(name string) (out, in string) {
		p := start(t, filepath.Join(bin, "proxy"), []string{"INMESH_CONTROL_BACKOFF_DELAY=100ms"},
			"-destination", dstAddr, "-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-app", appAddr, "-metrics", "127.0.0.1:0",
			"-otlp-endpoint", otlpAddr, "-otlp-batch-timeout", "50ms", "-trace-service-name", name)
		return p.waitLog(t, listenRe("outbound")), p.waitLog(t, listenRe("inbound"))
	}
	_, bIn := proxy("proxy-b")
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n", books, bIn)), 0o644))
	dst.waitLog(t, loadedEndpointsRe)
	aOut, _ := proxy("proxy-a")

	client := &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(w3c)), Timeout: timeout}
	req, err := http.NewRequest(http.MethodGet, "http://"+aOut+"/books/7", nil)
	require.NoError(t, err)
	req.Host = books
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Equal(t, `{"id":"7"}`, string(body))

	// The application's two spans (the client's and the server's).
	require.Eventually(t, func() bool { return len(exp.GetSpans()) >= 2 }, timeout, 10*time.Millisecond)
	var clientSpan, appSpan tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		switch s.SpanKind {
		case trace.SpanKindClient:
			clientSpan = s
		case trace.SpanKindServer:
			appSpan = s
		}
	}
	traceID := clientSpan.SpanContext.TraceID()
	require.True(t, traceID.IsValid())
	// The proxies' two: A's client span, B's server span.
	var spans []receivedSpan
	require.Eventually(t, func() bool { spans = receiver.received(); return len(spans) >= 2 }, timeout, 10*time.Millisecond,
		"spans over OTLP: %d", len(receiver.received()))
	byID := map[string]receivedSpan{}
	for _, s := range spans {
		assert.Equal(t, traceID.String(), hex.EncodeToString(s.span.TraceId), "%s %s: one trace", s.service, s.span.Name)
		byID[hex.EncodeToString(s.span.SpanId)] = s
	}
	// Walk from the application's server span up to the client's.
	var path []string
	id := appSpan.Parent.SpanID().String()
	for id != clientSpan.SpanContext.SpanID().String() {
		s, ok := byID[id]
		require.True(t, ok, "span %s (parent on the path %v) was not exported", id, path)
		path = append(path, s.service+":"+s.span.Kind.String())
		id = hex.EncodeToString(s.span.ParentSpanId)
	}
	assert.Equal(t, []string{"proxy-b:SPAN_KIND_SERVER", "proxy-a:SPAN_KIND_CLIENT"}, path,
		"from the application's server span up to the client's")
}
