package balancer

import (
	"context"
	"net"
	"strings"
	"sync/atomic"

	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/registry"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The balancer's families carry Linkerd's parent and backend label groups.
// Without a control plane that names the parent, they come from the
// authority: "name.ns.svc.<zone>:port" is the Service name in ns on port
// (parent_group "core", parent_kind "Service", the backend the same
// Service); any other authority gets the fixed values parent_kind
// "default", parent_name "unknown", empty namespace and port.
//
// Series outlive the authorities that made them (an SDK with cumulative
// temporality keeps every series it has seen), so the Services labelled
// are bounded for the life of the Balancer, not by the authorities it
// keeps at once: the first [WithMaxAuthorities] distinct Services get
// labels of their own, and any later one is counted under parent_kind
// "Service", parent_name "other" and no namespace (see otherLabels); the
// gauges of the authorities that share a label set are their sum. Without
// that bound a proxy that sees ever new Service names would keep a label
// set, and each family's series of it, for every name it ever saw.
const scope = "github.com/inmesh/inmesh/balancer"

// queueLatencyBuckets are the bounds of queue_latency_seconds.
var queueLatencyBuckets = []float64{0.0005, 0.005, 0.05, 0.5, 1, 3}

type balMetrics struct {
	updates   metric.Int64Counter
	requests  *metrics.Sum
	latency   metric.Float64Histogram
	gateOpen  metric.Int64Counter
	gateShut  metric.Int64Counter
	failfasts metric.Int64Counter
	zone      zoneMetrics
	reg       metric.Registration // the gauges' callback, nil when none
	unknown   *authLabels         // the labels of every authority that is not a Service's
	services  *registry.Names     // the Services labelled, for the life of the Balancer
	overflow  *authLabels         // the labels of every Service past services' bound (otherLabels)
}

// close stops the gauges' callback, so that a closed Balancer is no
// longer reported nor held by the provider.
func (m *balMetrics) close() {
	if m.reg != nil {
		_ = m.reg.Unregister()
	}
}

// authMetrics is the label set of one authority and its gate state.
type authMetrics struct {
	*authLabels
	shut atomic.Bool
	zone [2]atomic.Pointer[attribute.Set] // the label sets by zone locality, made on first use
}

// authLabels is one label set with its options, immutable. Every
// authority that is not a Service's name shares one (the fixed
// "default"/"unknown" labels), so that a flood of such Hosts does not
// keep a copy of the same dozen labels for each.
//
// The options are arrays of one, in the struct, rather than slices: two
// allocations less for each of thousands of Services.
type authLabels struct {
	set      attribute.Set
	add      [1]metric.AddOption
	rec      [1]metric.RecordOption
	requests *metrics.Series
}

func (m *balMetrics) newLabels(kvs []attribute.KeyValue) *authLabels {
	set := attribute.NewSet(kvs...)
	// One option serves as both kinds.
	opt := metric.WithAttributeSet(set)
	return &authLabels{set: set, add: [1]metric.AddOption{opt}, rec: [1]metric.RecordOption{opt},
		requests: m.requests.Series(set)}
}

func newBalMetrics(b *Balancer) *balMetrics {
	meter := metrics.Meter(b.cfg.meter, scope)
	m := &balMetrics{}
	var err error
	handle := func(e error) {
		if e != nil {
			otel.Handle(e)
		}
	}
	m.updates, err = meter.Int64Counter("outbound_http_balancer_p2c_updates_total", metric.WithDescription("The total number of balancer endpoint updates, by operation."))
	handle(err)
	m.requests = metrics.NewSum(meter, "outbound_http_balancer_queue_requests_total", "The total number of requests through the balancer queue.")
	kvs, _ := labelsOf("")
	m.unknown = m.newLabels(kvs)
	m.services = registry.NewNames(b.cfg.maxAuthorities)
	m.overflow = m.newLabels(otherLabels())
	m.latency, err = meter.Float64Histogram("outbound_http_balancer_queue_latency_seconds", metric.WithDescription("The time requests wait in the balancer queue."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(queueLatencyBuckets...))
	handle(err)
	m.gateOpen, err = meter.Int64Counter("outbound_http_balancer_queue_gate_open_total", metric.WithDescription("The number of times the queue left failfast: an endpoint was ready again."))
	handle(err)
	m.gateShut, err = meter.Int64Counter("outbound_http_balancer_queue_gate_shut_total", metric.WithDescription("The number of times the queue entered failfast: no endpoint was ready within the failfast timeout."))
	handle(err)
	m.failfasts, err = meter.Int64Counter("outbound_http_balancer_queue_gate_timeout_total", metric.WithDescription("The number of requests that failed fast after the failfast timeout."))
	handle(err)
	m.zone = newZoneMetrics(meter)
	endpoints, err := meter.Int64ObservableGauge("outbound_http_balancer_endpoints", metric.WithDescription("The number of endpoints, by state: ready, or pending (tripped)."))
	handle(err)
	p2c, err := meter.Int64ObservableGauge("outbound_http_balancer_p2c_endpoints", metric.WithDescription("The number of endpoints the balancer picks among."))
	handle(err)
	qlen, err := meter.Int64ObservableGauge("outbound_http_balancer_queue_length", metric.WithDescription("The number of requests waiting in the balancer queue."))
	handle(err)
	timeout, err := meter.Float64ObservableGauge("outbound_http_balancer_queue_gate_timeout_seconds", metric.WithDescription("The failfast timeout of the balancer queue."), metric.WithUnit("s"))
	handle(err)
	if endpoints == nil || p2c == nil || qlen == nil || timeout == nil {
		return m
	}
	ready := attribute.String("endpoint_state", "ready")
	pending := attribute.String("endpoint_state", "pending")
	// gauges are the figures of one label set.
	type gauges struct {
		ready, pending, eps, queued int64
		timeout                     float64
	}
	observe := func(o metric.Observer, set attribute.Set, v gauges) {
		o.ObserveInt64(endpoints, v.ready, metric.WithAttributeSet(withAttr(set, ready)))
		o.ObserveInt64(endpoints, v.pending, metric.WithAttributeSet(withAttr(set, pending)))
		o.ObserveInt64(p2c, v.eps, metric.WithAttributeSet(set))
		o.ObserveInt64(qlen, v.queued, metric.WithAttributeSet(set))
		o.ObserveFloat64(timeout, v.timeout, metric.WithAttributeSet(set))
	}
	m.reg, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		now := b.cfg.now()
		// The authorities that share a label set (the non-Service
		// ones, the Services past the bound) are summed and observed
		// once: a gauge keeps only the last value observed for a set.
		var shared map[*authLabels]*gauges
		b.table.each(func(a *authority) {
			g := a.current()
			s := g.state.Load()
			if s.wait != nil || s.err != nil {
				return
			}
			var queued int64
			a.each(func(g *group) { queued += g.queued.Load() })
			am := b.metrics.of(a)
			r := int64(s.countAvailable(now))
			v := gauges{ready: r, pending: int64(len(s.eps)) - r, eps: int64(len(s.eps)), queued: queued, timeout: g.conf.failfast.Seconds()}
			if am.authLabels == m.unknown || am.authLabels == m.overflow {
				if shared == nil {
					shared = make(map[*authLabels]*gauges, 2)
				}
				sum := shared[am.authLabels]
				if sum == nil {
					sum = &gauges{}
					shared[am.authLabels] = sum
				}
				*sum = gauges{sum.ready + v.ready, sum.pending + v.pending, sum.eps + v.eps, sum.queued + v.queued, max(sum.timeout, v.timeout)}
				return
			}
			observe(o, am.set, v)
			m.zone.observe(o, g, am)
		})
		for l, v := range shared {
			observe(o, l.set, *v)
		}
		return nil
	}, append([]metric.Observable{endpoints, p2c, qlen, timeout}, m.zone.observables()...)...)
	handle(err)
	return m
}

