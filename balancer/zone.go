package balancer

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ZoneLabel is the endpoint label that names an endpoint's zone, as
// Linkerd's destination controller puts it in the metric labels of an
// address (and the registration, the endpoints file and the Pods'
// topology.kubernetes.io/zone set it in inmesh).
const ZoneLabel = "zone"

// Defaults of zone-aware balancing ([ZoneSpill]).
const (
	// DefaultZoneSpillHigh is the local-to-remote load ratio above which
	// requests start to leave the local zone.
	DefaultZoneSpillHigh = 2.0
	// DefaultZoneSpillLow is the ratio below which they come back.
	DefaultZoneSpillLow = 1.5
)

// ZoneSpill is the load band of zone-aware balancing, in the manner of
// HAZL's: High is the ratio of the local zone's load to the other zones'
// above which the share of requests sent out of the zone grows (0:
// [DefaultZoneSpillHigh]), Low the ratio below which it shrinks (0:
// [DefaultZoneSpillLow]); in between it holds. Low is at most High.
//
// The load of a zone is the lower median of its endpoints' costs as power
// of two choices weighs them (peak-EWMA RTT plus any load penalty, times
// its requests in flight plus one), an endpoint out of rotation (failure
// accrual) counting as infinitely slow: a zone is as slow as most of its
// endpoints, so one slow endpoint, or one slow answer, neither sends
// requests out of a healthy local zone nor draws them back into a slow
// one (power of two choices keeps requests away from that endpoint). The
// same statistic holds at home and away, so the band alone decides when
// requests leave and come back. See [WithLocalZone] for the rule.
type ZoneSpill struct {
	High float64
	Low  float64
}

// WithLocalZone makes the balancer zone-aware, zone being the zone of the
// process (empty: not zone-aware, every endpoint alike, as without it).
// An endpoint is in the local zone when its [ZoneLabel] label is zone.
//
// Requests go to the local zone's endpoints (power of two choices among
// them) while its load is healthy, and a share of them, drawn per
// request, to the other zones' endpoints (power of two choices among
// those), as the rule below sets it. Each request compares the zones'
// loads (recomputed at most once a millisecond): while the local zone's
// load is above High times the other zones', the share grows by 0.05
// times the ratio over High (at most 0.25) per request; while it is below
// Low times theirs, the share shrinks by 0.02 per request; in between it
// holds (the band is the hysteresis: no flapping between zones of about
// equal load). A local zone ten times slower than the others therefore
// sheds all of its traffic within a handful of requests; its estimates
// decay while it gets none (the peak-EWMA decay), so the share falls in
// time and the next requests home probe it: once most of its endpoints
// have answered slowly again, the share goes back up; recovered, traffic
// returns. In this comparison the estimates of other zones' endpoints
// that get no traffic fade toward the local zone's usual estimate (its median, followed ten times more slowly
// than the decay), not toward zero: an idle remote zone is taken to be as
// the local zone usually is, so a healthy local zone keeps its traffic
// however long the others go unasked, and a slowdown stands out. With no
// local endpoint in rotation every request leaves the zone; with none
// elsewhere every request stays.
//
// When every endpoint is in the local zone, or none is, the balancer
// balances as without a zone.
func WithLocalZone(zone string) Option {
	return optionFunc(func(c *config) { c.zone.local = zone })
}

// WithZoneSpill sets the load band of zone-aware balancing (default
// [DefaultZoneSpillHigh], [DefaultZoneSpillLow]); nil, or a value <= 0,
// keeps its default; a Low above High is High.
func WithZoneSpill(z *ZoneSpill) Option {
	return optionFunc(func(c *config) {
		if z == nil {
			return
		}
		if z.High > 0 {
			c.zone.high = z.High
		}
		if z.Low > 0 {
			c.zone.low = z.Low
		}
	})
}

// zoneConf is the zone configuration of a group: comparable.
type zoneConf struct {
	local     string
	high, low float64
}

// resolved is z with its defaults filled in.
func (z zoneConf) resolved() zoneConf {
	if z.local == "" {
		return zoneConf{}
	}
	if !(z.high > 0) {
		z.high = DefaultZoneSpillHigh
	}
	if !(z.low > 0) {
		z.low = DefaultZoneSpillLow
	}
	z.low = min(z.low, z.high)
	return z
}

