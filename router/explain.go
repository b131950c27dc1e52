package router

import (
	"net/http"
	"strconv"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router/internal/profileroute"
)

// The models an [Explanation] names.
const (
	ModelProfile = "serviceprofile"
	ModelPolicy  = "policy"
	ModelDefault = "default"
)

// Explanation says how the router would route a request. It marshals to
// JSON.
type Explanation struct {
	// Authority is the authority the request is routed by.
	Authority string `json:"authority"`
	// Model is the table that applies: ModelProfile, ModelPolicy or
	// ModelDefault (neither: the request goes on unchanged).
	Model string `json:"model"`
	// Reason says why that model applies.
	Reason string `json:"reason"`
	// Route names the chosen route; empty for the default route.
	Route string `json:"route,omitempty"`
	// RouteKind is the route's kind (HTTPRoute, GRPCRoute, default) on the
	// policy path.
	RouteKind string `json:"routeKind,omitempty"`
	// Match describes the match that won, RunnerUp the best match of
	// another rule (policy: best match), or Index the profile route's
	// position (first match).
	Match    string `json:"match,omitempty"`
	RunnerUp string `json:"runnerUp,omitempty"`
	Index    *int   `json:"index,omitempty"`
	// Filters, Backends, Timeouts and Retry are what applies to the
	// request.
	Filters  []string      `json:"filters,omitempty"`
	Backends *BackendsInfo `json:"backends,omitempty"`
	Timeouts TimeoutsInfo  `json:"timeouts"`
	Retry    *RetryInfo    `json:"retry,omitempty"`
	// Budget is the state of the retry budget that applies, if any.
	Budget *profiles.BudgetState `json:"budget,omitempty"`
	// Hedge is the route's hedging, if it hedges.
	Hedge *HedgeInfo `json:"hedge,omitempty"`
	// Mirrors are the route's request mirrors, if any.
	Mirrors *MirrorsInfo `json:"mirrors,omitempty"`
}

// BackendsInfo is a route's distribution.
type BackendsInfo struct {
	Distribution string        `json:"distribution"`
	Backends     []BackendInfo `json:"backends"`
}

// BackendInfo is one backend of a distribution.
type BackendInfo struct {
	Name    string   `json:"name"`
	Kind    string   `json:"kind"`
	Target  string   `json:"target"` // the balancer's authority or the forward address
	Weight  uint32   `json:"weight,omitempty"`
	Filters []string `json:"filters,omitempty"`
	// FailureAccrual names the breaker of a balancer backend's endpoints
	// ("consecutive", "unified"), empty for the balancer's own.
	FailureAccrual string `json:"failureAccrual,omitempty"`
	// OutlierDetection explains the ejection of a balancer backend's
	// outlier endpoints (success rate, failure percentage), empty for none.
	OutlierDetection string `json:"outlierDetection,omitempty"`
	// With [WithBalancer]: Ready says whether the backend can take a
	// request now, Endpoints the state of each of its endpoints (ready,
	// tripped until when, on probation, load and penalty).
	Ready     *bool                    `json:"ready,omitempty"`
	Endpoints []balancer.EndpointState `json:"endpoints,omitempty"`
	// Zone is the backend's zone-aware balancing (the local zone, the
	// share of requests sent out of it, the requests by locality), when
	// the balancer is zone-aware (balancer.WithLocalZone).
	Zone *balancer.ZoneState `json:"zone,omitempty"`
}

// TimeoutsInfo are the timeouts of a route, as Go durations; empty means
// none.
type TimeoutsInfo struct {
	Request  string `json:"request,omitempty"`
	Response string `json:"response,omitempty"`
	Idle     string `json:"idle,omitempty"`
}

// RetryInfo is the retry policy of a route.
type RetryInfo struct {
	// Kind is "budget" (profiles) or "counted" (policies).
	Kind            string   `json:"kind"`
	MaxRetries      int      `json:"maxRetries,omitempty"`
	MaxRequestBytes int64    `json:"maxRequestBytes"`
	Statuses        []string `json:"statuses,omitempty"`
	GRPCCodes       []string `json:"grpcCodes,omitempty"`
	Timeout         string   `json:"timeout,omitempty"`
	Backoff         string   `json:"backoff,omitempty"`
	// AllowL5dRequestHeaders says whether l5d-* request headers may
	// override the retry and timeouts.
	AllowL5dRequestHeaders bool `json:"allowL5dRequestHeaders,omitempty"`
}

func dur(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return d.String()
}

