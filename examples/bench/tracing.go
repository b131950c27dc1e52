package main

import (
	"context"
	"net/http"

	"github.com/inmesh/inmesh/mesh"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// discardExporter drops the spans it is given: the cost measured is the
// spans' making and batching, not an exporter's.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// newRecordingTracer is the SDK's tracer provider sampling every trace,
// its spans batched to an exporter that drops them.
func newRecordingTracer() *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithBatcher(discardExporter{}))
}

// tracedStack is newStack's pair of stacks with tracing through tp.
func tracedStack(app http.Handler, mp metric.MeterProvider, tp trace.TracerProvider, local string) *stack {
	src, setProfile := staticProfiles()
	setProfile(local)
	opts := []mesh.Option{mesh.WithMeterProvider(mp), mesh.WithLogger(quiet), mesh.WithProfiles(src), mesh.WithTracerProvider(tp)}
	return &stack{server: mesh.NewServer(app, append(mesh.ServerOptions(opts...), mesh.WithLocalAuthorities(local))...),
		client: mesh.NewClient(mesh.ClientOptions(opts...)...)}
}

// tracingLoopback: a round trip on loopback through inmesh's client and
// server stacks with a recording tracer (every request sampled: a client
// span, which stands for the one attempt of a route that never retries,
// and a server span) against the same stacks without one; and the time
// inmesh adds with that tracer against the time otelhttp's handler and
// transport add with the same tracer and propagator (two spans too); and
// the SDK's floor: its two spans alone on bare net/http with the same
// tracer, empty and with the attributes inmesh's spans carry
// (tracing_floor.go), against what inmesh's tracing adds.
func tracingLoopback(o options) (*result, error) {
	n := o.scale(2000, 1000)
	s, err := newLoopbackSet(n)
	if err != nil {
		return nil, err
	}
	defer s.close()
	tp := newRecordingTracer()
	defer tp.Shutdown(context.Background())
	mp := newMeter()
	defer mp.Shutdown(context.Background())

	late := &lateHandler{}
	meshSrv := serveMeshed(late)
	defer meshSrv.Close()
	st := tracedStack(ok, mp, tp, meshSrv.addr())
	defer st.close()
	late.set(st.server)
	meshURL := meshSrv.URL + "/books/1"
	send := func() { _ = do(st.client, get(meshURL, "")) }
	if err := waitRoutes(st.client.Router(), meshSrv.addr(), send); err != nil {
		return nil, err
	}
	if err := waitRoutes(st.server.Router(), meshSrv.addr(), send); err != nil {
		return nil, err
	}

	// otelhttp without a propagator (the global one, which propagates
	// nothing unless the program sets one) starts a new trace on the
	// server side and writes no header; given inmesh's default propagator
	// (W3C and B3 multi-header out; B3 or W3C in), it does what inmesh's
	// stacks do on the wire. The goal is measured against the latter; the
	// former is the figure this scenario reported first.
	run := func(rt http.RoundTripper, url string) func() (figures, error) {
		return func() (figures, error) { return serial(rt, func() *http.Request { return get(url, "") }, n) }
	}
	otelVariant := func(name string, opts ...otelhttp.Option) (variant, func()) {
		opts = append(opts, otelhttp.WithMeterProvider(mp), otelhttp.WithTracerProvider(tp))
		srv := serve(&http.Server{Handler: otelhttp.NewHandler(ok, "inbound", opts...)})
		base := h1Transport()
		rt := otelhttp.NewTransport(base, opts...)
		return variant{name, run(rt, srv.URL+"/books/1")}, func() { base.CloseIdleConnections(); srv.Close() }
	}
	otelTraced, closeTraced := otelVariant("otelhttp_traced", otelhttp.WithPropagators(meshPropagator()))
	defer closeTraced()
	otelBare, closeBare := otelVariant("otelhttp_traced_unpropagated")
	defer closeBare()
	// The SDK's floor (tracing_floor.go): its spans alone on bare
	// net/http, empty, and with the attributes inmesh's spans carry.
	sdkVariant := func(name string, attrs bool) (variant, func()) {
		tr := tp.Tracer("bench")
		h := &sdkSpanHandler{next: ok, tr: tr, calls: newSpanCalls(trace.SpanKindServer, nil)}
		srv := serve(&http.Server{Handler: h})
		base := h1Transport()
		rt := &sdkSpanTransport{base: base, tr: tr, calls: newSpanCalls(trace.SpanKindClient, nil)}
		if attrs {
			rt.calls, h.calls = meshSpanAttrs(srv.addr(), "/books/1")
		}
		return variant{name, run(rt, srv.URL+"/books/1")}, func() { base.CloseIdleConnections(); srv.Close() }
	}
	sdkSpans, closeSpans := sdkVariant("sdk_spans", false)
	defer closeSpans()
	sdkAttrs, closeAttrs := sdkVariant("sdk_spans_attrs", true)
	defer closeAttrs()
	traced := variant{"inmesh_traced", run(st.client, meshURL)}

	rs, err := interleave(o.rounds, s.bare, s.inmesh, traced, s.otel, otelTraced, otelBare, sdkSpans, sdkAttrs)
	if err != nil {
		return nil, err
	}
	const bare, im, imT, oh, ohT, ohU, sdk, sdkA = 0, 1, 2, 3, 4, 5, 6, 7
	r := &result{
		ratio:     rs.ratio("", atMost(1.10), func(f []figures) float64 { return f[imT].P50 / f[im].P50 }),
		Candidate: rs.median(imT), Baseline: rs.median(im),
		Others: map[string]figures{"bare": *rs.median(bare), "otelhttp": *rs.median(oh), "otelhttp_traced": *rs.median(ohT),
			"otelhttp_traced_unpropagated": *rs.median(ohU), "sdk_spans": *rs.median(sdk), "sdk_spans_attrs": *rs.median(sdkA)},
		Extra: []ratio{
			rs.ratio("added p50 with the tracer: inmesh / otelhttp (same propagator)", atMost(0.5), func(f []figures) float64 {
				return (f[imT].P50 - f[bare].P50) / (f[ohT].P50 - f[bare].P50)
			}),
			rs.ratio("added p50 with the tracer: inmesh / otelhttp propagating nothing (as first measured)", noGoal, func(f []figures) float64 {
				return (f[imT].P50 - f[bare].P50) / (f[ohU].P50 - f[bare].P50)
			}),
			rs.ratio("tracing's own p50: inmesh / otelhttp (2 spans each)", noGoal, func(f []figures) float64 {
				return (f[imT].P50 - f[im].P50) / (f[ohT].P50 - f[oh].P50)
			}),
			rs.ratio("otelhttp traced p50 / untraced", noGoal, func(f []figures) float64 { return f[ohT].P50 / f[oh].P50 }),
			rs.ratio("added allocs of tracing: inmesh / otelhttp", noGoal, func(f []figures) float64 {
				return (f[imT].Allocs - f[im].Allocs) / (f[ohT].Allocs - f[oh].Allocs)
			}),
			rs.ratio("SDK floor: added p50 of the SDK's two spans with inmesh's attributes / added p50 of inmesh's tracing", noGoal, func(f []figures) float64 {
				return (f[sdkA].P50 - f[bare].P50) / (f[imT].P50 - f[im].P50)
			}),
			rs.ratio("SDK floor: added p50 of the SDK's two empty spans / added p50 of inmesh's tracing", noGoal, func(f []figures) float64 {
				return (f[sdk].P50 - f[bare].P50) / (f[imT].P50 - f[im].P50)
			}),
			rs.ratio("SDK floor of the ratio: (untraced p50 + the SDK's spans with inmesh's attributes) / untraced p50", noGoal, func(f []figures) float64 {
				return (f[im].P50 + f[sdkA].P50 - f[bare].P50) / f[im].P50
			}),
			rs.ratio("SDK floor: added allocs of the SDK's two spans with inmesh's attributes / added allocs of inmesh's tracing", noGoal, func(f []figures) float64 {
				return (f[sdkA].Allocs - f[bare].Allocs) / (f[imT].Allocs - f[im].Allocs)
			}),
		},
	}
	r.Note = "ratio = p50 through both inmesh stacks with a recording tracer (100% sampled) / without; candidate traced, baseline untraced"
	return r, nil
}

// meshPropagator is the propagator inmesh's stacks use by default
// (mesh.WithPropagator's default): B3, written multi-header, and W3C trace
// context and baggage.
func meshPropagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(b3.New(b3.WithInjectEncoding(b3.B3MultipleHeader)),
		propagation.TraceContext{}, propagation.Baggage{})
}