// The localities of a member.
const (
	localityNone   int8 = iota // no zone-aware balancing
	localityLocal              // in the local zone
	localityRemote             // in another zone
)

func localityName(l int8) string {
	switch l {
	case localityLocal:
		return "local"
	case localityRemote:
		return "remote"
	}
	return ""
}

// The per-request steps of the spill share, and how often the zones'
// loads are recomputed (nanoseconds).
const (
	zoneUpStep   = 0.05
	zoneMaxUp    = 0.25
	zoneDownStep = 0.02
	zoneEvery    = int64(1e6)
	// zoneBaselineSlower: the local zone's baseline follows its estimate
	// this many times more slowly than the load's decay.
	zoneBaselineSlower = 10
)

// zoneSplit is a snapshot's endpoints by locality: two snapshots of their
// own (the same members), each balanced by power of two choices.
type zoneSplit struct {
	local, remote *snapshot
	conf          zoneConf
	state         *zoneState
	// filtered says that local and remote are without the endpoints a
	// request already tried (a hedge, a re-send): its pick follows the
	// spill share the whole zones set and moves nothing of the state.
	filtered bool
}

// splitZones partitions s's endpoints by zone when its group is
// zone-aware and both localities have endpoints; it sets each member's
// locality. It is called before s is published.
func (s *snapshot) splitZones() {
	if s.group == nil || s.group.conf.zone.local == "" || len(s.eps) == 0 {
		return
	}
	zc := s.group.conf.zone
	local := &snapshot{exists: true, health: s.health, group: s.group}
	remote := &snapshot{exists: true, health: s.health, group: s.group}
	for _, e := range s.eps {
		sub := remote
		e.locality = localityRemote
		if e.Labels[ZoneLabel] == zc.local {
			sub, e.locality = local, localityLocal
		}
		var total uint64
		if n := len(sub.cum); n > 0 {
			total = sub.cum[n-1]
		}
		sub.eps = append(sub.eps, e)
		sub.cum = append(sub.cum, total+uint64(max(e.Weight, 1)))
	}
	if len(local.eps) == 0 || len(remote.eps) == 0 {
		for _, e := range s.eps {
			e.locality = localityNone
		}
		return
	}
	s.zones = &zoneSplit{local: local, remote: remote, conf: zc, state: s.group.zone}
}

// zoneState is the spill controller of a group, kept across its
// snapshots.
type zoneState struct {
	mu    sync.Mutex
	share float64 // the share of requests sent out of the zone
	ratio float64 // the local zone's load over the others', at at
	at    int64
	// baseline is the local zone's usual estimate: its median estimate
	// followed slowly (zoneBaselineSlower times the load's decay), so
	// that a slowdown stands out against it. The other zones' unrefreshed
	// estimates fade toward it.
	baseline float64
	baseAt   int64
	costs    []float64 // scratch of ratio
	rtts     []float64
	shareA   atomic.Uint64 // share, as float64 bits, for readers without the lock
	ratioA   atomic.Uint64
	// picks by locality.
	local, remote atomic.Uint64
}

// choose is snapshot.choose for a zone-aware snapshot.
func (z *zoneSplit) choose(now int64, decay float64) (*member, bool) {
	var f float64
	if z.filtered {
		f = math.Float64frombits(z.state.shareA.Load())
	} else {
		f = z.step(now, decay)
	}
	first, second := z.local, z.remote
	if f > 0 && rand.Float64() < f {
		first, second = z.remote, z.local
	}
	e, probe := first.choose(now, decay)
	if e == nil {
		e, probe = second.choose(now, decay)
	}
	if e != nil {
		if e.locality == localityLocal {
			z.state.local.Add(1)
		} else {
			z.state.remote.Add(1)
		}
	}
	return e, probe
}

// step moves the spill share by one request's step and returns it.
func (z *zoneSplit) step(now int64, decay float64) float64 {
	st := z.state
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.at == 0 || now-st.at >= zoneEvery || now < st.at {
		st.ratio = z.ratio(st, now, decay)
		st.at = now
		st.ratioA.Store(math.Float64bits(st.ratio))
	}
	r := st.ratio
	switch {
	case r > z.conf.high:
		st.share = min(1, st.share+min(zoneMaxUp, zoneUpStep*r/z.conf.high))
	case r < z.conf.low:
		st.share = max(0, st.share-zoneDownStep)
	}
	st.shareA.Store(math.Float64bits(st.share))
	return st.share
}

