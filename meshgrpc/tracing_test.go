package meshgrpc_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

func spanAttr(s tracetest.SpanStub, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// traceOf waits for n spans of the trace id in exp and returns the
// children of a span among them, by start time.
func traceOf(t *testing.T, exp *tracetest.InMemoryExporter, id trace.TraceID, n int) func(parent trace.SpanID) tracetest.SpanStubs {
	t.Helper()
	var spans tracetest.SpanStubs
	require.Eventually(t, func() bool {
		spans = spans[:0]
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID() == id {
				spans = append(spans, s)
			}
		}
		return len(spans) >= n
	}, testutil.Timeout, 5*time.Millisecond, "%d spans of the trace", n)
	return func(parent trace.SpanID) (out tracetest.SpanStubs) {
		for _, s := range spans {
			if s.Parent.SpanID() == parent {
				out = append(out, s)
			}
		}
		slices.SortFunc(out, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
		return out
	}
}

// A retried call, the first of its channel, through a traced client to a
// traced server: the call's span under the caller's, a child per attempt
// (grpc-go's stats handler sees each; first, then retry) with the route,
// and under each attempt the server's span, continued from the attempt's
// metadata.
func TestTraceRetriedCall(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	a := &app{handle: func(_ context.Context, n int64) error {
		if n == 1 {
			return status.Error(codes.Unavailable, "not yet")
		}
		return nil
	}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithTracerProvider(tp))...)
	testgrpc.RegisterTestServiceServer(g, a)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)

	store := controlplane.NewStore()
	manifests(t, store, booksService+retryRoute)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: netip.MustParseAddrPort(lis.Addr().String())}}})
	c := dial(t, serveStore(t, store), meshgrpc.WithTracerProvider(tp), meshgrpc.WithDiscoveryWait(testutil.Timeout))

	ctx, root := tp.Tracer("test").Start(callCtx(t), "app")
	_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
	root.End()
	require.NoError(t, err)
	require.Equal(t, int64(2), a.calls.Load())

	children := traceOf(t, exp, root.SpanContext().TraceID(), 6)
	calls := children(root.SpanContext().SpanID())
	require.Len(t, calls, 1)
	call := calls[0]
	assert.Equal(t, trace.SpanKindClient, call.SpanKind)
	assert.Equal(t, "grpc.testing.TestService/EmptyCall", spanAttr(call, "rpc.method").AsString())
	assert.Equal(t, "grpc", spanAttr(call, "rpc.system.name").AsString())
	assert.Equal(t, "empty", spanAttr(call, "inmesh.route").AsString())
	assert.Equal(t, "OK", spanAttr(call, "rpc.response.status_code").AsString())
	attempts := children(call.SpanContext.SpanID())
	require.Len(t, attempts, 2)
	for i, want := range []struct{ kind, code string }{{"first", "UNAVAILABLE"}, {"retry", "OK"}} {
		at := attempts[i]
		assert.Equal(t, want.kind, spanAttr(at, "inmesh.attempt.kind").AsString())
		assert.Equal(t, want.code, spanAttr(at, "rpc.response.status_code").AsString())
		assert.Equal(t, "127.0.0.1", spanAttr(at, "network.peer.address").AsString())
		srv := children(at.SpanContext.SpanID())
		require.Len(t, srv, 1, "the server span of attempt %d", i)
		assert.Equal(t, trace.SpanKindServer, srv[0].SpanKind)
		assert.Equal(t, want.code, spanAttr(srv[0], "rpc.response.status_code").AsString())
	}
}

// streamingInputApp answers a client-streaming call once its client
// half-closes.
type streamingInputApp struct{ app }

func (*streamingInputApp) StreamingInputCall(s grpc.ClientStreamingServer[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse]) error {
	for {
		if _, err := s.Recv(); err != nil {
			return s.SendAndClose(&testgrpc.StreamingInputCallResponse{})
		}
	}
}

// Every client span a traced stream starts ends, however the caller ends
// the stream in the ways grpc-go's ClientStream documents: by the one
// message of a call whose server does not stream (CloseAndRecv reads it
// and reads no further), or by cancelling the call's context.
func TestTracedStreamSpansEnd(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, s grpc.ClientStreamingClient[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse], cancel func())
		code string
	}{
		{"CloseAndRecv", func(t *testing.T, s grpc.ClientStreamingClient[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse], _ func()) {
			_, err := s.CloseAndRecv()
			require.NoError(t, err)
		}, "OK"},
		{"cancelled", func(_ *testing.T, _ grpc.ClientStreamingClient[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse], cancel func()) {
			cancel()
		}, "CANCELLED"},
		// The stream's send limit is 16 bytes: grpc-go ends the stream, and
		// its caller need do nothing more.
		{"SendMsg error", func(t *testing.T, s grpc.ClientStreamingClient[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse], _ func()) {
			err := s.Send(&testgrpc.StreamingInputCallRequest{Payload: &testgrpc.Payload{Body: make([]byte, 64)}})
			require.Error(t, err)
			require.NotErrorIs(t, err, io.EOF)
		}, "RESOURCE_EXHAUSTED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			defer tp.Shutdown(context.Background())
			addr := serveTestService(t, &streamingInputApp{})
			store := controlplane.NewStore()
			manifests(t, store, booksService)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: addr}}})
			c := dial(t, serveStore(t, store), meshgrpc.WithTracerProvider(tp), meshgrpc.WithDiscoveryWait(testutil.Timeout))

			ctx, cancel := context.WithCancel(callCtx(t))
			defer cancel()
			s, err := c.StreamingInputCall(ctx, grpc.MaxCallSendMsgSize(16))
			require.NoError(t, err)
			require.NoError(t, s.Send(&testgrpc.StreamingInputCallRequest{}))
			tc.end(t, s, cancel)

			open := func() []string {
				ended := map[trace.SpanID]bool{}
				for _, sp := range rec.Ended() {
					ended[sp.SpanContext().SpanID()] = true
				}
				var names []string
				for _, sp := range rec.Started() {
					if sp.SpanKind() == trace.SpanKindClient && !ended[sp.SpanContext().SpanID()] {
						names = append(names, sp.Name())
					}
				}
				return names
			}
			if !assert.Eventually(t, func() bool { return len(rec.Started()) > 0 && len(open()) == 0 }, testutil.Timeout, time.Millisecond) {
				t.Fatalf("client spans never ended: %v", open())
			}
			var call sdktrace.ReadOnlySpan
			for _, sp := range rec.Ended() {
				if sp.SpanKind() == trace.SpanKindClient && sp.Parent().SpanID() == (trace.SpanID{}) {
					call = sp
				}
			}
			require.NotNil(t, call, "the call's span")
			for _, kv := range call.Attributes() {
				if kv.Key == "rpc.response.status_code" {
					assert.Equal(t, tc.code, kv.Value.AsString())
				}
			}
		})
	}
}

