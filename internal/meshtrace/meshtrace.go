// Package meshtrace traces the requests of the mesh's stacks through the
// OpenTelemetry trace API: a server span per inbound request, a client
// span per outbound request, a child span per attempt of a route that
// retries (or hedges, or mirrors), attributes from OpenTelemetry's HTTP
// and RPC semantic conventions and the mesh's own, and events for the
// balancer's choices. Trace context travels in W3C traceparent/baggage
// and B3 headers, both read and written, as Linkerd's proxies propagate
// both.
//
// A nil [*Tracer] is off: every hook is a branch on a nil pointer or one
// context lookup that finds nothing, and allocates nothing. Sampling is the
// TracerProvider's (parent-based with the SDK's default sampler): an
// unsampled parent's context is still propagated, so that the hops after
// this one agree.
package meshtrace

import (
	"context"
	"net/http"
	"strconv"
	"sync"

	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the mesh's spans.
const ScopeName = "github.com/inmesh/inmesh"

// The mesh's own span attributes, beside the semantic conventions'.
const (
	// AttrRoute is the name of the route a request took (a policy route's
	// name, a ServiceProfile route's name; "default" for the default
	// route), AttrRouteKind its kind (HTTPRoute, GRPCRoute,
	// ServiceProfile).
	AttrRoute     = attribute.Key("inmesh.route")
	AttrRouteKind = attribute.Key("inmesh.route.kind")
	// AttrBackend is the backend of the route an attempt went to.
	AttrBackend = attribute.Key("inmesh.backend")
	// AttrEndpoint is the address of the endpoint the balancer chose,
	// AttrZone its zone and AttrServerIdentity the identity it must prove.
	AttrEndpoint       = attribute.Key("inmesh.endpoint")
	AttrZone           = attribute.Key("inmesh.zone")
	AttrServerIdentity = attribute.Key("inmesh.server.identity")
	// AttrClientIdentity is the verified identity of an inbound request's
	// client.
	AttrClientIdentity = attribute.Key("inmesh.client.identity")
	// AttrClassification is the response class of Linkerd's metrics
	// ("success", "failure").
	AttrClassification = attribute.Key("inmesh.classification")
	// AttrProxyError is the message of a response the mesh made itself
	// (its l5d-proxy-error header): a timeout, a fail-fast, no route.
	AttrProxyError = attribute.Key("inmesh.proxy_error")
	// AttrAttemptKind says why an attempt was sent: [AttemptFirst],
	// [AttemptRetry], [AttemptHedge] or [AttemptMirror].
	AttrAttemptKind = attribute.Key("inmesh.attempt.kind")
	// AttrRetries is the number of retries of a logical request.
	AttrRetries = attribute.Key("inmesh.retries")
	// AttrEjected is the number of endpoints outlier detection had
	// ejected when the balancer picked for a request (on
	// [EventEndpointSkipped]).
	AttrEjected = attribute.Key("inmesh.balancer.ejected")
)

// AttemptKind is why an attempt of a request was sent.
type AttemptKind string

// The kinds of attempts.
const (
	AttemptFirst  AttemptKind = "first"
	AttemptRetry  AttemptKind = "retry"
	AttemptHedge  AttemptKind = "hedge"
	AttemptMirror AttemptKind = "mirror"
)

// Balancer events, on the span of the attempt (or request) they concern.
// EventEndpointSkipped says that the balancer picked without the endpoints
// outlier detection had ejected (as of its last sweep); its attribute
// [AttrEjected] counts them.
const (
	EventQueued          = "inmesh.balancer.queued"
	EventDequeued        = "inmesh.balancer.dequeued"
	EventFailFast        = "inmesh.balancer.fail_fast"
	EventLoadShed        = "inmesh.balancer.load_shed"
	EventEndpointSkipped = "inmesh.balancer.endpoint_skipped"
)

// proxyErrorHeader is Linkerd's header on the responses the proxy made
// (internal/proxyerr.Header; not imported, so that every layer may import
// this package).
const proxyErrorHeader = "L5d-Proxy-Error"

// The span kinds' start options, made once: an option made per span is an
// allocation.
var (
	serverKind = trace.WithSpanKind(trace.SpanKindServer)
	clientKind = trace.WithSpanKind(trace.SpanKindClient)
)

// Tracer traces the requests of one stack. A nil *Tracer is off.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// server is the local identity's name, on inbound spans.
	server string
	// defaultProp: prop is DefaultPropagator's, whose headers inject
	// writes itself, with fewer allocations.
	defaultProp bool
}