// Explain says how r would route req, without sending it. Like a request,
// it starts the watches of an unseen authority (and then reports the
// default route until they deliver).
func (r *Router) Explain(req *http.Request) Explanation {
	e := Explanation{Authority: requestKey(req)}
	if a, err := r.normalize(e.Authority); err == nil {
		e.Authority = a
	}
	prof := r.outProfiles()
	if prof != nil {
		if v := prof.Resolve(req); v.Applies() {
			explainProfile(&e, v, req)
			e.Reason = "the ServiceProfile has routes or destination overrides, so it takes precedence"
			return e
		}
	}
	ps := r.policyFor(req)
	if ps == nil || ps.table == nil {
		e.Model = ModelDefault
		switch {
		case r.cfg.policies == nil && prof == nil:
			e.Reason = "the router has no profile or policy source"
		case r.cfg.policies == nil:
			e.Reason = "no ServiceProfile with routes or destination overrides, and no policy source"
		default:
			e.Reason = "no ServiceProfile with routes or destination overrides, and no outbound policy (yet)"
		}
		if prof != nil {
			explainProfile(&e, prof.Resolve(req), req)
			e.Model = ModelDefault
		}
		return e
	}
	e.Model = ModelPolicy
	e.Reason = "no ServiceProfile with routes or destination overrides; the outbound policy applies"
	rt := ps.table.For(req)
	if rt == nil {
		if ps.table.Forbidden() {
			e.Reason += ", and its opaque route forbids the connection: the request is refused unsent (ErrForbiddenRoute)"
			return e
		}
		e.Reason += ", but it has no HTTP routes for this request"
		return e
	}
	x := rt.Explain(req)
	if x.Route == nil {
		e.Match = "no route matches: the request gets a 404"
		return e
	}
	route := x.Route
	e.Route, e.RouteKind = route.Meta.Name, route.Meta.Kind
	e.Match = x.Winner.String()
	if x.RunnerUp != nil {
		e.RunnerUp = x.RunnerUp.String()
	}
	e.Filters = filterNames(route.Filters)
	bi := &BackendsInfo{Distribution: route.Backends.Kind.String(), Backends: []BackendInfo{}}
	rtgt := ps.target(r, req, route)
	for i, b := range route.Backends.Backends {
		info := BackendInfo{Name: b.Backend.Meta.Name, Kind: b.Backend.Meta.Kind, Weight: b.Weight, Filters: filterNames(b.Filters)}
		switch {
		case b.Backend.Balancer != nil:
			info.Target = b.Backend.Balancer.Authority
			if bc := rtgt.balancing[i]; bc != nil && bc.FailureAccrual != nil {
				info.FailureAccrual = "consecutive"
				if bc.FailureAccrual.Unified != nil {
					info.FailureAccrual = "unified"
				}
			}
			if bc := rtgt.balancing[i]; bc != nil {
				info.OutlierDetection = outlierInfo(bc.OutlierDetection)
			}
			if bal := r.cfg.balancer; bal != nil {
				ready := bal.ReadyWith(info.Target, rtgt.balancing[i])
				info.Ready, info.Endpoints = &ready, bal.EndpointsWith(info.Target, rtgt.balancing[i])
				info.Zone = bal.ZoneWith(info.Target, rtgt.balancing[i])
			}
		case b.Backend.Forward != nil:
			info.Target = b.Backend.Forward.Addr.String()
		}
		bi.Backends = append(bi.Backends, info)
	}
	e.Backends = bi
	e.Timeouts = TimeoutsInfo{Request: dur(route.Timeouts.Request), Response: dur(route.Timeouts.Response), Idle: dur(route.Timeouts.Idle)}
	if rr := route.Retry; rr != nil {
		ri := &RetryInfo{Kind: "counted", MaxRetries: rr.Limit(), MaxRequestBytes: rr.BodyLimit(), Timeout: dur(rr.Timeout),
			AllowL5dRequestHeaders: route.AllowL5dRequestHeaders}
		bp := rr.BackoffPolicy()
		ri.Backoff = bp.Min.String() + "-" + bp.Max.String()
		if route.GRPC {
			for _, c := range rr.GRPCCodes {
				ri.GRPCCodes = append(ri.GRPCCodes, c.String())
			}
		} else {
			for _, s := range rr.StatusRanges {
				ri.Statuses = append(ri.Statuses, strconv.Itoa(int(s.Start))+"-"+strconv.Itoa(int(s.End)))
			}
		}
		e.Retry = ri
	}
	if t := ps.target(r, req, route); t != nil && t.budget != nil {
		st := t.budget.State()
		e.Budget = &st
	}
	if t := ps.target(r, req, route); t != nil && t.hedge != nil {
		e.Hedge = t.hedge.explain()
	}
	if t := ps.target(r, req, route); t != nil && t.mirror != nil {
		e.Mirrors = t.mirror.explain()
	}
	return e
}

func explainProfile(e *Explanation, v profileroute.Resolved, req *http.Request) {
	e.Model = ModelProfile
	route := v.Table().Select(req)
	if route.IsDefault() {
		e.Match = "no route of the profile matches: the default route"
	} else {
		idx := route.Index
		e.Index = &idx
		e.Route = route.Labels["route"]
		e.Match = "first matching route, in profile order"
	}
	e.Timeouts.Request = dur(route.Timeout)
	if route.Retryable {
		e.Retry = &RetryInfo{Kind: "budget", MaxRequestBytes: MaxRetryBodyBytes}
	}
	if b := v.Budget(); b != nil {
		st := b.State()
		e.Budget = &st
	}
	if h, ok := v.Hedger(route).(*hedger); ok {
		e.Hedge = h.explain()
	}
	if p := v.Table().Profile(); p != nil && len(p.DstOverrides) > 0 {
		bi := &BackendsInfo{Distribution: "dst_overrides"}
		for _, d := range p.DstOverrides {
			bi.Backends = append(bi.Backends, BackendInfo{Name: d.Authority, Kind: "authority", Target: d.Authority, Weight: d.Weight})
		}
		e.Backends = bi
	}
}

func filterNames(fs []policy.Filter) []string {
	var out []string
	for _, f := range fs {
		switch {
		case f.RequestHeaders != nil:
			out = append(out, "request_header_modifier")
		case f.ResponseHeaders != nil:
			out = append(out, "response_header_modifier")
		case f.Redirect != nil:
			out = append(out, "redirect("+strconv.Itoa(f.Redirect.StatusCode())+")")
		case f.FailureInjector != nil:
			out = append(out, "failure_injector("+strconv.Itoa(f.FailureInjector.Status)+")")
		case f.GRPCFailureInjector != nil:
			out = append(out, "grpc_failure_injector("+f.GRPCFailureInjector.Code.String()+")")
		}
	}
	return out
}