// ratio is the local zone's load over the other zones' at now: +Inf when
// no local endpoint is in rotation, 0 when no other is.
func (z *zoneSplit) ratio(st *zoneState, now int64, decay float64) float64 {
	local, lr, localRTT := z.local.zoneLoad(now, decay, -1, &st.costs, &st.rtts)
	if st.baseAt == 0 {
		st.baseline = localRTT
	} else if dt := now - st.baseAt; dt > 0 {
		w := 1 - math.Exp(-float64(dt)/(zoneBaselineSlower*decay))
		st.baseline += (localRTT - st.baseline) * w
	}
	st.baseAt = now
	// The other zones' estimates fade toward the local zone's usual
	// estimate, not toward zero (they do fade to zero in the picks): a
	// zone that gets no requests has no news, so the longer it goes
	// unasked the more it is taken to be as the local zone usually is.
	// Faded to zero, an idle remote zone would look ever cheaper and draw
	// requests away from a healthy local zone under normal load.
	remote, rr, _ := z.remote.zoneLoad(now, decay, st.baseline, &st.costs, &st.rtts)
	switch {
	case rr == 0:
		return 0
	case lr == 0:
		return math.Inf(1)
	}
	return local / max(remote, 1)
}

// zoneLoad is the cost of a zone: the lower median of the costs of s's
// endpoints, an endpoint out of rotation (failure accrual) costing +Inf;
// with how many are in rotation, and the lower median of their estimates.
// With toward at zero or above, each estimate fades toward it instead of
// toward zero. costs and rtts are scratch space.
//
// The median: a zone is as slow as most of its endpoints, and power of
// two choices keeps a request away from the worst of them. One slow
// answer from one endpoint (a pause of the caller's own process looks the
// same) raises that endpoint's peak estimate several times over, and it
// holds for about the decay: in the mean of three it was enough to send
// requests out of a healthy local zone for seconds, or, out of another
// zone's endpoints, to draw the spilled requests back to a slow local
// zone. A zone's slowdown shows once most of its endpoints (two of three,
// three of four) have answered slowly; an endpoint out of rotation counts
// as slow (tripped by failure accrual or ejected by outlier detection),
// so that three endpoints of which one is tripped and one slow are a slow
// zone.
func (s *snapshot) zoneLoad(now int64, decay, toward float64, costs, rtts *[]float64) (float64, int, float64) {
	*costs, *rtts = (*costs)[:0], (*rtts)[:0]
	for _, e := range s.eps {
		l := e.load
		l.mu.Lock()
		out := s.health && (l.health.tripped || l.health.odEjected)
		est := l.estimateLocked(now, decay)
		if toward >= 0 {
			f := 1.0
			if dt := now - l.stamp; dt > 0 {
				f = math.Exp(-float64(dt) / decay)
			}
			est = l.rtt*f + toward*(1-f)
		}
		c := est
		l.mu.Unlock()
		if out {
			*costs = append(*costs, math.Inf(1))
			continue
		}
		*costs = append(*costs, c*float64(l.pending.Load()+1))
		*rtts = append(*rtts, est)
	}
	n := len(*rtts)
	if n == 0 {
		return 0, 0, 0
	}
	slices.Sort(*costs)
	slices.Sort(*rtts)
	return (*costs)[(len(*costs)-1)/2], n, (*rtts)[(n-1)/2]
}

// ZoneState is what zone-aware balancing knows of one endpoint set, for an
// admin page or a router's explanation. It marshals to JSON as is.
type ZoneState struct {
	// LocalZone is the zone of the process ([WithLocalZone]).
	LocalZone string `json:"localZone"`
	// Active says whether the set has endpoints both in the local zone
	// and elsewhere (else every endpoint is balanced alike).
	Active bool `json:"active"`
	// LocalEndpoints and RemoteEndpoints count the set's endpoints.
	LocalEndpoints  int `json:"localEndpoints"`
	RemoteEndpoints int `json:"remoteEndpoints"`
	// Spill is the share of requests sent out of the zone now, LoadRatio
	// the local zone's load over the others' when last computed.
	Spill     float64 `json:"spill"`
	LoadRatio float64 `json:"loadRatio"`
	// LocalRequests and RemoteRequests count the requests sent to each
	// locality under this configuration.
	LocalRequests  uint64 `json:"localRequests"`
	RemoteRequests uint64 `json:"remoteRequests"`
}