// DefaultPropagator reads and writes B3 (both the multi-header and the
// single-header form are read; the multi-header form is written, as
// Linkerd's proxies do) and W3C trace context and baggage. When a request
// carries both, W3C's traceparent wins.
func DefaultPropagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(
		b3.New(b3.WithInjectEncoding(b3.B3MultipleHeader)),
		propagation.TraceContext{}, propagation.Baggage{})
}

// New returns the tracer of a stack over tp, nil (off) when tp is nil or
// OpenTelemetry's no-op provider. prop nil means [DefaultPropagator];
// serverIdentity names the local workload on inbound spans.
func New(tp trace.TracerProvider, prop propagation.TextMapPropagator, serverIdentity string) *Tracer {
	switch tp.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		return nil
	}
	statusOnce.Do(buildStatusAttrs)
	t := &Tracer{tracer: tp.Tracer(ScopeName), prop: prop, server: serverIdentity}
	if prop == nil {
		t.prop, t.defaultProp = DefaultPropagator(), true
	}
	return t
}

// Propagator returns the tracer's propagator.
func (t *Tracer) Propagator() propagation.TextMapPropagator { return t.prop }

type tracerKey struct{}

// with marks ctx as traced by t, for the layers below the span.
func (t *Tracer) with(ctx context.Context) context.Context {
	if fromContext(ctx) == t {
		return ctx
	}
	return context.WithValue(ctx, tracerKey{}, t)
}

func fromContext(ctx context.Context) *Tracer {
	t, _ := ctx.Value(tracerKey{}).(*Tracer)
	return t
}

// WithTraceOf returns ctx traced as the request of parent is: carrying
// parent's tracer and span, and none of parent's other values nor its
// cancellation. It is for a request sent on behalf of parent's that may
// outlive it (a mirror's copy), whose spans are then children of
// parent's. When parent is not traced it returns ctx.
func WithTraceOf(ctx, parent context.Context) context.Context {
	t := fromContext(parent)
	if t == nil {
		return ctx
	}
	return t.with(trace.ContextWithSpan(ctx, trace.SpanFromContext(parent)))
}

// Enabled reports whether a request with context ctx is traced: a
// [Tracer.Transport] above it started its span. Layers use it to skip
// building what only a span needs.
func Enabled(ctx context.Context) bool { return fromContext(ctx) != nil }

// span returns the recording span of ctx, nil when there is none.
func span(ctx context.Context) trace.Span {
	if fromContext(ctx) == nil {
		return nil
	}
	s := trace.SpanFromContext(ctx)
	if !s.IsRecording() {
		return nil
	}
	return s
}

// SetAttributes sets attributes on the recording span of ctx, if any.
// Callers on hot paths check [Enabled] first, so that the variadic slice
// is not built for nothing.
func SetAttributes(ctx context.Context, kv ...attribute.KeyValue) {
	if s := span(ctx); s != nil {
		s.SetAttributes(kv...)
	}
}

// Event adds the event name (one of the Event* constants) to the recording
// span of ctx, if any.
func Event(ctx context.Context, name string) {
	if s := span(ctx); s != nil {
		s.AddEvent(name)
	}
}

// EventWith is [Event] with one attribute.
func EventWith(ctx context.Context, name string, kv attribute.KeyValue) {
	if s := span(ctx); s != nil {
		s.AddEvent(name, trace.WithAttributes(kv))
	}
}

// Route records the route a request took on its span. Callers that
// serve many requests of one route keep [RouteAttrs] and call
// [SetAttributes] with them instead.
func Route(ctx context.Context, kind, name string) {
	if s := span(ctx); s != nil {
		s.SetAttributes(RouteAttrs(kind, name)...)
	}
}

// RouteAttrs are the attributes of a route of kind named name, built once
// with the route and set on each of its requests' spans.
func RouteAttrs(kind, name string) []attribute.KeyValue {
	return []attribute.KeyValue{AttrRouteKind.String(kind), AttrRoute.String(name)}
}

// BackendAttrs are the attributes of a backend named name, built once with
// the route and set on each span of an attempt that goes to it.
func BackendAttrs(name string) []attribute.KeyValue {
	return []attribute.KeyValue{AttrBackend.String(name)}
}

