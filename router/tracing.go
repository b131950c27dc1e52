package router

import (
	"github.com/inmesh/inmesh/internal/meshtrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// WithTracerProvider traces the requests of [Router.Transport] through
// tp: a client span per request, a child span per attempt of a route that
// retries (inmesh.attempt.kind "first", "retry"), the route
// and backend as attributes, and the trace context written into each
// attempt's headers (W3C traceparent and baggage, and B3, unless
// [WithPropagator] says otherwise). Sampling is tp's. Without it (or with
// nil, or OpenTelemetry's no-op provider) nothing is traced and a request
// costs no allocation more. The inbound side ([Router.Handler]) records
// its route on the span of a server layer above it, such as mesh's.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithPropagator sets how trace context is written into outbound requests
// (default: B3 multi-header, W3C trace context and baggage).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.prop = p })
}

// tracer returns the router's tracer, nil when tracing is off.
func (r *Router) tracer() *meshtrace.Tracer { return r.trace }