func (am *authMetrics) obs() metric.ObserveOption { return metric.WithAttributeSet(am.set) }

func withAttr(s attribute.Set, kv attribute.KeyValue) attribute.Set {
	return attribute.NewSet(append(s.ToSlice(), kv)...)
}

// of returns a's label set, made on first use.
func (m *balMetrics) of(a *authority) *authMetrics {
	if am := a.metrics.Load(); am != nil {
		return am
	}
	kvs, service := labelsOf(a.name)
	labels := m.unknown
	if service != "" {
		labels = m.overflow
		if m.services.Admit(service) {
			labels = m.newLabels(kvs)
		}
	}
	am := &authMetrics{authLabels: labels}
	if a.metrics.CompareAndSwap(nil, am) {
		return am
	}
	return a.metrics.Load()
}

// otherLabels are the parent and backend labels of every Service past the
// bound: parent_kind "Service" and parent_name "other" with no namespace,
// which no Service has, as the router and classify name what they count
// past their bounds "other".
func otherLabels() []attribute.KeyValue {
	return serviceLabels("core", "Service", "", "other", "")
}

// labelsOf returns the parent and backend labels of an authority, and the
// Service they name as "namespace/name:port" (two authorities of one
// Service name the same), "" for the fixed default ones.
func labelsOf(authority string) ([]attribute.KeyValue, string) {
	if host, p, err := net.SplitHostPort(authority); err == nil {
		if parts := strings.Split(host, "."); len(parts) >= 3 && parts[2] == "svc" && parts[0] != "" && parts[1] != "" {
			return serviceLabels("core", "Service", parts[1], parts[0], p), parts[1] + "/" + parts[0] + ":" + p
		}
	}
	return serviceLabels("", "default", "", "unknown", ""), ""
}

