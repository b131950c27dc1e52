package mesh

import (
	"net/http"

	"github.com/inmesh/inmesh/internal/meshtrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// WithTracerProvider traces the stacks' requests through tp (OpenTelemetry's
// trace API; sampling is tp's, parent-based with the SDK's default
// sampler):
//
//   - the inbound stack starts a server span per request, the child of the
//     trace context the request carries (W3C traceparent and baggage, or
//     B3), with the semantic conventions' HTTP attributes, the server's and
//     the verified client's identities, the ServiceProfile route and, when
//     the mesh answered itself, its l5d-proxy-error;
//   - the outbound stack starts a client span per request and, on a route
//     that retries, a child span per attempt
//     (inmesh.attempt.kind "first" or "retry", http.request.resend_count),
//     with the route, backend, endpoint address, zone and identity, the
//     classification and Linkerd's error label (error.type), and the
//     balancer's events (queued, dequeued, fail_fast, load_shed, and
//     endpoint_skipped when outlier detection had endpoints ejected); each
//     attempt carries its span's context to the next hop in W3C and B3
//     headers.
//
// The application's own spans (otelhttp's, say) are the parents of the
// outbound spans when its request's context carries them, and the
// children of the inbound spans through the request's context. Without
// this option (or with nil, or OpenTelemetry's no-op provider) nothing is
// traced and a request costs no allocation more.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithPropagator sets how trace context is read from inbound requests and
// written into outbound ones (default: B3, whose multi-header form is
// written, and W3C trace context and baggage; W3C wins when a request
// carries both).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.prop = p })
}

// TraceTransport returns rt writing the trace context of each request's
// context into a copy of its headers (replacing the W3C and B3 headers it
// came with), when a traced stack ([WithTracerProvider]) gave that context:
// for a program that forwards the inbound stack's requests to another
// server, such as a proxy to its application, so that the application's
// spans are children of the inbound server span. Without tracing a
// request passes as it is.
func TraceTransport(rt http.RoundTripper) http.RoundTripper { return meshtrace.Outbound(rt) }
