package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// stats is what the table shows of a route, or of a backend of a route.
type stats struct {
	requests, success, timeouts, retries float64
	buckets                              []uint64
	bounds                               []float64
}

func (s *stats) observe(p metricdata.HistogramDataPoint[float64]) {
	if s.buckets == nil {
		s.buckets, s.bounds = make([]uint64, len(p.BucketCounts)), p.Bounds
	}
	for i, c := range p.BucketCounts {
		s.buckets[i] += c
	}
}

// routeStats is a route's row and its backends' rows.
type routeStats struct {
	stats
	backends map[string]*stats
}

// outbound computes the rows of `linkerd viz stat-outbound` from the
// outbound_grpc_route_* series: per route, from the logical calls
// (request_statuses_total, request_duration_seconds), the success rate
// (grpc_status OK and no error), the timeouts (error REQUEST_TIMEOUT or
// RESPONSE_HEADERS_TIMEOUT) and the retries (retry_requests_total); per
// backend of a route, the same of each attempt
// (backend_response_statuses_total, backend_response_duration_seconds).
func outbound(rm metricdata.ResourceMetrics) map[string]*routeStats {
	routes := map[string]*routeStats{}
	route := func(attrs attribute.Set) *routeStats {
		v, _ := attrs.Value("route_name")
		r := routes[v.AsString()]
		if r == nil {
			r = &routeStats{backends: map[string]*stats{}}
			routes[v.AsString()] = r
		}
		return r
	}
	backend := func(attrs attribute.Set) *stats {
		r := route(attrs)
		name, _ := attrs.Value("backend_name")
		port, _ := attrs.Value("backend_port")
		key := name.AsString() + ":" + port.AsString()
		if r.backends[key] == nil {
			r.backends[key] = &stats{}
		}
		return r.backends[key]
	}
	count := func(s *stats, attrs attribute.Set, n float64) {
		s.requests += n
		code, _ := attrs.Value("grpc_status")
		errv, _ := attrs.Value("error")
		if code.AsString() == "OK" && errv.AsString() == "" {
			s.success += n
		}
		if e := errv.AsString(); e == "REQUEST_TIMEOUT" || e == "RESPONSE_HEADERS_TIMEOUT" {
			s.timeouts += n
		}
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					switch m.Name {
					case "outbound_grpc_route_request_statuses_total":
						count(&route(p.Attributes).stats, p.Attributes, float64(p.Value))
					case "outbound_grpc_route_retry_requests_total":
						route(p.Attributes).retries += float64(p.Value)
					case "outbound_grpc_route_backend_response_statuses_total":
						count(backend(p.Attributes), p.Attributes, float64(p.Value))
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					switch m.Name {
					case "outbound_grpc_route_request_duration_seconds":
						route(p.Attributes).observe(p)
					case "outbound_grpc_route_backend_response_duration_seconds":
						backend(p.Attributes).observe(p)
					}
				}
			}
		}
	}
	return routes
}

// printOutbound prints the routes' rows as `linkerd viz stat-outbound`
// does, over the window d: success rate, requests per second, latency
// percentiles (interpolated in the histogram's buckets, as Prometheus's
// histogram_quantile does), the share of calls that timed out, and the
// retry rate, retries/(requests+retries). A backend's row counts each
// attempt.
func printOutbound(out io.Writer, routes map[string]*routeStats, d time.Duration) {
	names := make([]string, 0, len(routes))
	for n := range routes {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(out, "%-16s %-15s %8s %10s %11s %11s %11s %9s %8s\n",
		"ROUTE", "BACKEND", "SUCCESS", "RPS", "LATENCY_P50", "LATENCY_P95", "LATENCY_P99", "TIMEOUTS", "RETRIES")
	for _, n := range names {
		r := routes[n]
		if r.requests == 0 {
			continue
		}
		fmt.Fprintf(out, "%-16s %-15s %s %9s\n", n, "", row(&r.stats, d), percent(r.retries, r.requests+r.retries))
		backends := make([]string, 0, len(r.backends))
		for b := range r.backends {
			backends = append(backends, b)
		}
		sort.Strings(backends)
		for _, b := range backends {
			fmt.Fprintf(out, "%-16s %-15s %s %9s\n", "└─►", b, row(r.backends[b], d), "-")
		}
	}
}

func row(s *stats, d time.Duration) string {
	return fmt.Sprintf("%8s %7.1frps %11s %11s %11s %9s", percent(s.success, s.requests), s.requests/d.Seconds(),
		millis(quantile(0.5, s)), millis(quantile(0.95, s)), millis(quantile(0.99, s)), percent(s.timeouts, s.requests))
}

func percent(n, of float64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", 100*n/of)
}

func millis(seconds float64) string {
	if math.IsNaN(seconds) {
		return "-"
	}
	return fmt.Sprintf("%.0fms", 1000*seconds)
}

// quantile estimates quantile q from s's buckets by linear interpolation
// inside the bucket that holds it; in the +Inf bucket, the last bound.
func quantile(q float64, s *stats) float64 {
	var total uint64
	for _, c := range s.buckets {
		total += c
	}
	if total == 0 {
		return math.NaN()
	}
	rank := q * float64(total)
	var seen uint64
	for i, c := range s.buckets {
		if float64(seen+c) >= rank && c > 0 {
			if i == len(s.bounds) {
				return s.bounds[i-1]
			}
			lo := 0.0
			if i > 0 {
				lo = s.bounds[i-1]
			}
			return lo + (s.bounds[i]-lo)*(rank-float64(seen))/float64(c)
		}
		seen += c
	}
	return s.bounds[len(s.bounds)-1]
}