// serviceLabels are the parent and backend labels of one parent, its own
// backend.
func serviceLabels(group, kind, ns, name, port string) []attribute.KeyValue {
	// The keys are constants, not made per call: a set keeps its keys,
	// and there is one set for each of thousands of Services.
	return []attribute.KeyValue{
		attribute.String("parent_group", group), attribute.String("parent_kind", kind),
		attribute.String("parent_namespace", ns), attribute.String("parent_name", name),
		attribute.String("parent_port", port), attribute.String("parent_section_name", ""),
		attribute.String("backend_group", group), attribute.String("backend_kind", kind),
		attribute.String("backend_namespace", ns), attribute.String("backend_name", name),
		attribute.String("backend_port", port), attribute.String("backend_section_name", ""),
	}
}

// update counts one endpoint update of a: Reset for the first set,
// DoesNotExist for a service that does not exist, else Add and Remove for
// the endpoints that came and went.
func (m *balMetrics) update(a *authority, prev, next *snapshot) {
	if next.err != nil {
		return
	}
	am := m.of(a)
	ctx := context.Background()
	op := func(name string) {
		m.updates.Add(ctx, 1, metric.WithAttributeSet(withAttr(am.set, attribute.String("op", name))))
	}
	switch {
	case !next.exists:
		op("DoesNotExist")
		return
	case prev.wait != nil || !prev.exists:
		op("Reset")
		return
	}
	old := make(map[string]bool, len(prev.eps))
	for _, e := range prev.eps {
		old[e.addr] = true
	}
	added := false
	for _, e := range next.eps {
		if !old[e.addr] {
			added = true
		}
		delete(old, e.addr)
	}
	if added {
		op("Add")
	}
	if len(old) > 0 {
		op("Remove")
	}
}

// dequeued counts a request that got an endpoint after waiting d
// nanoseconds (0: at once).
func (m *balMetrics) dequeued(a *authority, ctx context.Context, d int64) {
	am := m.of(a)
	am.requests.Add()
	m.latency.Record(ctx, float64(max(d, 0))/1e9, am.rec[:]...)
}

// gate records the queue of a opening (leaving failfast: an endpoint is
// ready again) or shutting (entering failfast: none was ready within the
// failfast timeout).
func (m *balMetrics) gate(a *authority, ctx context.Context, open bool) {
	am := m.of(a)
	if am.shut.CompareAndSwap(open, !open) {
		if open {
			m.gateOpen.Add(ctx, 1, am.add[:]...)
		} else {
			m.gateShut.Add(ctx, 1, am.add[:]...)
		}
	}
}

// failfast counts a request that failed fast.
func (m *balMetrics) failfast(a *authority, ctx context.Context) {
	am := m.of(a)
	am.requests.Add()
	m.failfasts.Add(ctx, 1, am.add[:]...)
}
