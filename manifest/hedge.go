package manifest

import (
	"github.com/inmesh/inmesh/hedge"
)

// The hedging annotations of HTTPRoutes, GRPCRoutes and ServiceProfiles
// (beyond Linkerd, in the style of retry.linkerd.io): a route with a
// delay hedges its requests that are safe to send twice.
const (
	// AnnotationHedgeDelay is the delay: a duration ("20ms") or a
	// percentile of the route's observed latency ("p95").
	AnnotationHedgeDelay = "hedge.inmesh.io/delay"
	// AnnotationHedgeMaxExtraLoad is the share of requests that may be
	// hedged ("5%" or "0.05"; default 5%).
	AnnotationHedgeMaxExtraLoad = "hedge.inmesh.io/max-extra-load"
	// AnnotationHedgeIdempotent marks every request of the route safe to
	// send twice ("true"), whatever its method.
	AnnotationHedgeIdempotent = "hedge.inmesh.io/idempotent"
)

// hedgePolicy reads the hedging annotations: nil when no delay is set.
// The other two without a delay are an error: they would do nothing.
func hedgePolicy(a map[string]string) (*hedge.Policy, error) {
	delay, hasDelay := a[AnnotationHedgeDelay]
	load, hasLoad := a[AnnotationHedgeMaxExtraLoad]
	idem, hasIdem := a[AnnotationHedgeIdempotent]
	if !hasDelay {
		switch {
		case hasLoad:
			return nil, annotationErr(AnnotationHedgeMaxExtraLoad, "needs %s", AnnotationHedgeDelay)
		case hasIdem:
			return nil, annotationErr(AnnotationHedgeIdempotent, "needs %s", AnnotationHedgeDelay)
		}
		return nil, nil
	}
	p := &hedge.Policy{}
	var err error
	if p.Delay, p.Percentile, err = hedge.ParseDelay(delay); err != nil {
		return nil, annotationErr(AnnotationHedgeDelay, "%v", err)
	}
	if hasLoad {
		if p.MaxExtraLoad, err = hedge.ParseMaxExtraLoad(load); err != nil {
			return nil, annotationErr(AnnotationHedgeMaxExtraLoad, "%v", err)
		}
	}
	if hasIdem {
		if p.Idempotent, err = hedge.ParseBool(idem); err != nil {
			return nil, annotationErr(AnnotationHedgeIdempotent, "%v", err)
		}
	}
	return p, nil
}
