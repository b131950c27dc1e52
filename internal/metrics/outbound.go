package metrics

import (
	"context"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Bucket bounds of the outbound route families, in seconds, as Linkerd's
// proxy exports them.
var (
	RouteDurationBuckets   = []float64{0.05, 0.5, 1, 10}
	BackendDurationBuckets = []float64{0.025, 0.05, 0.1, 0.25, 0.5, 1, 10}
)

// Outbound is the outbound_http_route_* or outbound_grpc_route_* family
// set of Linkerd's proxy. It is safe for concurrent use.
type Outbound struct {
	grpc bool

	duration        metric.Float64Histogram
	statuses        *Sum
	retryRequests   metric.Int64Counter
	retrySuccesses  metric.Int64Counter
	retryLimit      metric.Int64Counter
	retryOverflow   metric.Int64Counter
	backendRequests *Sum
	backendDuration metric.Float64Histogram
	backendStatuses *Sum
}

// NewOutbound creates the outbound_http_route_ families, or with grpc the
// outbound_grpc_route_ ones. Errors go to otel.Handle.
func NewOutbound(meter metric.Meter, grpc bool) *Outbound {
	p := "outbound_http_route_"
	if grpc {
		p = "outbound_grpc_route_"
	}
	o := &Outbound{grpc: grpc}
	counter := func(name, help string) metric.Int64Counter {
		c, err := meter.Int64Counter(p+name, metric.WithDescription(help))
		if err != nil {
			otel.Handle(err)
		}
		return c
	}
	hist := func(name, help string, bounds []float64) metric.Float64Histogram {
		h, err := meter.Float64Histogram(p+name, metric.WithDescription(help), metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(bounds...))
		if err != nil {
			otel.Handle(err)
		}
		return h
	}
	o.duration = hist("request_duration_seconds", "The time between request initialization and response completion.", RouteDurationBuckets)
	o.statuses = NewSum(meter, p+"request_statuses_total", "Completed request-response streams.")
	o.retryRequests = counter("retry_requests_total", "Retry requests emitted.")
	o.retrySuccesses = counter("retry_successes_total", "Successful responses to retry requests.")
	o.retryLimit = counter("retry_limit_exceeded_total", "Retryable requests not sent due to retry limits.")
	o.retryOverflow = counter("retry_overflow_total", "Retryable requests not sent due to circuit breakers or the retry budget.")
	o.backendRequests = NewSum(meter, p+"backend_requests_total", "The total number of requests dispatched.")
	o.backendDuration = hist("backend_response_duration_seconds", "The time between request dispatch and response completion.", BackendDurationBuckets)
	o.backendStatuses = NewSum(meter, p+"backend_response_statuses_total", "Completed responses.")
	return o
}

// Status identifies the status labels of one series: http_status (or
// grpc_status) and error.
type Status struct {
	// HTTP is the HTTP status, 0 for none; GRPC the gRPC status, -1 for
	// none (gRPC families only; written UNKNOWN, as Linkerd does).
	HTTP int
	GRPC int32
	// Error is one of Linkerd's error values ("" for none).
	Error string
}

// statusSet holds the series of a target's statuses, bounded.
type statusSet struct {
	grpc bool
	base []attribute.KeyValue
	sum  *Sum

	mu sync.RWMutex
	m  map[Status]*Series
}

func (s *statusSet) get(st Status) *Series {
	s.mu.RLock()
	o, ok := s.m[st]
	s.mu.RUnlock()
	if ok {
		return o
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok = s.m[st]; ok {
		return o
	}
	if len(s.m) >= maxResponseSeries {
		st = Status{GRPC: -1, Error: "UNKNOWN"}
		if o, ok = s.m[st]; ok {
			return o
		}
	}
	kvs := s.base[:len(s.base):len(s.base)]
	if s.grpc {
		// Linkerd's proxy writes UNKNOWN for a call that ended without
		// a status of its own (an error the proxy labels).
		name := "UNKNOWN"
		if st.GRPC >= 0 {
			name = GRPCStatusName(st.GRPC)
		}
		kvs = append(kvs, attribute.String("grpc_status", name))
	} else {
		code := ""
		if st.HTTP >= 100 && st.HTTP <= 599 {
			code = strconv.Itoa(st.HTTP)
		}
		kvs = append(kvs, attribute.String("http_status", code))
	}
	kvs = append(kvs, attribute.String("error", st.Error))
	o = s.sum.Series(attribute.NewSet(kvs...))
	s.m[st] = o
	return o
}

// RouteTarget is one route's series: the parent and route label groups
// and hostname, built once.
type RouteTarget struct {
	fam      *Outbound
	opts     []metric.AddOption // parent, route
	record   []metric.RecordOption
	statuses statusSet
	base     []attribute.KeyValue
}

// NewRouteTarget returns the target of a route; labels are the parent and
// route groups in order. hostname is added to the request families.
func NewRouteTarget(f *Outbound, hostname string, labels ...attribute.KeyValue) *RouteTarget {
	withHost := append(labels[:len(labels):len(labels)], attribute.String("hostname", hostname))
	set := attribute.NewSet(labels...)
	return &RouteTarget{
		fam:      f,
		base:     labels,
		opts:     []metric.AddOption{metric.WithAttributeSet(set)},
		record:   []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(withHost...))},
		statuses: statusSet{grpc: f.grpc, base: withHost, sum: f.statuses, m: make(map[Status]*Series)},
	}
}