// The classifications, made once.
var (
	classSuccess = []attribute.KeyValue{AttrClassification.String("success")}
	classFailure = []attribute.KeyValue{AttrClassification.String("failure")}
)

// Classified records a request's classification and, when the mesh
// labelled an error (Linkerd's error label: FAIL_FAST, REQUEST_TIMEOUT),
// that error as error.type.
func Classified(ctx context.Context, success bool, errLabel string, retries int) {
	s := span(ctx)
	if s == nil {
		return
	}
	class := classSuccess
	if !success {
		class = classFailure
	}
	if retries == 0 && errLabel == "" {
		s.SetAttributes(class...)
		return
	}
	kv := append(make([]attribute.KeyValue, 0, 3), class[0])
	if retries > 0 {
		kv = append(kv, AttrRetries.Int(retries))
	}
	if errLabel != "" {
		kv = append(kv, semconv.ErrorTypeKey.String(errLabel))
	}
	s.SetAttributes(kv...)
}

// startAttrsCap is the room of a pooled start buffer: every attribute of
// either kind of span and what its caller appends (identities, the
// attempt's kind and ordinal).
const startAttrsCap = 16

// startBuf holds what a span starts with: its attributes, and the start
// options that carry them, made once per buffer. The trace API's
// WithAttributes boxes its slice into an interface (an allocation), and a
// variadic options list passed through an interface escapes (another): a
// buffer keeps one WithAttributes option for each length of its attribute
// array, and the options list a Start is given. It is borrowed for a
// Start only: the trace API's start options copy the attributes they are
// given (trace.NewSpanStartConfig), so the buffer is free again once Start
// returned.
type startBuf struct {
	// attrs is appended to; while it fits, it is base[:len(attrs)].
	attrs []attribute.KeyValue
	base  []attribute.KeyValue
	// withAttrs[n] is trace.WithAttributes(base[:n]...).
	withAttrs [startAttrsCap + 1]trace.SpanStartOption
	opts      [2]trace.SpanStartOption
}

var startBufs = sync.Pool{New: func() any {
	b := &startBuf{base: make([]attribute.KeyValue, startAttrsCap)}
	for n := range b.withAttrs {
		b.withAttrs[n] = trace.WithAttributes(b.base[:n:n]...)
	}
	b.attrs = b.base[:0]
	return b
}}

// start starts a span of kind named name under ctx with b's attributes,
// and returns b to startBufs.
func (t *Tracer) start(ctx context.Context, name string, kind trace.SpanStartOption, b *startBuf) (context.Context, trace.Span) {
	n := len(b.attrs)
	b.opts[0] = kind
	if n <= startAttrsCap && (n == 0 || &b.attrs[0] == &b.base[0]) {
		b.opts[1] = b.withAttrs[n]
	} else {
		// The caller outgrew the buffer: a slice of its own.
		b.opts[1] = trace.WithAttributes(b.attrs...)
	}
	ctx, s := t.tracer.Start(ctx, name, b.opts[:]...)
	clear(b.base)
	b.opts = [2]trace.SpanStartOption{}
	b.attrs = b.base[:0]
	startBufs.Put(b)
	return ctx, s
}

// requestAttrs borrows a start buffer and appends to its attributes the
// semantic conventions' attributes of an HTTP request.
func requestAttrs(req *http.Request, server bool) *startBuf {
	b := startBufs.Get().(*startBuf)
	b.attrs = appendRequestAttrs(b.attrs, req, server)
	return b
}

// appendRequestAttrs appends the semantic conventions' attributes of an
// HTTP request to kvs.
func appendRequestAttrs(kvs []attribute.KeyValue, req *http.Request, server bool) []attribute.KeyValue {
	host := req.Host
	if host == "" && req.URL != nil {
		host = req.URL.Host
	}
	scheme := "http"
	if req.URL != nil && req.URL.Scheme != "" {
		scheme = req.URL.Scheme
	} else if req.TLS != nil {
		scheme = "https"
	}
	kvs = append(kvs, semconv.HTTPRequestMethodKey.String(req.Method), semconv.URLScheme(scheme),
		semconv.NetworkProtocolVersion(protoVersion(req)))
	if h, p, ok := splitHostPort(host); ok {
		kvs = append(kvs, semconv.ServerAddress(h), semconv.ServerPort(p))
	} else if host != "" {
		kvs = append(kvs, semconv.ServerAddress(host))
	}
	path := ""
	if req.URL != nil {
		path = req.URL.Path
	}
	if server {
		kvs = append(kvs, semconv.URLPath(path))
		if h, p, ok := splitHostPort(req.RemoteAddr); ok {
			kvs = append(kvs, semconv.ClientAddress(h), semconv.NetworkPeerAddress(h), semconv.NetworkPeerPort(p))
		}
	} else {
		// url.full without the query, which may carry secrets.
		kvs = append(kvs, semconv.URLFull(scheme+"://"+host+path))
	}
	if isGRPC(req.Header) {
		svc, method := splitGRPCPath(path)
		kvs = append(kvs, semconv.RPCSystemNameGRPC, semconv.RPCMethod(svc+"/"+method))
	}
	return kvs
}

