package dashboard

import (
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/inmesh/inmesh/tap"
)

// maxRoutes bounds the route table; requests past it are counted under one
// "other" row, so that remote clients cannot grow it.
const maxRoutes = 500

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
}

type decisionKey struct{ route, client, decision string }

// table aggregates the events of a hub into the page's routes and
// decisions.
type table struct {
	now       func() time.Time
	mu        sync.Mutex
	routes    map[routeKey]*routeStats
	decisions map[decisionKey]uint64
}

func newTable(now func() time.Time) *table {
	return &table{now: now, routes: make(map[routeKey]*routeStats), decisions: make(map[decisionKey]uint64)}
}

func failed(e *tap.Event) bool {
	return e.Error != "" || e.Status >= 500 || e.Status == 0 || e.GRPCStatus > 0
}

func (t *table) observe(e *tap.Event) {
	k := routeKey{e.Direction, strings.ToLower(e.Authority), e.Route}
	sec := t.now().Unix()
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.routes[k]
	if s == nil {
		if len(t.routes) >= maxRoutes {
			k = routeKey{e.Direction, "other", ""}
			s = t.routes[k]
		}
		if s == nil {
			s = &routeStats{}
			t.routes[k] = s
		}
	}
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
		lat := slices.Clone(s.lat[:s.n])
		slices.Sort(lat)
		r.P50, r.P95, r.P99 = quantile(lat, 0.50), quantile(lat, 0.95), quantile(lat, 0.99)
		routes = append(routes, r)
	}
	decisions := make([]Decision, 0, len(t.decisions))
	for k, n := range t.decisions {
		decisions = append(decisions, Decision{Route: k.route, Client: k.client, Decision: k.decision, Count: n})
	}
	t.mu.Unlock()
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
