package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// traceFlags are the proxy's tracing settings: spans go to an OTLP/gRPC
// collector (Linkerd's default trace protocol), none without an endpoint.
type traceFlags struct {
	endpoint string
	sampling float64
	service  string
	batch    time.Duration
}

func (f *traceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.endpoint, "otlp-endpoint", "", "host:port of an OTLP/gRPC trace collector (plaintext); empty: no tracing")
	fs.Float64Var(&f.sampling, "trace-sampling", 1,
		"share of the traces this proxy starts that are sampled, 0 to 1; a request that comes with a trace context follows its parent's decision")
	fs.StringVar(&f.service, "trace-service-name", "inmesh-proxy", "service.name of the proxy's spans")
	fs.DurationVar(&f.batch, "otlp-batch-timeout", time.Second, "longest time a span waits before it is exported")
}

// startTracing returns the tracer provider of -otlp-endpoint and its
// shutdown, which exports the spans still queued; nil without an endpoint.
func startTracing(ctx context.Context, f traceFlags) (trace.TracerProvider, func(), error) {
	if f.endpoint == "" {
		return nil, func() {}, nil
	}
	if f.sampling < 0 || f.sampling > 1 {
		return nil, nil, fmt.Errorf("-trace-sampling %v: not between 0 and 1", f.sampling)
	}
	if f.batch <= 0 {
		return nil, nil, errors.New("-otlp-batch-timeout must be positive")
	}
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(f.endpoint), otlptracegrpc.WithInsecure())
	if err != nil {
		return nil, nil, fmt.Errorf("-otlp-endpoint: %w", err)
	}
	res := resource.NewSchemaless(semconv.ServiceName(f.service))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(f.batch)), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(f.sampling))))
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx)
	}, nil
}
