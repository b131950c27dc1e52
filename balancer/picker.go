package balancer

import (
	"math/rand/v2"
	"sort"
	"sync/atomic"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/metrics"
	"go.opentelemetry.io/otel/attribute"
)

// member is one endpoint in a snapshot: its description, what a request
// needs from it, and its load, shared with the snapshots before and after
// for as long as the endpoint stays.
type member struct {
	endpoint.Endpoint
	addr   string
	labels *classify.Labels
	// trace are its span attributes (meshtrace.EndpointAttrs), built on
	// its first traced request.
	trace atomic.Pointer[[]attribute.KeyValue]
	load  *load
	g     *group // the configuration's balancing it is in, nil outside a Balancer
	// ref counts the requests in flight to its address, nil when the
	// Balancer counts nothing (see addrs).
	ref *addrRef
	// locality: in the local zone or not, under zone-aware balancing.
	locality int8
}

func (e *member) group() *group { return e.g }

// traced returns the span attributes of e, building them on first use:
// most processes trace nothing, or few of their requests.
func (e *member) traced() []attribute.KeyValue {
	if t := e.trace.Load(); t != nil {
		return *t
	}
	t := meshtrace.EndpointAttrs(e.addr, e.Labels["zone"], e.Identity)
	e.trace.CompareAndSwap(nil, &t)
	return *e.trace.Load()
}

// snapshot is everything a pick reads about one authority's endpoints. It
// is immutable once published.
type snapshot struct {
	// wait is non-nil until the first answer; it is closed when a snapshot
	// with an answer replaces this one.
	wait   chan struct{}
	err    error // no set: the source cannot resolve the authority
	exists bool
	eps    []*member
	cum    []uint64 // cum[i]: the weights of eps[:i+1]
	// health says whether picks check the endpoints' health (failure
	// accrual or load penalties are on); group is the configuration's
	// balancing the snapshot belongs to.
	health bool
	group  *group
	zones  *zoneSplit // zone-aware balancing, nil without
}

// oneSnapshot is the snapshot of one endpoint with its member and their
// lists in one allocation: most authorities have one endpoint, and a
// proxy holds thousands of them.
type oneSnapshot struct {
	snapshot
	m   member
	eps [1]*member
	cum [1]uint64
}

// newSnapshot builds the snapshot of u, the endpoints of authority,
// keeping the loads of the endpoints of prev that stay.
func newSnapshot(u endpoint.Update, prev *snapshot, defaultRTT float64, now int64, meshTLS bool, authority string) *snapshot {
	var s *snapshot
	var one *oneSnapshot
	if u.Set != nil && len(u.Set.Endpoints) == 1 {
		one = &oneSnapshot{}
		s = &one.snapshot
		s.eps, s.cum = one.eps[:0], one.cum[:0]
	} else {
		s = &snapshot{}
	}
	s.err, s.health, s.group = u.Err, prev.health, prev.group
	if u.Set == nil {
		return s
	}
	s.exists = u.Set.Exists
	old := make(map[string]*member, len(prev.eps))
	for _, e := range prev.eps {
		old[e.addr] = e
	}
	var total uint64
	for _, e := range u.Set.Endpoints {
		var ep *member
		if one != nil {
			ep = &one.m
		} else {
			ep = new(member)
		}
		ep.Endpoint, ep.addr, ep.g = e, e.Addr.String(), prev.group
		if o := old[ep.addr]; o != nil {
			ep.load, ep.ref = o.load, o.ref
		} else {
			ep.load = newLoad(defaultRTT, now)
		}
		ep.labels = endpointLabels(e, meshTLS).ForAuthority(authority)
		total += uint64(max(e.Weight, 1))
		s.eps = append(s.eps, ep)
		s.cum = append(s.cum, total)
	}
	s.splitZones()
	return s
}

// endpointLabels are the metric labels of the requests to e, as Linkerd's
// outbound endpoint labels: its own as dst_*, its address as target_addr,
// target_ip and target_port, and Linkerd's tls labels: tls="true" with
// server_id when the endpoint is reached over mTLS (it has an identity and
// the stack one of its own), tls="no_identity" with
// no_tls_reason="not_provided_by_service_discovery" when discovery gave it
// none, tls="disabled" when the stack has no identity.
func endpointLabels(e endpoint.Endpoint, meshTLS bool) *classify.Labels {
	m := make(map[string]string, len(e.Labels)+5)
	for k, v := range e.Labels {
		m["dst_"+k] = v
	}
	if e.Addr.IsValid() {
		for _, kv := range metrics.TargetLabels(e.Addr) {
			m[string(kv.Key)] = kv.Value.AsString()
		}
	}
	switch {
	case !meshTLS:
		m["tls"] = "disabled"
	case e.Identity != "":
		m["tls"], m["server_id"] = "true", e.Identity
	default:
		m["tls"], m["no_tls_reason"] = "no_identity", "not_provided_by_service_discovery"
	}
	return classify.NewLabels("", m)
}

