package meshgrpc

import (
	"context"
	"io"
	"sync"
	"sync/atomic"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/meshtrace"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// WithTracerProvider traces calls through tp, as mesh.WithTracerProvider
// traces HTTP requests: on a client, a client span per call and a child
// span per attempt (grpc-go's stats handler sees each; inmesh.attempt.kind
// "first" or "retry"), each attempt carrying its span's context to the
// server in W3C and B3 metadata; on a server, a server span per call, the
// child of the context the call carries, with the client's verified
// identity. Attributes follow OpenTelemetry's RPC semantic conventions
// (rpc.system.name, rpc.method, rpc.response.status_code). Without it (or
// with nil, or OpenTelemetry's no-op provider) nothing is traced and no
// stats handler is added.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithPropagator sets how trace context travels in call metadata
// (default: B3 multi-header, W3C trace context and baggage).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.prop = p })
}

// clientTraceOptions are the dial options that trace a client's calls, none
// when tracing is off. They come before the mesh's interceptors, so that
// the call span covers the route's retries.
func clientTraceOptions(c *config) []grpc.DialOption {
	t := meshtrace.New(c.tp, c.prop, "")
	if t == nil {
		return nil
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(traceUnary(t)),
		grpc.WithChainStreamInterceptor(traceStream(t)),
		grpc.WithStatsHandler(clientTrace{}),
	}
}

// serverTraceOptions are the server options that trace calls, none when
// tracing is off.
func serverTraceOptions(c *config) []grpc.ServerOption {
	server := ""
	if c.identity != nil {
		server = c.identity.Name()
	}
	t := meshtrace.New(c.tp, c.prop, server)
	if t == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(serverTrace{t})}
}

// callTrace counts the attempts of one traced call.
type callTrace struct{ attempts atomic.Int32 }

type callTraceKey struct{}

// startCall starts the span of a call.
func startCall(ctx context.Context, t *meshtrace.Tracer, method string) (context.Context, trace.Span) {
	ctx, s := t.Start(ctx, method, trace.SpanKindClient, meshtrace.GRPCAttrs(method)...)
	return context.WithValue(ctx, callTraceKey{}, &callTrace{}), s
}

// endSpan ends the client span s with the status of err: every status but
// OK is an error of the client's call.
func endSpan(s trace.Span, err error) {
	st, _ := status.FromError(err)
	s.SetAttributes(semconv.RPCResponseStatusCode(meshtrace.GRPCCodeName(uint32(st.Code()))))
	if err != nil {
		s.SetStatus(otelcodes.Error, st.Message())
	}
	s.End()
}

// endServerSpan ends the server span s with the status of err: an error
// only for the codes the RPC semantic conventions count as the server's
// failures (UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL,
// UNAVAILABLE, DATA_LOSS), as the HTTP stack's server span.
func endServerSpan(s trace.Span, err error) {
	st, _ := status.FromError(err)
	s.SetAttributes(semconv.RPCResponseStatusCode(meshtrace.GRPCCodeName(uint32(st.Code()))))
	if meshtrace.GRPCServerError(uint32(st.Code())) {
		s.SetStatus(otelcodes.Error, st.Message())
	}
	s.End()
}

func traceUnary(t *meshtrace.Tracer) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, s := startCall(ctx, t, method)
		err := invoker(ctx, method, req, reply, cc, opts...)
		endSpan(s, err)
		return err
	}
}

func traceStream(t *meshtrace.Tracer) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, s := startCall(ctx, t, method)
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			endSpan(s, err)
			return nil, err
		}
		ts := &tracedStream{ClientStream: cs, s: s, serverStreams: desc.ServerStreams}
		// A caller may end a stream by cancelling its context alone.
		ts.stop = context.AfterFunc(ctx, func() { ts.end(status.FromContextError(ctx.Err()).Err()) })
		return ts, nil
	}
}

// tracedStream ends its call's span when the stream ends, in the ways
// grpc-go's ClientStream documents but one: RecvMsg's io.EOF or error, the
// one message of a call whose server does not stream (CloseAndRecv), an
// error (not io.EOF) of SendMsg, or the cancellation of the call's
// context. (grpc-go's Header reports no error: RecvMsg gives it.) A stream its caller leaves unread when its ClientConn
// closes keeps its span open until the call's context ends.
type tracedStream struct {
	grpc.ClientStream
	s             trace.Span
	serverStreams bool
	stop          func() bool // set before the stream is handed out
	once          sync.Once
}

