package classify

import (
	"sync"

	"github.com/inmesh/inmesh/internal/metrics"
	"go.opentelemetry.io/otel/attribute"
	"golang.org/x/net/http/httpguts"
)

// recorder maps a request's authority and extra labels to a metric target,
// with a bound on distinct authorities.
type recorder struct {
	fam       *metrics.Family
	direction attribute.KeyValue
	max       int

	mu      sync.RWMutex
	targets map[targetKey]*metrics.Target
	hosts   map[string]struct{}
}

type targetKey struct {
	authority string
	labels    string // Labels.key
}

func newRecorder(cfg config, direction string) *recorder {
	meter := metrics.Meter(cfg.mp, ScopeName)
	return &recorder{
		fam:       metrics.NewFamily(meter, "", true),
		direction: attribute.String("direction", direction),
		max:       cfg.maxAuthorities,
		targets:   make(map[targetKey]*metrics.Target),
		hosts:     make(map[string]struct{}),
	}
}

const otherAuthority = "other"

// maxTargetsPerAuthority bounds the cache at this many label sets per
// authority on average; past it, targets are built and not kept.
const maxTargetsPerAuthority = 16

func (r *recorder) target(authority string, l *Labels) *metrics.Target {
	key := targetKey{authority: authority}
	if l != nil {
		key.labels = l.key
	}
	r.mu.RLock()
	t := r.targets[key]
	r.mu.RUnlock()
	if t != nil {
		return t
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if t = r.targets[key]; t != nil {
		return t
	}
	if _, known := r.hosts[authority]; !known {
		if len(r.hosts) >= r.max || authority == "" || !httpguts.ValidHostHeader(authority) {
			key.authority = otherAuthority
			if t = r.targets[key]; t != nil {
				return t
			}
		} else {
			r.hosts[authority] = struct{}{}
		}
	}
	kvs := []attribute.KeyValue{attribute.String("authority", key.authority), r.direction}
	if l != nil {
		kvs = append(kvs, l.kvs...)
	}
	t = metrics.NewTarget(r.fam, kvs...)
	// Requests past the bounds are still recorded, under a target that is
	// not kept, so that the map stays bounded.
	if len(r.targets) < maxTargetsPerAuthority*(r.max+1) {
		r.targets[key] = t
	}
	return t
}

func response(status int, c Class) metrics.Response {
	return metrics.Response{Status: status, Failure: c.Failure, GRPC: c.GRPCStatus, Err: c.Error}
}