// Done records the end of a logical request.
func (t *RouteTarget) Done(ctx context.Context, st Status, start time.Time) {
	t.fam.duration.Record(ctx, time.Since(start).Seconds(), t.record...)
	t.statuses.get(st).Add()
}

// Retry counts a retry sent; RetrySuccess a retried request that
// succeeded; LimitExceeded a retryable failure past the limit; Overflow
// one the budget refused.
func (t *RouteTarget) Retry(ctx context.Context)         { t.fam.retryRequests.Add(ctx, 1, t.opts...) }
func (t *RouteTarget) RetrySuccess(ctx context.Context)  { t.fam.retrySuccesses.Add(ctx, 1, t.opts...) }
func (t *RouteTarget) LimitExceeded(ctx context.Context) { t.fam.retryLimit.Add(ctx, 1, t.opts...) }
func (t *RouteTarget) Overflow(ctx context.Context)      { t.fam.retryOverflow.Add(ctx, 1, t.opts...) }

// BackendTarget is one backend of a route: parent, route and backend
// label groups, built once.
type BackendTarget struct {
	fam      *Outbound
	requests *Series
	record   []metric.RecordOption
	statuses statusSet
}

// NewBackendTarget returns the target of one backend of route rt; labels
// are the backend group in order.
func (rt *RouteTarget) NewBackendTarget(labels ...attribute.KeyValue) *BackendTarget {
	all := append(rt.base[:len(rt.base):len(rt.base)], labels...)
	set := attribute.NewSet(all...)
	return &BackendTarget{
		fam:      rt.fam,
		requests: rt.fam.backendRequests.Series(set),
		record:   []metric.RecordOption{metric.WithAttributeSet(set)},
		statuses: statusSet{grpc: rt.fam.grpc, base: all, sum: rt.fam.backendStatuses, m: make(map[Status]*Series)},
	}
}

// Request counts one request sent to the backend.
func (t *BackendTarget) Request(context.Context) { t.requests.Add() }

// Done records the end of one response of the backend.
func (t *BackendTarget) Done(ctx context.Context, st Status, start time.Time) {
	t.fam.backendDuration.Record(ctx, time.Since(start).Seconds(), t.record...)
	t.statuses.get(st).Add()
}

var grpcNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
	"ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

// GRPCStatusName returns the name of a gRPC status code as Linkerd's
// grpc_status label spells it (UNAVAILABLE); a code past the 17 that gRPC
// defines is UNKNOWN, as Linkerd's proxy reads one (tonic's
// Code::from_i32), so that a server cannot give the label values of its
// own.
func GRPCStatusName(code int32) string {
	if code >= 0 && int(code) < len(grpcNames) {
		return grpcNames[code]
	}
	return grpcNames[2]
}