func (ts *tracedStream) end(err error) {
	ts.stop()
	ts.once.Do(func() { endSpan(ts.s, err) })
}

func (ts *tracedStream) SendMsg(m any) error {
	err := ts.ClientStream.SendMsg(m)
	if err != nil && err != io.EOF { // io.EOF: the status comes from RecvMsg
		ts.end(err)
	}
	return err
}

func (ts *tracedStream) RecvMsg(m any) error {
	err := ts.ClientStream.RecvMsg(m)
	if err != nil || !ts.serverStreams {
		if err == io.EOF {
			err = nil
		}
		ts.end(err)
	}
	return err
}

// clientTrace is the stats handler that spans each attempt of a traced
// call and writes its context into the attempt's metadata.
type clientTrace struct{}

type attemptSpanKey struct{}

func (clientTrace) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	t := meshtrace.FromContext(ctx)
	call, _ := ctx.Value(callTraceKey{}).(*callTrace)
	if t == nil || call == nil {
		return ctx
	}
	n := int(call.attempts.Add(1)) - 1
	kind, ok := meshtrace.AttemptKindFrom(ctx)
	if !ok {
		kind = meshtrace.AttemptFirst
		if n > 0 {
			kind = meshtrace.AttemptRetry
		}
	}
	kv := append(meshtrace.GRPCAttrs(info.FullMethodName), meshtrace.AttrAttemptKind.String(string(kind)))
	if n > 0 {
		kv = append(kv, semconv.HTTPRequestResendCount(n))
	}
	ctx, s := t.Start(ctx, info.FullMethodName, trace.SpanKindClient, kv...)
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	for _, k := range traceKeys {
		delete(md, k)
	}
	meshtrace.Inject(ctx, mdCarrier(md))
	ctx = metadata.NewOutgoingContext(ctx, md)
	return context.WithValue(ctx, attemptSpanKey{}, s)
}

func (clientTrace) HandleRPC(ctx context.Context, st stats.RPCStats) {
	s, _ := ctx.Value(attemptSpanKey{}).(trace.Span)
	if s == nil {
		return
	}
	switch st := st.(type) {
	case *stats.OutHeader:
		if st.RemoteAddr != nil {
			s.SetAttributes(meshtrace.PeerAttrs(st.RemoteAddr.String())...)
			s.SetAttributes(meshtrace.AttrEndpoint.String(st.RemoteAddr.String()))
		}
	case *stats.End:
		endSpan(s, st.Error)
	}
}

func (clientTrace) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (clientTrace) HandleConn(context.Context, stats.ConnStats)                       {}

// serverTrace is the stats handler that spans each call a server serves.
type serverTrace struct{ t *meshtrace.Tracer }

type serverSpanKey struct{}

func (h serverTrace) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = h.t.Extract(ctx, mdCarrier(md))
	kv := meshtrace.GRPCAttrs(info.FullMethodName)
	if id := h.t.ServerIdentity(); id != "" {
		kv = append(kv, meshtrace.AttrServerIdentity.String(id))
	}
	if p, ok := identity.PeerFromContext(ctx); ok && p.ID != "" {
		kv = append(kv, meshtrace.AttrClientIdentity.String(p.ID))
	}
	ctx, s := h.t.Start(ctx, info.FullMethodName, trace.SpanKindServer, kv...)
	return context.WithValue(ctx, serverSpanKey{}, s)
}

func (serverTrace) HandleRPC(ctx context.Context, st stats.RPCStats) {
	s, _ := ctx.Value(serverSpanKey{}).(trace.Span)
	if s == nil {
		return
	}
	switch st := st.(type) {
	case *stats.InHeader:
		if st.RemoteAddr != nil {
			s.SetAttributes(meshtrace.PeerAttrs(st.RemoteAddr.String())...)
		}
	case *stats.End:
		endServerSpan(s, st.Error)
	}
}

func (serverTrace) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (serverTrace) HandleConn(context.Context, stats.ConnStats)                       {}

// traceKeys are the metadata keys of trace context, removed from a call's
// metadata before its attempt's are written.
var traceKeys = []string{"traceparent", "tracestate", "b3", "x-b3-traceid", "x-b3-spanid", "x-b3-parentspanid", "x-b3-sampled", "x-b3-flags"}

// mdCarrier is gRPC metadata as a propagation carrier.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
