package metrics

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The result label values of outbound_http_route_mirror_requests_total.
const (
	// MirrorSuccess: the mirror answered with a status below 500 (a
	// gRPC mirror: with the status OK).
	MirrorSuccess = "success"
	// MirrorFailure: the mirror failed (no response, a 5xx, or a gRPC
	// status other than OK).
	MirrorFailure = "failure"
	// MirrorDropped: the route's mirrors in flight were at their bound,
	// so the copy was not sent.
	MirrorDropped = "dropped"
	// MirrorBodyTooLarge: the request body was larger than the copy's
	// bound, so the copy was not sent.
	MirrorBodyTooLarge = "body_too_large"
	// MirrorBodyIncomplete: the request body did not arrive whole (an
	// error, or the request ended before it did), so the copy was not
	// sent.
	MirrorBodyIncomplete = "body_incomplete"
	// MirrorUnavailable: the mirror's last copy could not be sent (no
	// connection), and its backoff has not ended, so the copy was not
	// sent.
	MirrorUnavailable = "unavailable"
)

var mirrorResults = [...]string{MirrorSuccess, MirrorFailure, MirrorDropped, MirrorBodyTooLarge, MirrorBodyIncomplete, MirrorUnavailable}

// Mirrors is the outbound_http_route_mirror_requests_total family (or
// the outbound_grpc_route_ one): the copies of requests a route's
// RequestMirror filters were to send, by result. It is safe for
// concurrent use.
type Mirrors struct {
	requests *Sum
}

// NewMirrors creates the family of HTTP routes on meter, or with grpc the
// one of gRPC routes (one per meter and name, shared).
func NewMirrors(meter metric.Meter, grpc bool) *Mirrors {
	name := "outbound_http_route_mirror_requests_total"
	if grpc {
		name = "outbound_grpc_route_mirror_requests_total"
	}
	return &Mirrors{requests: NewSum(meter, name,
		"Mirrored requests (copies sent to a RequestMirror backend, responses discarded), by result.")}
}

// MirrorTarget is the series of one mirror backend of one route: the
// parent, route and backend label groups, and each result.
type MirrorTarget struct {
	series [len(mirrorResults)]*Series
}

// Target returns the series of the mirror backend with labels backend
// (the backend_* group) of route target rt.
func (m *Mirrors) Target(rt *RouteTarget, backend ...attribute.KeyValue) *MirrorTarget {
	t := &MirrorTarget{}
	base := append(rt.base[:len(rt.base):len(rt.base)], backend...)
	for i, r := range mirrorResults {
		kvs := append(base[:len(base):len(base)], attribute.String("result", r))
		t.series[i] = m.requests.Series(attribute.NewSet(kvs...))
	}
	return t
}

// Count counts one copy with result, one of the Mirror* values; another
// value counts nothing.
func (t *MirrorTarget) Count(result string) {
	for i, r := range mirrorResults {
		if r == result {
			t.series[i].Add()
			return
		}
	}
}
