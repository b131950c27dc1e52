package metrics

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
)

// Hedges is the outbound_{http,grpc}_route_hedge_* family set, in the
// style of the retry_* families: hedges sent, won, and refused by the
// share of extra load or the retry budget. It is safe for concurrent use.
type Hedges struct {
	requests, wins, overflow metric.Int64Counter
}

// NewHedges creates the outbound_http_route_hedge_ families, or with grpc
// the outbound_grpc_route_hedge_ ones. Errors go to otel.Handle.
func NewHedges(meter metric.Meter, grpc bool) *Hedges {
	p := "outbound_http_route_"
	if grpc {
		p = "outbound_grpc_route_"
	}
	return newHedges(meter, p)
}

// NewProfileHedges creates the route_hedge_ families of ServiceProfile
// routes, beside route_retryable_total (direction, dst and rt_* labels).
func NewProfileHedges(meter metric.Meter) *Hedges { return newHedges(meter, "route_") }

func newHedges(meter metric.Meter, p string) *Hedges {
	counter := func(name, help string) metric.Int64Counter {
		c, err := meter.Int64Counter(p+name, metric.WithDescription(help))
		if err != nil {
			otel.Handle(err)
		}
		return c
	}
	return &Hedges{
		requests: counter("hedge_requests_total", "Hedge requests emitted (second copies sent to another endpoint)."),
		wins:     counter("hedge_wins_total", "Hedge requests whose response was the one delivered."),
		overflow: counter("hedge_overflow_total", "Hedges not sent due to the route's share of extra load or the retry budget."),
	}
}

// HedgeTarget is one route's hedge series, with the route target's parent
// and route labels.
type HedgeTarget struct {
	h    *Hedges
	opts []metric.AddOption
}

// Target returns the hedge series of route target rt.
func (h *Hedges) Target(rt *RouteTarget) *HedgeTarget { return &HedgeTarget{h: h, opts: rt.opts} }

// TargetWith returns the hedge series with the labels opts (from [Opts]).
func (h *Hedges) TargetWith(opts []metric.AddOption) *HedgeTarget {
	return &HedgeTarget{h: h, opts: opts}
}

// Sent counts a hedge sent, Won one that won, Overflow one not sent.
func (t *HedgeTarget) Sent(ctx context.Context) { t.h.requests.Add(ctx, 1, t.opts...) }

// Won: see [HedgeTarget.Sent].
func (t *HedgeTarget) Won(ctx context.Context) { t.h.wins.Add(ctx, 1, t.opts...) }

// Overflow: see [HedgeTarget.Sent].
func (t *HedgeTarget) Overflow(ctx context.Context) { t.h.overflow.Add(ctx, 1, t.opts...) }