// A mirrored call through a traced client: the call's span has its first
// attempt and the mirror's copy as children, the copy marked
// inmesh.attempt.kind mirror (and no resend: the call's own attempts are
// counted without it), each the parent of the server span it made.
func TestTraceMirroredCall(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	serve := func(a *app) netip.AddrPort {
		return serveTestService(t, a, meshgrpc.ServerOptions(meshgrpc.WithTracerProvider(tp))...)
	}
	primary, mirror := &app{}, &app{}
	store := controlplane.NewStore()
	manifests(t, store, booksService+mirrorRoute(""))
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: serve(primary)}}, shadow: {{Addr: serve(mirror)}}})
	c := dial(t, serveStore(t, store), meshgrpc.WithTracerProvider(tp), meshgrpc.WithDiscoveryWait(testutil.Timeout))

	ctx, root := tp.Tracer("test").Start(callCtx(t), "app")
	_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
	root.End()
	require.NoError(t, err)

	// The application's span, the call's, the two attempts' and the two
	// server spans.
	children := traceOf(t, exp, root.SpanContext().TraceID(), 6)
	calls := children(root.SpanContext().SpanID())
	require.Len(t, calls, 1)
	assert.Equal(t, "mirrored", spanAttr(calls[0], "inmesh.route").AsString())
	attempts := children(calls[0].SpanContext.SpanID())
	require.Len(t, attempts, 2, "the first attempt and the copy")
	var kinds []string
	for _, at := range attempts {
		kinds = append(kinds, spanAttr(at, "inmesh.attempt.kind").AsString())
		assert.Equal(t, attribute.EMPTY, spanAttr(at, "http.request.resend_count").Type(),
			"%s: not a resend", spanAttr(at, "inmesh.attempt.kind").AsString())
		assert.Equal(t, "OK", spanAttr(at, "rpc.response.status_code").AsString())
		srv := children(at.SpanContext.SpanID())
		require.Len(t, srv, 1, "the server span of the %s attempt", spanAttr(at, "inmesh.attempt.kind").AsString())
		assert.Equal(t, trace.SpanKindServer, srv[0].SpanKind)
	}
	assert.ElementsMatch(t, []string{"first", "mirror"}, kinds)
	assert.EqualValues(t, 1, primary.calls.Load())
	assert.EqualValues(t, 1, mirror.calls.Load())
}

// A traced server's span is an error only for the codes the RPC semantic
// conventions count as the server's failures (UNKNOWN, DEADLINE_EXCEEDED,
// UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS), as the HTTP stack's
// server span: a call the client got wrong (NOT_FOUND, INVALID_ARGUMENT,
// PERMISSION_DENIED) leaves it Unset, with its code in
// rpc.response.status_code.
func TestServerSpanStatusByCode(t *testing.T) {
	want := []struct {
		code  codes.Code
		error bool
	}{
		{codes.OK, false}, {codes.NotFound, false}, {codes.InvalidArgument, false}, {codes.PermissionDenied, false},
		{codes.Unknown, true}, {codes.Internal, true}, {codes.Unavailable, true}, {codes.DataLoss, true},
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	a := &app{handle: func(_ context.Context, n int64) error {
		if c := want[n-1].code; c != codes.OK {
			return status.Error(c, "answered "+c.String())
		}
		return nil
	}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithTracerProvider(tp), meshgrpc.WithLogger(quiet))...)
	testgrpc.RegisterTestServiceServer(srv, a)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	cc, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	c := testgrpc.NewTestServiceClient(cc)
	for i, w := range want {
		_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
		require.Equal(t, w.code, status.Code(err))
		var span tracetest.SpanStub
		require.Eventually(t, func() bool {
			spans := exp.GetSpans()
			if len(spans) <= i {
				return false
			}
			span = spans[i]
			return true
		}, testutil.Timeout, time.Millisecond, "the server span of %s", w.code)
		assert.Equal(t, trace.SpanKindServer, span.SpanKind)
		assert.Equal(t, meshtrace.GRPCCodeName(uint32(w.code)), spanAttr(span, "rpc.response.status_code").AsString(), "%s", w.code)
		if w.error {
			assert.Equal(t, otelcodes.Error, span.Status.Code, "%s", w.code)
		} else {
			assert.Equal(t, otelcodes.Unset, span.Status.Code, "%s", w.code)
		}
	}
}