// fork returns the snapshot of the same answer for g: the same endpoints,
// each with a load of its own, new.
func (s *snapshot) fork(g *group, defaultRTT float64, now int64) *snapshot {
	ns := &snapshot{err: s.err, exists: s.exists, cum: s.cum, health: g.conf.health(), group: g}
	if s.wait != nil {
		ns.wait = make(chan struct{})
	}
	if len(s.eps) > 0 {
		ns.eps = make([]*member, len(s.eps))
		for i, e := range s.eps {
			ep := &member{Endpoint: e.Endpoint, addr: e.addr, labels: e.labels, load: newLoad(defaultRTT, now), g: g, locality: e.locality, ref: e.ref}
			if t := e.trace.Load(); t != nil {
				ep.trace.Store(t)
			}
			ns.eps[i] = ep
		}
	}
	ns.splitZones()
	return ns
}

// clearlyLower is how much lower the second draw's cost must be for it to
// win: between endpoints of about equal load, the first draw (by weight)
// wins, so that weights decide the share; a real difference in load
// (requests in flight, a slow or failing endpoint) decides otherwise.
const clearlyLower = 0.75

// pick draws two different endpoints at random by weight and returns the
// first unless the second's cost is clearly lower (power of two choices).
func (s *snapshot) pick(now int64, decay float64) *member {
	e, _ := s.choose(now, decay)
	return e
}

// draws is how many times a pick draws again when it draws an endpoint
// out of rotation, before it looks through them all.
const draws = 4

// choose is pick among the endpoints in rotation: nil when none is. An
// endpoint on probation that a draw meets is chosen at once for its probe
// (probe true).
func (s *snapshot) choose(now int64, decay float64) (e *member, probe bool) {
	if s.zones != nil {
		return s.zones.choose(now, decay)
	}
	switch len(s.eps) {
	case 0:
		return nil, false
	case 1:
		ok, probe := s.available(s.eps[0], now)
		if !ok {
			return nil, false
		}
		return s.eps[0], probe
	}
	total := s.cum[len(s.cum)-1]
	i := -1
	for range draws {
		j := s.find(rand.Uint64N(total))
		ok, probe := s.available(s.eps[j], now)
		if probe {
			return s.eps[j], true
		}
		if ok {
			i = j
			break
		}
	}
	if i < 0 {
		start := rand.IntN(len(s.eps))
		for k := range s.eps {
			j := (start + k) % len(s.eps)
			ok, probe := s.available(s.eps[j], now)
			if ok {
				return s.eps[j], probe // the only candidates are rare: no second draw
			}
		}
		return nil, false
	}
	// The second draw leaves the first endpoint's weight out.
	wi := uint64(max(s.eps[i].Weight, 1))
	if total == wi {
		return s.eps[i], false
	}
	a := s.eps[i]
	for range draws {
		n := rand.Uint64N(total - wi)
		if n >= s.cum[i]-wi {
			n += wi
		}
		b := s.eps[s.find(n)]
		ok, probe := s.available(b, now)
		if probe {
			return b, true
		}
		if !ok {
			continue
		}
		if b.load.cost(now, decay) < clearlyLower*a.load.cost(now, decay) {
			return b, false
		}
		return a, false
	}
	return a, false
}

// available reports whether e may be picked at now, claiming its probe when
// it is on probation.
func (s *snapshot) available(e *member, now int64) (ok, probe bool) {
	if !s.health {
		return true, false
	}
	e.load.mu.Lock()
	defer e.load.mu.Unlock()
	return e.load.health.availableLocked(now)
}

// countReady returns how many endpoints of s are not tripped.
func (s *snapshot) countReady() int {
	n := 0
	for _, e := range s.eps {
		e.load.mu.Lock()
		if h := &e.load.health; !h.tripped && !h.odEjected {
			n++
		}
		e.load.mu.Unlock()
	}
	return n
}

// find returns the endpoint whose weight interval holds n.
func (s *snapshot) find(n uint64) int {
	return sort.Search(len(s.cum), func(i int) bool { return s.cum[i] > n })
}

// countAvailable returns how many endpoints of s a pick may choose at now
// (not tripped; one on probation counts once its penalty
// ended and its probe is not out).
func (s *snapshot) countAvailable(now int64) int {
	n := 0
	for _, e := range s.eps {
		e.load.mu.Lock()
		h := &e.load.health
		if !h.odEjected && (!h.tripped || (!h.probing && now >= h.until)) {
			n++
		}
		e.load.mu.Unlock()
	}
	return n
}