// zoneStateOf reports g's zone-aware balancing, nil when g is not
// zone-aware.
func zoneStateOf(g *group) *ZoneState {
	if g == nil || g.conf.zone.local == "" {
		return nil
	}
	s := g.state.Load()
	zs := &ZoneState{LocalZone: g.conf.zone.local}
	for _, e := range s.eps {
		if e.Labels[ZoneLabel] == zs.LocalZone {
			zs.LocalEndpoints++
		} else {
			zs.RemoteEndpoints++
		}
	}
	zs.Active = s.zones != nil
	st := g.zone
	zs.Spill = math.Float64frombits(st.shareA.Load())
	if r := math.Float64frombits(st.ratioA.Load()); !math.IsInf(r, 0) && !math.IsNaN(r) {
		zs.LoadRatio = r
	}
	zs.LocalRequests, zs.RemoteRequests = st.local.Load(), st.remote.Load()
	return zs
}

// Zone returns the zone-aware balancing of authority under the
// configuration of its latest request, nil when the Balancer is not
// zone-aware ([WithLocalZone]) or has no state for the authority.
func (b *Balancer) Zone(authority string) *ZoneState {
	a := b.findAuthority(authority)
	if a == nil {
		return nil
	}
	return zoneStateOf(a.current())
}

// ZoneWith is [Balancer.Zone] under the configuration c (nil: the
// balancer's options); nil as well when no request carried c yet.
func (b *Balancer) ZoneWith(authority string, c *BackendConfig) *ZoneState {
	a := b.findAuthority(authority)
	if a == nil {
		return nil
	}
	g := b.findGroup(a, c)
	if g == nil {
		return nil
	}
	return zoneStateOf(g)
}

// Zone returns the Pool's zone-aware balancing, nil when it is not
// zone-aware ([WithLocalZone]).
func (p *Pool) Zone() *ZoneState { return zoneStateOf(p.g) }

// zoneMetrics are the families of zone-aware balancing: the requests by
// the locality of their endpoint (zone_locality "local" or "remote", as
// Linkerd labels the locality of an address), and the share of requests
// sent out of the zone now.
type zoneMetrics struct {
	requests metric.Int64Counter
	spill    metric.Float64ObservableGauge
	local    attribute.KeyValue
	remote   attribute.KeyValue
}

func newZoneMetrics(meter metric.Meter) zoneMetrics {
	z := zoneMetrics{local: attribute.String("zone_locality", "local"), remote: attribute.String("zone_locality", "remote")}
	var err error
	z.requests, err = meter.Int64Counter("outbound_http_balancer_zone_requests_total",
		metric.WithDescription("The total number of requests the balancer sent, by the locality of their endpoint's zone (zone-aware balancing)."))
	if err != nil {
		otel.Handle(err)
	}
	z.spill, err = meter.Float64ObservableGauge("outbound_http_balancer_zone_spill_ratio",
		metric.WithDescription("The share of requests zone-aware balancing sends out of the local zone now."))
	if err != nil {
		otel.Handle(err)
	}
	return z
}

func (z zoneMetrics) observables() []metric.Observable {
	if z.spill == nil {
		return nil
	}
	return []metric.Observable{z.spill}
}

// observe reports the spill share of g, when it is zone-aware.
func (z zoneMetrics) observe(o metric.Observer, g *group, am *authMetrics) {
	if z.spill == nil || g.conf.zone.local == "" {
		return
	}
	o.ObserveFloat64(z.spill, math.Float64frombits(g.zone.shareA.Load()), am.obs())
}

// zoned counts a request sent to an endpoint of locality l.
func (m *balMetrics) zoned(a *authority, ctx context.Context, l int8) {
	if m.zone.requests == nil {
		return
	}
	am := m.of(a)
	kv := m.zone.remote
	if l == localityLocal {
		kv = m.zone.local
	}
	set := am.zoneSet(kv)
	m.zone.requests.Add(ctx, 1, metric.WithAttributeSet(set))
}

// zoneSet is am's label set with kv (a zone_locality), made once.
func (am *authMetrics) zoneSet(kv attribute.KeyValue) attribute.Set {
	i := 0
	if kv.Value.AsString() == "remote" {
		i = 1
	}
	if s := am.zone[i].Load(); s != nil {
		return *s
	}
	s := withAttr(am.set, kv)
	am.zone[i].Store(&s)
	return s
}
