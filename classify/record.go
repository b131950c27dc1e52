package classify

import (
	"strings"
	"sync/atomic"

	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/registry"
	"go.opentelemetry.io/otel/attribute"
)

// recorder maps a request's authority and extra labels to a metric target.
// Authorities live in a registry (bounded, idle-released); the authority
// label values come from a bounded set, past which requests are labelled
// authority="other".
type recorder struct {
	fam       *metrics.Family
	direction attribute.KeyValue
	labels    *registry.Names
	reg       *registry.Registry[authTargets]
	other     atomic.Pointer[authTargets]
	only      []hostPort // WithAuthorities, normalised; nil: any
}

// hostPort is an authority of WithAuthorities: its host in lower case
// without a trailing dot, and its port.
type hostPort struct{ host, port string }

// authTargets is the immutable snapshot of one authority: its label value
// and the targets built for it so far, by their labels.
type authTargets struct {
	authority string
	overflow  bool // recorded under other
	// targets are at most maxTargetsPerAuthority, nearly always one: a
	// list costs a fraction of a map's memory for each of thousands of
	// authorities, and finds one of so few as fast.
	targets []keyedTarget
}

// keyedTarget is a target and its labels (nil: none).
type keyedTarget struct {
	labels *Labels
	t      *metrics.Target
}

// target returns the target of labels l, nil when there is none.
func (a *authTargets) target(l *Labels) *metrics.Target {
	for i := range a.targets {
		if a.targets[i].labels.Equal(l) {
			return a.targets[i].t
		}
	}
	return nil
}

// snapshot is where an authTargets lives: a registry entry, or the other
// pointer.
type snapshot interface {
	Load() *authTargets
	CompareAndSwap(old, new *authTargets) bool
}

const otherAuthority = "other"

// maxTargetsPerAuthority bounds the label sets kept per authority; past
// it, targets are built and not kept.
const maxTargetsPerAuthority = 16

var overflowTargets = &authTargets{overflow: true}

func newRecorder(cfg config, direction string) *recorder {
	meter := metrics.Meter(cfg.mp, ScopeName)
	r := &recorder{
		fam:       metrics.NewFamily(meter, "", true),
		direction: attribute.String("direction", direction),
		labels:    registry.NewNames(cfg.maxAuthorities),
	}
	r.reg = registry.New(r.newState, nil, registry.WithMaxEntries(cfg.maxAuthorities),
		registry.WithIdleTimeout(cfg.idleTimeout))
	for _, a := range cfg.only {
		if n, err := r.reg.Normalize(a); err == nil {
			host, port := splitAuthority(n)
			r.only = append(r.only, hostPort{host, port})
		}
	}
	if len(cfg.only) > 0 && r.only == nil {
		r.only = []hostPort{} // none valid: no authority is admitted
	}
	// other always keeps its target without labels: see target.
	r.other.Store(&authTargets{authority: otherAuthority, targets: []keyedTarget{
		{nil, metrics.NewTarget(r.fam, attribute.String("authority", otherAuthority), r.direction)},
	}})
	return r
}

func (r *recorder) newState(authority string) *authTargets {
	if !r.labels.Admit(authority) {
		return overflowTargets
	}
	return &authTargets{authority: authority}
}

func (r *recorder) target(authority string, l *Labels) *metrics.Target {
	if r.admits(authority) {
		if e := r.reg.Get(authority); e != nil {
			if st := e.Load(); !st.overflow {
				return r.targetIn(e, st, l)
			}
		}
	}
	st := r.other.Load()
	if l != nil && st.target(l) == nil && len(st.targets) >= maxTargetsPerAuthority {
		// Past the bound of authorities, their labels are bounded too:
		// the endpoint labels of names never labelled (dst_service
		// among them) would otherwise give each name series of its own
		// under other, kept for the life of the process.
		l = nil
	}
	return r.targetIn(&r.other, st, l)
}

// admits reports whether authority may have a label value of its own
// (WithAuthorities). It allocates nothing: an admitted spelling is in the
// registry's cache once seen, and any other is compared in place.
func (r *recorder) admits(authority string) bool {
	if r.only == nil || r.reg.Cached(authority) != nil {
		return true
	}
	host, port := splitAuthority(authority)
	if port == "" {
		port = registry.DefaultPort
	}
	host = strings.TrimSuffix(host, ".")
	for _, o := range r.only {
		if o.port == port && strings.EqualFold(o.host, host) {
			return true
		}
	}
	return false
}

// splitAuthority splits host[:port] (an IPv6 host in brackets) without
// allocating; port is "" when there is none.
func splitAuthority(a string) (host, port string) {
	if i := strings.LastIndexByte(a, ':'); i >= 0 && i > strings.LastIndexByte(a, ']') {
		host, port = a[:i], a[i+1:]
	} else {
		host = a
	}
	if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	return host, port
}

// targetIn returns the target of l in the snapshot at p, adding it when
// there is room.
func (r *recorder) targetIn(p snapshot, st *authTargets, l *Labels) *metrics.Target {
	if t := st.target(l); t != nil {
		return t
	}
	own := []attribute.KeyValue{attribute.String("authority", st.authority), r.direction}
	if l.Unnamed() {
		own = own[1:]
	}
	// The target keeps l's labels as they are, not a copy in a set of
	// its own: the balancer holds them for the endpoint anyway, for
	// each endpoint of each of thousands of authorities.
	t := metrics.NewTargetsWith(own, l.KeyValues(), r.fam)[0]
	for len(st.targets) < maxTargetsPerAuthority {
		next := &authTargets{authority: st.authority,
			targets: append(st.targets[:len(st.targets):len(st.targets)], keyedTarget{l, t})}
		if p.CompareAndSwap(st, next) {
			break
		}
		if st = p.Load(); st.target(l) != nil {
			return st.target(l)
		}
	}
	// Past the bound the target is still recorded into, and not kept.
	return t
}

func response(status int, c Class) metrics.Response {
	return metrics.Response{Status: status, Failure: c.Failure, GRPC: c.GRPCStatusLabel(), Err: c.Error}
}
