package mesh

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/dashboard"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/tap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
)

// observedGRPC is a grpc-go client whose calls go through a reverse proxy
// over a tapped, traced NewClient to a tapped, traced NewServer around a
// grpc.Server, all on loopback, and what observes them: the hub's watcher,
// a dashboard of the hub and the spans.
type observedGRPC struct {
	cc  *grpc.ClientConn
	w   *tap.Watcher
	d   *dashboard.Dashboard
	exp *tracetest.InMemoryExporter
}

func newObservedGRPC(t *testing.T) *observedGRPC {
	hub := tap.NewHub()
	o := &observedGRPC{exp: tracetest.NewInMemoryExporter()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(o.exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	w, err := hub.Watch(tap.Filter{}, 0)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	o.w = w
	o.d = dashboard.New(hub)
	t.Cleanup(o.d.Close)

	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, newGRPCApp())
	t.Cleanup(gs.Stop)
	noMetrics := WithMeterProvider(noop.NewMeterProvider())
	server := NewServer(gs, noMetrics, WithLogger(quiet), WithTap(hub), WithTracerProvider(tp))
	t.Cleanup(server.Close)
	inbound := serveH2C(t, server)
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{grpcSvc: {{Addr: netip.MustParseAddrPort(inbound), H2: true}}})
	require.NoError(t, err)
	client := NewClient(WithEndpoints(eps), noMetrics, WithLogger(quiet), WithTap(hub), WithTracerProvider(tp))
	t.Cleanup(client.Close)
	cc, err := grpc.NewClient("passthrough:///"+serveProxy(t, client), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority(grpcSvc))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	o.cc = cc
	return o
}

// tapEvents waits for a request's inbound and outbound tap events.
func tapEvents(t *testing.T, w *tap.Watcher) (in, out tap.Event) {
	t.Helper()
	timeout := time.NewTimer(testutil.Timeout)
	defer timeout.Stop()
	for in.Direction == "" || out.Direction == "" {
		select {
		case e := <-w.Events():
			if e.Direction == "inbound" {
				in = e
			} else {
				out = e
			}
		case <-timeout.C:
			t.Fatalf("tap events: inbound %+v outbound %+v", in, out)
		}
	}
	return in, out
}

// spans waits for the call's client and server spans.
func (o *observedGRPC) spans(t *testing.T) (client, server tracetest.SpanStub) {
	t.Helper()
	require.Eventually(t, func() bool {
		var found int
		for _, s := range o.exp.GetSpans() {
			switch s.SpanKind {
			case trace.SpanKindClient:
				client, found = s, found|1
			case trace.SpanKindServer:
				server, found = s, found|2
			}
		}
		return found == 3
	}, testutil.Timeout, 5*time.Millisecond)
	return client, server
}

// A gRPC call's status, which a grpc.Server served through net/http puts
// in the trailers, reaches what observes both stacks. Both tap events
// carry it (Linkerd's tap reports it with the response's end); the
// dashboard's outbound row counts a failed call as a failure, as its
// inbound row does; the client span is an error for any status but OK,
// and the server span for a server's failure (INTERNAL), not for a
// client's (NOT_FOUND), as the RPC semantic conventions have it.
func TestGRPCStatusObservedOnBothStacks(t *testing.T) {
	for _, tc := range []struct {
		name            string
		code            codes.Code
		serverSpanError bool
	}{
		{"ok", codes.OK, false},
		{"internal", codes.Internal, true},
		{"not found", codes.NotFound, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newObservedGRPC(t)
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
			defer cancel()
			req := &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("x")}}
			if tc.code != codes.OK {
				req.ResponseStatus = &testgrpc.EchoStatus{Code: int32(tc.code), Message: "boom"}
			}
			_, err := testgrpc.NewTestServiceClient(o.cc).UnaryCall(ctx, req)
			require.Equal(t, tc.code, status.Code(err), "the call's status: %v", err)

			in, out := tapEvents(t, o.w)
			assert.Equal(t, int(tc.code), in.GRPCStatus, "the inbound event's grpcStatus")
			assert.Equal(t, int(tc.code), out.GRPCStatus, "the outbound event's grpcStatus")
			rows := o.d.State().Routes
			require.Len(t, rows, 2, "a row per direction")
			var wantFailures uint64
			if tc.code != codes.OK {
				wantFailures = 1
			}
			for _, row := range rows {
				assert.Equal(t, uint64(1), row.Requests, "%s row", row.Direction)
				assert.Equal(t, wantFailures, row.Failures, "%s row", row.Direction)
			}

			client, server := o.spans(t)
			wantClient, wantServer := otelcodes.Unset, otelcodes.Unset
			if tc.code != codes.OK {
				wantClient = otelcodes.Error
			}
			if tc.serverSpanError {
				wantServer = otelcodes.Error
			}
			assert.Equal(t, wantClient, client.Status.Code, "the client span")
			assert.Equal(t, wantServer, server.Status.Code, "the server span: %q", server.Status.Description)
		})
	}
}

// Over meshed mTLS, the outbound tap event names the identity the server
// proved (tap.Event.ServerID), as the inbound one names the client's.
func TestTapNamesBothIdentities(t *testing.T) {
	p := newPKI(t)
	hub := tap.NewHub()
	w, err := hub.Watch(tap.Filter{}, 0)
	require.NoError(t, err)
	defer w.Close()
	server := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		WithIdentity(p.certify(t, booksID)), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet), WithTap(hub))
	defer server.Close()
	addr := serveMeshed(t, server)
	const books = "books.default.svc.cluster.local:7000"
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {{Addr: addr, H2: true, Identity: booksID}}})
	require.NoError(t, err)
	client := NewClient(WithEndpoints(eps), WithIdentity(p.certify(t, webID)), WithMeterProvider(noop.NewMeterProvider()),
		WithLogger(quiet), WithBalancerOptions(balancer.WithFallback(false)), WithTap(hub))
	defer client.Close()
	resp, err := (&http.Client{Transport: client, Timeout: testutil.Timeout}).Get("http://" + books + "/")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	in, out := tapEvents(t, w)
	assert.Equal(t, webID, in.ClientID, "the inbound event: the client's identity")
	assert.Equal(t, booksID, out.ServerID, "the outbound event: the server's identity")
}
