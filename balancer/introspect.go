package balancer

import (
	"encoding/json"
	"net/http"
	"time"
)

// EndpointState is what the Balancer knows of one endpoint, for an admin
// page or a router's explanation. It marshals to JSON as is.
type EndpointState struct {
	Addr   string `json:"addr"`
	Weight uint32 `json:"weight"`
	// State is "ready", "tripped" (out of rotation until Until),
	// "probation" (its penalty ended: the next pick probes it, or the
	// probe is out), "ejected" (an outlier, out of rotation until Until
	// or the first check of outlier detection after it).
	State string     `json:"state"`
	Until *time.Time `json:"until,omitempty"`
	// Penalty is the current failure-accrual penalty (0 when ready).
	Penalty time.Duration `json:"penalty_ns"`
	// ConsecutiveFailures and SuccessRate are the accrual's counts (the
	// rate only in unified mode).
	ConsecutiveFailures int     `json:"consecutive_failures"`
	SuccessRate         float64 `json:"success_rate,omitempty"`
	// LoadSeconds is the peak-EWMA RTT estimate, load penalties (of
	// responses that signal overload, see [PenaltyPeakEWMA]) included;
	// Pending the requests in flight.
	LoadSeconds float64 `json:"load_seconds"`
	Pending     int64   `json:"pending"`
	// Identity is the TLS identity the endpoint must present; empty when
	// the source gives none.
	Identity string `json:"identity,omitempty"`
	// Zone is the endpoint's zone (its zone label), Locality "local" or
	// "remote" under zone-aware balancing ([WithLocalZone]).
	Zone     string `json:"zone,omitempty"`
	Locality string `json:"locality,omitempty"`
	// Ejections is the outlier-detection ejection count that multiplies
	// the base ejection time (it drops by one each interval in rotation).
	Ejections int `json:"ejections,omitempty"`
}

// Endpoints returns the state of each endpoint of authority (host:port, as
// requests name it), in address order, under the configuration of the
// authority's latest request (see [BackendConfig]); nil when the Balancer has no
// endpoints for it (never asked, no answer yet, or past its bound). It
// starts no watch.
func (b *Balancer) Endpoints(authority string) []EndpointState {
	a := b.findAuthority(authority)
	if a == nil {
		return nil
	}
	return b.endpointStates(a.current())
}

// EndpointsWith is [Balancer.Endpoints] under the configuration c
// ([WithBackendConfig]; nil: the balancer's options). Under a
// configuration no request carried yet, every endpoint is ready, with no
// load but the default RTT.
func (b *Balancer) EndpointsWith(authority string, c *BackendConfig) []EndpointState {
	a := b.findAuthority(authority)
	if a == nil {
		return nil
	}
	g := b.findGroup(a, c)
	if g == nil {
		g = newGroup(newGroupConf(b.keyOf(c))) // what the first request under c will make
		g.state.Store(a.def.state.Load().fork(g, b.rtt, b.cfg.now()))
	}
	return b.endpointStates(g)
}

func (b *Balancer) findAuthority(authority string) *authority {
	name, err := normalize(authority)
	if err != nil {
		return nil
	}
	return b.table.find(name)
}

func (b *Balancer) endpointStates(g *group) []EndpointState {
	s := g.state.Load()
	now := b.cfg.now()
	wall := time.Now()
	out := make([]EndpointState, 0, len(s.eps))
	for _, e := range s.eps {
		st := EndpointState{Addr: e.addr, Weight: e.Weight, Pending: e.load.pending.Load(), Identity: e.Identity,
			Zone: e.Labels[ZoneLabel], Locality: localityName(e.locality)}
		l := e.load
		l.mu.Lock()
		h := l.health
		st.LoadSeconds = l.estimateLocked(now, b.decay) / 1e9
		l.mu.Unlock()
		st.ConsecutiveFailures = h.failures
		if acc := g.conf.acc; acc != nil && acc.unified && h.requests > 0 {
			st.SuccessRate = h.rate
		}
		until := func(t int64) *time.Time {
			w := wall.Add(time.Duration(t - now))
			return &w
		}
		st.Ejections = h.odMult
		switch {
		case h.odEjected && g.conf.od != nil:
			st.State, st.Until = stateEjected, until(g.conf.od.ejectionEnd(h.odAt, h.odMult))
		case h.tripped && (h.probing || now >= h.until):
			st.State, st.Penalty = stateProbation, time.Duration(h.penalty)
		case h.tripped:
			st.State, st.Penalty, st.Until = stateTripped, time.Duration(h.penalty), until(h.until)
		default:
			st.State = stateReady
		}
		out = append(out, st)
	}
	return out
}

// EndpointsHandler serves [Balancer.Endpoints] as JSON for the authority
// of the query parameter "authority" (host:port, or a host on port 80): 400
// without one or for one that is not an authority, 404 when the Balancer
// has no endpoints for it. It is meant for an admin listener; it starts
// no watch, so a caller cannot grow the Balancer's state.
func (b *Balancer) EndpointsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authority := r.URL.Query().Get("authority")
		if authority == "" {
			http.Error(w, "missing query parameter authority", http.StatusBadRequest)
			return
		}
		if _, err := normalize(authority); err != nil {
			http.Error(w, "authority: "+err.Error(), http.StatusBadRequest)
			return
		}
		eps := b.Endpoints(authority)
		if eps == nil {
			http.Error(w, "no endpoints known for "+authority, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(eps)
	})
}
