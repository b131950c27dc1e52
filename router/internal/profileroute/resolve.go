package profileroute

import (
	"net/http"

	"github.com/inmesh/inmesh/profiles"
)

// Resolved is the profile state of one request's authority, read once:
// the route table in force and its retry budget. Another router uses it
// to decide whether the profile applies (a profile with routes or
// destination overrides wins over an outbound policy) and to run the
// request by it.
type Resolved struct {
	r  *Router
	ts *tableState
}

// Resolve returns the profile state of req's authority, starting its watch
// on first use (the state is then the empty table until the profile
// arrives).
func (r *Router) Resolve(req *http.Request) Resolved {
	return Resolved{r: r, ts: r.destFor(r.requestKey(req)).state.Load()}
}

// Discovered is closed once the source's first answer about the
// authority arrived (a profile, or none): what a request that may wait for
// discovery waits on.
func (v Resolved) Discovered() <-chan struct{} { return v.ts.first.Done() }

// GiveUp ends the wait for the authority's first answer (see Discovered)
// without one: a request waited out its bound, and those after it take
// the state in force without waiting. The answer, when it comes, applies
// as usual.
func (v Resolved) GiveUp() { v.ts.first.Answered() }

// Table returns the route table in force.
func (v Resolved) Table() *profiles.Table { return v.ts.table }

// Budget returns the retry budget of the profile, nil when it has none.
func (v Resolved) Budget() *profiles.Budget { return v.ts.budget.get() }

// Applies reports whether the profile has routes (that compiled) or
// destination overrides of a weight above 0, and so takes precedence over
// an outbound policy, as linkerd2-proxy's should_override_policy
// (linkerd/app/outbound/src/http/logical/profile.rs). Overrides of weight
// 0 count for nothing, as Linkerd's proxy drops them when it reads the
// profile (linkerd/service-profiles/src/proto.rs, convert_dst_override).
func (v Resolved) Applies() bool { return len(v.ts.table.Routes()) > 0 || v.ts.split != nil }

// RoundTrip runs req through base by the profile, as the router's
// Transport does.
func (v Resolved) RoundTrip(base http.RoundTripper, req *http.Request) (*http.Response, error) {
	return v.r.roundTrip(base, req, v.ts)
}

// Hedger returns the outbound hedger of route, a route of v's table; nil
// when it does not hedge.
func (v Resolved) Hedger(route *profiles.CompiledRoute) Hedger {
	t := v.ts.targets[route]
	if t == nil {
		return nil
	}
	return t.outbound().hedge
}
