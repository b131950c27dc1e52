package main

import (
	"context"
	"net/http"

	"github.com/inmesh/inmesh/mesh"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/metric"
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
// span, an attempt span and a server span) against the same stacks
// without one; and the time inmesh adds with that tracer against the time
// otelhttp's handler and transport add with the same tracer (two spans).
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

	otelSrv := serve(&http.Server{Handler: otelhttp.NewHandler(ok, "inbound", otelhttp.WithMeterProvider(mp), otelhttp.WithTracerProvider(tp))})
	defer otelSrv.Close()
	otelBase := h1Transport()
	defer otelBase.CloseIdleConnections()
	otelRT := otelhttp.NewTransport(otelBase, otelhttp.WithMeterProvider(mp), otelhttp.WithTracerProvider(tp))
	run := func(rt http.RoundTripper, url string) func() (figures, error) {
		return func() (figures, error) { return serial(rt, func() *http.Request { return get(url, "") }, n) }
	}
	traced := variant{"inmesh_traced", run(st.client, meshURL)}
	otelTraced := variant{"otelhttp_traced", run(otelRT, otelSrv.URL+"/books/1")}

	rs, err := interleave(o.rounds, s.bare, s.inmesh, traced, s.otel, otelTraced)
	if err != nil {
		return nil, err
	}
	const bare, im, imT, oh, ohT = 0, 1, 2, 3, 4
	r := &result{
		ratio:     rs.ratio("", atMost(1.10), func(f []figures) float64 { return f[imT].P50 / f[im].P50 }),
		Candidate: rs.median(imT), Baseline: rs.median(im),
		Others: map[string]figures{"bare": *rs.median(bare), "otelhttp": *rs.median(oh), "otelhttp_traced": *rs.median(ohT)},
		Extra: []ratio{
			rs.ratio("added p50 with the tracer: inmesh / otelhttp", atMost(0.5), func(f []figures) float64 {
				return (f[imT].P50 - f[bare].P50) / (f[ohT].P50 - f[bare].P50)
			}),
			rs.ratio("tracing's own p50: inmesh (3 spans) / otelhttp (2 spans)", noGoal, func(f []figures) float64 {
				return (f[imT].P50 - f[im].P50) / (f[ohT].P50 - f[oh].P50)
			}),
			rs.ratio("otelhttp traced p50 / untraced", noGoal, func(f []figures) float64 { return f[ohT].P50 / f[oh].P50 }),
			rs.ratio("added allocs of tracing: inmesh / otelhttp", noGoal, func(f []figures) float64 {
				return (f[imT].Allocs - f[im].Allocs) / (f[ohT].Allocs - f[oh].Allocs)
			}),
		},
	}
	r.Note = "ratio = p50 through both inmesh stacks with a recording tracer (100% sampled) / without; candidate traced, baseline untraced"
	return r, nil
}
