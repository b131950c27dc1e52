package dashboard

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/tap"
)

// maxRoutes bounds the route table; requests past it are counted under one
// "other" row per direction, so that remote clients cannot grow it. A full
// table makes room for a new row by folding into other the row idle the
// longest, once it has been idle for rowIdle: a burst of made-up
// authorities cannot keep a service's own row out for longer.
const (
	maxRoutes = 500
	rowIdle   = 60 // seconds
)

// maxDecisions bounds the inbound decision table the same way.
const maxDecisions = 500

// window is the span of the request rate, and samples the latencies kept
// per route for the percentiles.
const (
	window  = 10 // seconds
	samples = 512
)

type routeKey struct{ direction, authority, route string }

type routeStats struct {
	requests, failures, retries, hedges uint64
	// seconds holds the requests of each of the last window seconds, at
	// second%window; stamp is the second each slot holds.
	seconds [window]uint32
	stamp   [window]int64
	lat     [samples]float64
	n       int // latencies recorded, capped at samples for the ring
	next    int
	last    int64 // the second of the last request
}

const otherAuthority = "other"

// tableAuthority is the authority of an event as the table keys it: host:port
// in lower case (port 80 when it names none), or other for a Host that is
// not one, so that a key is at most a DNS name long whatever a client
// sends.
func tableAuthority(a string) string {
	if n, err := authority.NormalizeDefaultPort(a, "80"); err == nil {
		return n
	}
	return otherAuthority
}

type decisionKey struct{ route, client, decision string }

// table aggregates the events of a hub into the page's routes and
// decisions.
type table struct {
	now       func() time.Time
	mu        sync.Mutex
	routes    map[routeKey]*routeStats
	decisions map[decisionKey]uint64
	// keys maps the keys of events, as they come, to the table's keys, so
	// that an event of a known spelling costs no normalisation; bounded by
	// maxKeys, and only for spellings no longer than a DNS name.
	keys map[routeKey]routeKey
	// scanned is the second of the last search for an idle row: a full
	// table searches at most once a second.
	scanned int64
}

const maxKeys = 2 * maxRoutes

func newTable(now func() time.Time) *table {
	return &table{now: now, routes: make(map[routeKey]*routeStats), decisions: make(map[decisionKey]uint64),
		keys: make(map[routeKey]routeKey)}
}

func failed(e *tap.Event) bool {
	return e.Error != "" || e.Status >= 500 || e.Status == 0 || e.GRPCStatus > 0
}

// keyLocked is the table's key of an event's key. The caller holds t.mu.
func (t *table) keyLocked(raw routeKey) routeKey {
	if k, ok := t.keys[raw]; ok {
		return k
	}
	k := routeKey{raw.direction, tableAuthority(raw.authority), raw.route}
	if k.authority == otherAuthority {
		k.route = ""
	}
	if len(raw.authority) <= 260 && len(raw.route) <= 260 {
		if len(t.keys) >= maxKeys {
			clear(t.keys)
		}
		t.keys[raw] = k
	}
	return k
}

func (t *table) observe(e *tap.Event) {
	sec := t.now().Unix()
	t.mu.Lock()
	defer t.mu.Unlock()
	k := t.keyLocked(routeKey{e.Direction, e.Authority, e.Route})
	s := t.routes[k]
	if s == nil {
		if k.authority != otherAuthority && len(t.routes) >= maxRoutes && !t.evictIdleLocked(sec) {
			k = routeKey{e.Direction, otherAuthority, ""}
			s = t.routes[k]
		}
		if s == nil {
			s = &routeStats{}
			t.routes[k] = s
		}
	}
	s.last = sec
	s.requests++
	if failed(e) {
		s.failures++
	}
	s.retries += uint64(e.Retries)
	s.hedges += uint64(e.Hedges)
	i := sec % window
	if s.stamp[i] != sec {
		s.stamp[i], s.seconds[i] = sec, 0
	}
	s.seconds[i]++
	s.lat[s.next] = e.LatencyMillis
	s.next = (s.next + 1) % samples
	if s.n < samples {
		s.n++
	}
	if e.Direction == "inbound" && e.Decision != "" {
		d := decisionKey{e.Route, e.ClientID, e.Decision}
		if _, ok := t.decisions[d]; !ok && len(t.decisions) >= maxDecisions {
			d = decisionKey{"other", "", e.Decision}
		}
		t.decisions[d]++
	}
}