func protoVersion(req *http.Request) string {
	switch req.ProtoMajor {
	case 2:
		return "2"
	case 3:
		return "3"
	}
	return "1.1"
}

func isGRPC(h http.Header) bool {
	ct := h.Get("Content-Type")
	return len(ct) >= 16 && ct[:16] == "application/grpc"
}

// splitGRPCPath splits /pkg.Service/Method.
func splitGRPCPath(p string) (svc, method string) {
	if len(p) > 0 && p[0] == '/' {
		p = p[1:]
	}
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i], p[i+1:]
		}
	}
	return p, ""
}

func splitHostPort(hp string) (string, int, bool) {
	for i := len(hp) - 1; i >= 0; i-- {
		switch hp[i] {
		case ':':
			p, err := strconv.Atoi(hp[i+1:])
			if err != nil {
				return "", 0, false
			}
			h := hp[:i]
			if len(h) >= 2 && h[0] == '[' && h[len(h)-1] == ']' {
				h = h[1 : len(h)-1]
			}
			return h, p, true
		case ']':
			return "", 0, false
		}
	}
	return "", 0, false
}

// statusAttrs holds http.response.status_code for each status from 100 to
// 599, built with the first tracer, so that setting a response's status
// builds nothing.
var (
	statusOnce  sync.Once
	statusTable []attribute.KeyValue
)

func buildStatusAttrs() {
	statusTable = make([]attribute.KeyValue, 500)
	for i := range statusTable {
		statusTable[i] = semconv.HTTPResponseStatusCode(100 + i)
	}
}

// statusAttr returns http.response.status_code = code as a one-element
// slice.
func statusAttr(code int) []attribute.KeyValue {
	if code >= 100 && code < 600 && statusTable != nil {
		return statusTable[code-100 : code-99 : code-99]
	}
	return []attribute.KeyValue{semconv.HTTPResponseStatusCode(code)}
}

// responseAttrs sets a response's attributes and the span's status: an
// error for a 5xx, or for any status the mesh answered itself
// (l5d-proxy-error) or a gRPC failure in the head.
func responseAttrs(s trace.Span, resp *http.Response, server bool) {
	s.SetAttributes(statusAttr(resp.StatusCode)...)
	if msg := resp.Header.Get(proxyErrorHeader); msg != "" {
		// The mesh answered: its error label (set by the router, such as
		// REQUEST_TIMEOUT) is the error.type, not the status.
		s.SetAttributes(AttrProxyError.String(msg))
		s.SetStatus(codes.Error, msg)
		return
	}
	if gs := resp.Header.Get("Grpc-Status"); gs != "" {
		s.SetAttributes(semconv.RPCResponseStatusCode(grpcCodeName(gs)))
		if gs != "0" {
			s.SetStatus(codes.Error, "grpc-status "+gs)
		}
	}
	statusOf(s, resp.StatusCode, server)
}

// statusOf sets the span's status by an HTTP status: a client span fails
// on 4xx and 5xx, a server span on 5xx (the semantic conventions).
func statusOf(s trace.Span, code int, server bool) {
	if code >= 500 || !server && code >= 400 {
		s.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(code)))
		s.SetStatus(codes.Error, "")
	}
}

