package main

import (
	"net"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// The SDK's floor: bare net/http with the SDK's spans alone, two per round
// trip as inmesh's stacks make, through the same tracer provider (sampler,
// batch processor, exporter). The client starts a span before its round
// trip and ends it when the round trip returns; the handler, one around
// the application. No trace context is written or read, and nothing else
// is done per request: what these add over bare net/http is what the SDK
// costs, the part of a traced round trip that no instrumentation on top of
// it can take away.

// spanCalls are the attributes a span is given: at its start, then in each
// later SetAttributes call. They are built once, so that only the SDK's
// handling of them is measured.
type spanCalls struct {
	start []trace.SpanStartOption
	later [][]attribute.KeyValue
}

func newSpanCalls(kind trace.SpanKind, start []attribute.KeyValue, later ...[]attribute.KeyValue) spanCalls {
	opts := []trace.SpanStartOption{trace.WithSpanKind(kind)}
	if len(start) > 0 {
		opts = append(opts, trace.WithAttributes(start...))
	}
	return spanCalls{start: opts, later: later}
}

// sdkSpanTransport is base with a client span around each round trip.
type sdkSpanTransport struct {
	base  http.RoundTripper
	tr    trace.Tracer
	calls spanCalls
}

func (t *sdkSpanTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	_, s := t.tr.Start(req.Context(), req.Method, t.calls.start...)
	resp, err := t.base.RoundTrip(req)
	for _, kv := range t.calls.later {
		s.SetAttributes(kv...)
	}
	s.End()
	return resp, err
}

// sdkSpanHandler is next with a server span around each request.
type sdkSpanHandler struct {
	next  http.Handler
	tr    trace.Tracer
	calls spanCalls
}

func (h *sdkSpanHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, s := h.tr.Start(r.Context(), r.Method, h.calls.start...)
	h.next.ServeHTTP(w, r)
	for _, kv := range h.calls.later {
		s.SetAttributes(kv...)
	}
	s.End()
}

// meshSpanAttrs returns the calls by which inmesh's stacks give their
// spans their attributes in the tracing scenario (a GET of /books/1 from
// 127.0.0.1 to addr on a ServiceProfile route, answered 200): the client
// span starts with six and gets the route, the status and the
// classification after; the server span starts with nine (the client's
// address among them) and gets the route and the status after. The
// values are of one request (the client's port is a stand-in); only their
// number and kinds matter to the SDK.
func meshSpanAttrs(addr, path string) (client, server spanCalls) {
	host, ps, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(ps)
	common := []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(http.MethodGet), semconv.URLScheme("http"),
		semconv.NetworkProtocolVersion("1.1"), semconv.ServerAddress(host), semconv.ServerPort(port)}
	route := []attribute.KeyValue{attribute.String("inmesh.route.kind", "ServiceProfile"), attribute.String("inmesh.route", "GET /books/{id}")}
	status := []attribute.KeyValue{semconv.HTTPResponseStatusCode(http.StatusOK)}
	class := []attribute.KeyValue{attribute.String("inmesh.classification", "success")}
	clientStart := append(append([]attribute.KeyValue(nil), common...), semconv.URLFull("http://"+addr+path))
	serverStart := append(append([]attribute.KeyValue(nil), common...), semconv.URLPath(path), semconv.ClientAddress("127.0.0.1"),
		semconv.NetworkPeerAddress("127.0.0.1"), semconv.NetworkPeerPort(40000))
	return newSpanCalls(trace.SpanKindClient, clientStart, route, status, class),
		newSpanCalls(trace.SpanKindServer, serverStart, route, status)
}
