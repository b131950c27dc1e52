package manifest

import (
	"github.com/inmesh/inmesh/hedge"
)

// The hedging annotations of HTTPRoutes, GRPCRoutes and ServiceProfiles
// (beyond Linkerd, in the style of retry.linkerd.io): a route with a
// delay hedges its requests that are safe to send twice. They are
// [hedge]'s; a ServiceProfile also takes [hedge.AnnotationRoutes].
const (
	// AnnotationHedgeDelay is the delay: a duration ("20ms") or a
	// percentile of the route's observed latency ("p95").
	AnnotationHedgeDelay = hedge.AnnotationDelay
	// AnnotationHedgeMaxExtraLoad is the share of requests that may be
	// hedged ("5%" or "0.05"; default 5%).
	AnnotationHedgeMaxExtraLoad = hedge.AnnotationMaxExtraLoad
	// AnnotationHedgeIdempotent marks every request of the route safe to
	// send twice ("true"), whatever its method.
	AnnotationHedgeIdempotent = hedge.AnnotationIdempotent
)

// hedgePolicy reads the hedging annotations: nil when no delay is set.
// The other two without a delay are an error: they would do nothing.
func hedgePolicy(a map[string]string) (*hedge.Policy, error) { return hedge.FromAnnotations(a) }