// evictIdleLocked folds the row idle the longest into its direction's
// other row when it has been idle for rowIdle at sec, and reports whether
// it did; it searches at most once a second. The caller holds t.mu.
func (t *table) evictIdleLocked(sec int64) bool {
	if t.scanned == sec {
		return false
	}
	t.scanned = sec
	var oldest routeKey
	var os *routeStats
	for k, s := range t.routes {
		if k.authority != otherAuthority && (os == nil || s.last < os.last) {
			oldest, os = k, s
		}
	}
	if os == nil || sec-os.last < rowIdle {
		return false
	}
	delete(t.routes, oldest)
	ok := routeKey{oldest.direction, otherAuthority, ""}
	o := t.routes[ok]
	if o == nil {
		o = &routeStats{}
		t.routes[ok] = o
	}
	o.requests += os.requests
	o.failures += os.failures
	o.retries += os.retries
	o.hedges += os.hedges
	o.last = max(o.last, os.last)
	return true
}

// Route is one row of the route table.
type Route struct {
	Direction string `json:"direction"`
	Authority string `json:"authority"`
	Route     string `json:"route"`
	Requests  uint64 `json:"requests"`
	Failures  uint64 `json:"failures"`
	Retries   uint64 `json:"retries"`
	Hedges    uint64 `json:"hedges"`
	// SuccessRate is the share of requests that succeeded, over all time.
	SuccessRate float64 `json:"successRate"`
	// RPS is the request rate over the last ten seconds.
	RPS float64 `json:"rps"`
	// P50, P95 and P99 are latency percentiles, in milliseconds, over the
	// route's last 512 requests.
	P50 float64 `json:"p50Millis"`
	P95 float64 `json:"p95Millis"`
	P99 float64 `json:"p99Millis"`
}

// Decision is one row of the inbound policy's decisions.
type Decision struct {
	Route    string `json:"route"`
	Client   string `json:"client"`
	Decision string `json:"decision"`
	Count    uint64 `json:"count"`
}

func (t *table) snapshot() ([]Route, []Decision) {
	sec := t.now().Unix()
	t.mu.Lock()
	routes := make([]Route, 0, len(t.routes))
	lats := make([][]float64, 0, len(t.routes))
	for k, s := range t.routes {
		r := Route{Direction: k.direction, Authority: k.authority, Route: k.route, Requests: s.requests, Failures: s.failures, Retries: s.retries, Hedges: s.hedges}
		if s.requests > 0 {
			r.SuccessRate = float64(s.requests-s.failures) / float64(s.requests)
		}
		var recent uint32
		for i := range window {
			if sec-s.stamp[i] < window && s.stamp[i] <= sec {
				recent += s.seconds[i]
			}
		}
		r.RPS = float64(recent) / window
		routes = append(routes, r)
		lats = append(lats, slices.Clone(s.lat[:s.n]))
	}
	decisions := make([]Decision, 0, len(t.decisions))
	for k, n := range t.decisions {
		decisions = append(decisions, Decision{Route: k.route, Client: k.client, Decision: k.decision, Count: n})
	}
	t.mu.Unlock()
	// The percentiles are computed off the lock, which requests take.
	for i, lat := range lats {
		slices.Sort(lat)
		routes[i].P50, routes[i].P95, routes[i].P99 = quantile(lat, 0.50), quantile(lat, 0.95), quantile(lat, 0.99)
	}
	sort.Slice(routes, func(i, j int) bool {
		a, b := routes[i], routes[j]
		if a.Direction != b.Direction {
			return a.Direction > b.Direction // outbound first
		}
		if a.Authority != b.Authority {
			return a.Authority < b.Authority
		}
		return a.Route < b.Route
	})
	sort.Slice(decisions, func(i, j int) bool {
		a, b := decisions[i], decisions[j]
		if a.Route != b.Route {
			return a.Route < b.Route
		}
		if a.Client != b.Client {
			return a.Client < b.Client
		}
		return a.Decision < b.Decision
	})
	return routes, decisions
}

// quantile returns the q-quantile of sorted (nearest rank), 0 when empty.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}