// grpcCodeName is the name of a gRPC status code, as the semantic
// conventions' rpc.response.status_code gives it.
func grpcCodeName(code string) string {
	names := [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
		"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
		"OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}
	if n, err := strconv.Atoi(code); err == nil && n >= 0 && n < len(names) {
		return names[n]
	}
	return code
}

// grpcServerError reports whether a server span whose call ended with the
// gRPC status code is an error, by the RPC semantic conventions: UNKNOWN,
// DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE or DATA_LOSS
// (the others are the client's doing, errors of its span only).
func grpcServerError(code string) bool {
	switch code {
	case "2", "4", "12", "13", "14", "15":
		return true
	}
	return false
}

// failedStatus marks s failed with a description.
func failedStatus(s trace.Span, desc string) { s.SetStatus(codes.Error, desc) }

// failed marks s failed by err.
func failed(s trace.Span, err error) {
	s.RecordError(err)
	s.SetAttributes(semconv.ErrorType(err))
	s.SetStatus(codes.Error, err.Error())
}

// EndpointChosen records the endpoint the balancer chose for the request
// of ctx: attrs are its [EndpointAttrs], built once with the endpoint.
func EndpointChosen(ctx context.Context, attrs []attribute.KeyValue) {
	if s := span(ctx); s != nil {
		s.SetAttributes(attrs...)
	}
}

// EndpointAttrs are the attributes of an endpoint at addr (host:port):
// inmesh.endpoint, network.peer.*, its zone and identity when it has them.
func EndpointAttrs(addr, zone, id string) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 5)
	kv = append(kv, AttrEndpoint.String(addr))
	if h, p, ok := splitHostPort(addr); ok {
		kv = append(kv, semconv.NetworkPeerAddress(h), semconv.NetworkPeerPort(p))
	}
	if zone != "" {
		kv = append(kv, AttrZone.String(zone))
	}
	if id != "" {
		kv = append(kv, AttrServerIdentity.String(id))
	}
	return kv
}

// Start starts a span named name of kind under ctx, and marks the context
// it returns as traced by t, for the layers below.
func (t *Tracer) Start(ctx context.Context, name string, kind trace.SpanKind, kv ...attribute.KeyValue) (context.Context, trace.Span) {
	return t.tracer.Start(t.with(ctx), name, kindOption(kind), trace.WithAttributes(kv...))
}

// kindOption is the start option of kind, made once for the kinds the
// mesh starts.
func kindOption(kind trace.SpanKind) trace.SpanStartOption {
	switch kind {
	case trace.SpanKindServer:
		return serverKind
	case trace.SpanKindClient:
		return clientKind
	}
	return trace.WithSpanKind(kind)
}

// Extract returns ctx with the trace context carrier holds, if any.
func (t *Tracer) Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	return t.prop.Extract(ctx, carrier)
}

// FromContext returns the tracer that traces the request of ctx, nil when
// it is not traced.
func FromContext(ctx context.Context) *Tracer { return fromContext(ctx) }

// ServerIdentity returns the local identity t names on inbound spans.
func (t *Tracer) ServerIdentity() string { return t.server }

type attemptKindKey struct{}

// WithAttemptKind returns ctx saying that the attempt sent with it is of
// kind, for a transport whose attempts are spanned below the caller (a
// gRPC stats handler); ctx as it is when it is not traced. Hedging and
// mirroring mark their attempts with it.
func WithAttemptKind(ctx context.Context, kind AttemptKind) context.Context {
	if !Enabled(ctx) {
		return ctx
	}
	return context.WithValue(ctx, attemptKindKey{}, kind)
}

// AttemptKindFrom returns the kind [WithAttemptKind] put in ctx.
func AttemptKindFrom(ctx context.Context) (AttemptKind, bool) {
	k, ok := ctx.Value(attemptKindKey{}).(AttemptKind)
	return k, ok
}

// GRPCAttrs are the semantic conventions' attributes of a gRPC call of
// fullMethod (/pkg.Service/Method).
func GRPCAttrs(fullMethod string) []attribute.KeyValue {
	svc, method := splitGRPCPath(fullMethod)
	return []attribute.KeyValue{semconv.RPCSystemNameGRPC, semconv.RPCMethod(svc + "/" + method)}
}

// GRPCCodeName is the name of gRPC status code c (rpc.response.status_code).
func GRPCCodeName(c uint32) string { return grpcCodeName(strconv.FormatUint(uint64(c), 10)) }

// GRPCServerError reports whether the server span of a call that ended with
// code c is an error (see grpcServerError).
func GRPCServerError(c uint32) bool { return grpcServerError(strconv.FormatUint(uint64(c), 10)) }

// PeerAttrs are the network.peer.* attributes of addr (host:port).
func PeerAttrs(addr string) []attribute.KeyValue {
	if h, p, ok := splitHostPort(addr); ok {
		return []attribute.KeyValue{semconv.NetworkPeerAddress(h), semconv.NetworkPeerPort(p)}
	}
	return nil
}
