package hedge

import (
	"fmt"
	"strings"
)

// The hedging annotations (beyond Linkerd, in the style of
// retry.linkerd.io), which HTTPRoutes, GRPCRoutes and ServiceProfiles
// carry in metadata.annotations: a route with a delay hedges its requests
// that are safe to send twice.
const (
	// AnnotationDelay is the delay: a duration ("20ms") or a percentile
	// of the route's observed latency ("p95").
	AnnotationDelay = "hedge.inmesh.io/delay"
	// AnnotationMaxExtraLoad is the share of requests that may be hedged
	// ("5%" or "0.05"; default 5%).
	AnnotationMaxExtraLoad = "hedge.inmesh.io/max-extra-load"
	// AnnotationIdempotent marks every request of the route safe to send
	// twice ("true"), whatever its method.
	AnnotationIdempotent = "hedge.inmesh.io/idempotent"
	// AnnotationRoutes, on a ServiceProfile only, names the routes that
	// hedge (their spec.routes[].name, separated by commas or new lines);
	// without it every route of the profile does.
	AnnotationRoutes = "hedge.inmesh.io/routes"
)

// FromAnnotations reads the hedging annotations of a resource: nil when no
// delay is set. A share or an idempotent mark without a delay is an error:
// it would do nothing. Errors name the annotation, as in
// "metadata.annotations.hedge.inmesh.io/delay: ...".
func FromAnnotations(a map[string]string) (*Policy, error) {
	delay, hasDelay := a[AnnotationDelay]
	load, hasLoad := a[AnnotationMaxExtraLoad]
	idem, hasIdem := a[AnnotationIdempotent]
	if !hasDelay {
		switch {
		case hasLoad:
			return nil, AnnotationError(AnnotationMaxExtraLoad, "needs %s", AnnotationDelay)
		case hasIdem:
			return nil, AnnotationError(AnnotationIdempotent, "needs %s", AnnotationDelay)
		}
		return nil, nil
	}
	p := &Policy{}
	var err error
	if p.Delay, p.Percentile, err = ParseDelay(delay); err != nil {
		return nil, AnnotationError(AnnotationDelay, "%v", err)
	}
	if hasLoad {
		if p.MaxExtraLoad, err = ParseMaxExtraLoad(load); err != nil {
			return nil, AnnotationError(AnnotationMaxExtraLoad, "%v", err)
		}
	}
	if hasIdem {
		if p.Idempotent, err = ParseBool(idem); err != nil {
			return nil, AnnotationError(AnnotationIdempotent, "%v", err)
		}
	}
	return p, nil
}

// RouteNames reads the value of [AnnotationRoutes]: route names separated
// by commas or new lines, blanks trimmed. An empty list, or a name given
// twice, is an error naming the annotation.
func RouteNames(v string) ([]string, error) {
	var names []string
	seen := make(map[string]bool)
	for _, line := range strings.Split(v, "\n") {
		for _, name := range strings.Split(line, ",") {
			name = strings.TrimSpace(name)
			if name == "" {
				continue
			}
			if seen[name] {
				return nil, AnnotationError(AnnotationRoutes, "route %q is named twice", name)
			}
			seen[name] = true
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil, AnnotationError(AnnotationRoutes, "names no route (route names separated by commas)")
	}
	return names, nil
}

// AnnotationError is an error about annotation key, named as a field of
// the resource ("metadata.annotations.<key>: ...").
func AnnotationError(key, format string, args ...any) error {
	return fmt.Errorf("metadata.annotations.%s: %s", key, fmt.Sprintf(format, args...))
}
