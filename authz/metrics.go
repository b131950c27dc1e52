package authz

import (
	"net/http"
	"net/netip"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/metrics"
)

// The metric families, as Linkerd's proxy names them, and inmesh's own
// concurrency family.
const (
	MetricAllow            = "inbound_http_authz_allow_total"
	MetricDeny             = "inbound_http_authz_deny_total"
	MetricRouteNotFound    = "inbound_http_route_not_found_total"
	MetricLocalRateLimit   = "inbound_http_local_ratelimit_total"
	MetricConcurrencyLimit = "inbound_http_concurrency_limit_total"
	// MetricPolicyUnavailable counts the requests the default Server
	// decided because the port's policy had not come from the Source
	// within the wait ([WithPolicyWait]), by target_port (inmesh's own).
	MetricPolicyUnavailable = "inbound_http_policy_unavailable_total"
)

type family uint8

const (
	famAllow family = iota
	famDeny
	famNotFound
	famRateLimit
	famConcurrency
	numFamilies
)

type instruments struct {
	sums        [numFamilies]*metrics.Sum
	unavailable *metrics.Counter
}

func newInstruments(meter metric.Meter) *instruments {
	in := &instruments{}
	in.sums[famAllow] = metrics.NewSum(meter, MetricAllow, "The total number of inbound HTTP requests that were authorized")
	in.sums[famDeny] = metrics.NewSum(meter, MetricDeny, "The total number of inbound HTTP requests that could not be authorized")
	in.sums[famNotFound] = metrics.NewSum(meter, MetricRouteNotFound, "The total number of inbound HTTP requests that could not be associated with a route")
	in.sums[famRateLimit] = metrics.NewSum(meter, MetricLocalRateLimit, "The total number of inbound HTTP requests that were rate-limited")
	in.sums[famConcurrency] = metrics.NewSum(meter, MetricConcurrencyLimit, "The total number of inbound HTTP requests refused because the Server's requests in flight were at its limit (inmesh's own)")
	in.unavailable = metrics.NewCounter(meter, MetricPolicyUnavailable, "The total number of inbound HTTP requests decided by the default policy because the port's policy had not come from the control plane within the wait (inmesh's own)")
	return in
}

// tlsState is the client's TLS as the tls label says it.
type tlsState uint8

const (
	tlsDisabled   tlsState = iota // no identity layer in front of the handler
	tlsTrue                       // mesh TLS terminated here
	tlsNoIdentity                 // plaintext from a remote client
	tlsLoopback                   // plaintext over loopback
)

// seriesKey identifies one series; its strings come from verified
// identities only.
type seriesKey struct {
	fam      family
	target   netip.AddrPort
	route    int
	authz    int
	scope    limitScope
	tls      tlsState
	clientID string
}

// maxCachedSeries bounds the series a policy remembers the labels of; past
// it the labels are built per request (the Sum still bounds the series).
const maxCachedSeries = 4096

// seriesCache maps the series of one port's policy to their counters.
type seriesCache struct {
	in      *instruments
	pol     *Policy
	nextFor func(*classify.Labels) http.Handler

	mu   sync.RWMutex
	m    map[seriesKey]*seriesEntry
	conn map[netip.AddrPort]*classify.Labels // ConnLabels, by target
}

// seriesEntry is one series' counter and, for an allowed request, the
// labels the inbound request and response metrics of the handlers after
// the Handler carry (see [WithMetricLabels]).
type seriesEntry struct {
	series *metrics.Series
	labels *classify.Labels
	next   http.Handler // the handler of an allowed request (WithLabelledNext)
}

func newSeriesCache(in *instruments, pol *Policy, nextFor func(*classify.Labels) http.Handler) *seriesCache {
	return &seriesCache{in: in, pol: pol, nextFor: nextFor, m: make(map[seriesKey]*seriesEntry)}
}

// add counts one request in k's series and returns its entry.
func (c *seriesCache) add(k seriesKey) *seriesEntry {
	c.mu.RLock()
	e := c.m[k]
	c.mu.RUnlock()
	if e == nil {
		kv := c.labels(k)
		e = &seriesEntry{series: c.in.sums[k.fam].Series(attribute.NewSet(kv...))}
		if k.fam == famAllow {
			e.labels = classify.LabelsOf(kv...)
			if c.nextFor != nil {
				e.next = c.nextFor(e.labels)
			}
		}
		c.mu.Lock()
		if len(c.m) < maxCachedSeries {
			c.m[k] = e
		}
		c.mu.Unlock()
	}
	e.series.Add()
	return e
}

// serverLabels are the labels of the policy's Server for requests and
// connections to target, as Linkerd's proxy writes them first
// (ServerLabels, InboundEndpointLabels): target_addr, target_ip and
// target_port, then srv_group, srv_kind, srv_name and srv_port.
func (c *seriesCache) serverLabels(target netip.AddrPort) []attribute.KeyValue {
	srv := c.pol.server.Meta
	return append(metrics.TargetLabels(target),
		attribute.String("srv_group", srv.Group),
		attribute.String("srv_kind", srv.Kind),
		attribute.String("srv_name", srv.Name),
		attribute.String("srv_port", strconv.Itoa(int(target.Port()))))
}

// connLabels returns the serverLabels of target as classify labels, made
// once per target (up to maxCachedSeries targets, then on each call).
func (c *seriesCache) connLabels(target netip.AddrPort) *classify.Labels {
	c.mu.RLock()
	l := c.conn[target]
	c.mu.RUnlock()
	if l != nil {
		return l
	}
	l = classify.LabelsOf(c.serverLabels(target)...)
	c.mu.Lock()
	if c.conn == nil {
		c.conn = make(map[netip.AddrPort]*classify.Labels, 1)
	}
	if len(c.conn) < maxCachedSeries {
		c.conn[target] = l
	}
	c.mu.Unlock()
	return l
}

func (c *seriesCache) labels(k seriesKey) []attribute.KeyValue {
	kv := c.serverLabels(k.target)
	if k.fam == famAllow || k.fam == famDeny {
		r := c.pol.routes[k.route].meta
		kv = append(kv,
			attribute.String("route_group", r.Group),
			attribute.String("route_kind", r.Kind),
			attribute.String("route_name", r.Name))
	}
	if k.fam == famAllow {
		a := c.pol.routes[k.route].authzs[k.authz].meta
		kv = append(kv,
			attribute.String("authz_group", a.Group),
			attribute.String("authz_kind", a.Kind),
			attribute.String("authz_name", a.Name))
	}
	if k.fam == famRateLimit {
		if m := c.pol.limiter.meta; m != (Meta{}) {
			kv = append(kv,
				attribute.String("ratelimit_group", m.Group),
				attribute.String("ratelimit_kind", m.Kind),
				attribute.String("ratelimit_name", m.Name))
		}
		scope := "identity"
		if k.scope == limitTotal {
			scope = "total"
		}
		kv = append(kv, attribute.String("ratelimit_scope", scope))
	}
	switch k.tls {
	case tlsTrue:
		kv = append(kv, attribute.String("tls", "true"), attribute.String("client_id", k.clientID))
	case tlsNoIdentity:
		kv = append(kv, attribute.String("tls", "no_identity"), attribute.String("no_tls_reason", "no_tls_from_remote"))
	case tlsLoopback:
		kv = append(kv, attribute.String("tls", "no_identity"), attribute.String("no_tls_reason", "loopback"))
	default:
		kv = append(kv, attribute.String("tls", "disabled"))
	}
	return kv
}
