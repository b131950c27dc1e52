package meshgrpc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/resolver"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/registry"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
)

// Scheme is the resolver scheme of mesh targets: inmesh:///host:port.
const Scheme = "inmesh"

// backendKey is the key, in an address's attributes and its endpoint's,
// of the backend authority the endpoint was discovered for; endpointKey,
// in an endpoint's attributes, that of its endpoint.Endpoint (an epAttr:
// weight, labels and identity, for the balancer).
type (
	backendKey  struct{}
	endpointKey struct{}
	// answeredKey: the backends whose endpoints are known (a set, maybe
	// empty), one per line, in the resolver state's attributes.
	answeredKey struct{}
	// forwardedKey: the backends that are forwards (one address, no
	// discovery), one per line, in the resolver state's attributes.
	forwardedKey struct{}
)

// epAttr is an endpoint in attributes: compared by its address, weight
// and identity, so that an unchanged endpoint keeps its sub-channel.
type epAttr struct{ e *endpoint.Endpoint }

func (a epAttr) Equal(o any) bool {
	b, ok := o.(epAttr)
	return ok && a.e.Addr == b.e.Addr && a.e.Weight == b.e.Weight && a.e.Identity == b.e.Identity
}

// resolverBuilder builds the resolver of a channel: it follows the
// target's outbound policy and the endpoints of every backend authority
// the policy's gRPC routes name (the target itself without a policy).
type resolverBuilder struct{ m *mesh }

func (b resolverBuilder) Scheme() string { return Scheme }

func (b resolverBuilder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	authority := strings.TrimPrefix(t.Endpoint(), "/")
	if !validAuthority(authority) {
		return nil, fmt.Errorf("meshgrpc: target %q: want %s:///host:port", t.URL.String(), Scheme)
	}
	ctx, cancel := context.WithCancel(context.Background())
	_, ipErr := netip.ParseAddrPort(authority)
	r := &meshResolver{m: b.m, cc: cc, authority: authority, ctx: ctx, cancel: cancel, ip: ipErr == nil,
		sets: make(map[string]*endpoint.Update), stops: make(map[string]func()),
		refused: make(map[string]*refusal)}
	b.m.register(authority, r)
	r.mu.Lock()
	r.wantLocked(r.wantedLocked(), nil)
	r.mu.Unlock()
	r.watchProfile(0)
	r.watchPolicy(0)
	r.push() // a watch refused at once is a resolver error now
	wait := b.m.cfg.discoveryWait
	if wait <= 0 {
		wait = DefaultDiscoveryWait
	}
	r.mu.Lock()
	r.unanswered = time.AfterFunc(wait, func() { r.noAnswer(wait) })
	r.mu.Unlock()
	return r, nil
}

// noAnswer reports a target none of whose backends' endpoints (see
// firstLocked) have answered within wait (a control plane that cannot be
// reached or is silent) as a resolver error: grpc-go then fails a
// fail-fast call with UNAVAILABLE, as the HTTP balancer answers 503 past
// its resolve timeout, instead of holding it until its deadline; a
// wait-for-ready call waits on. The first answer clears it.
func (r *meshResolver) noAnswer(wait time.Duration) {
	r.mu.Lock()
	silent := !r.closed && !r.firstLocked()
	r.mu.Unlock()
	if silent {
		r.cc.ReportError(fmt.Errorf("meshgrpc: no answer from the control plane for %s within %s", r.authority, wait))
	}
}

// watchProfile starts the target's ServiceProfile watch. One the
// Destination client refuses (its bound) is tried again after the n-th
// delay of the registry's backoff; meanwhile calls do not wait for it.
func (r *meshResolver) watchProfile(n int) {
	stop, err := r.m.dst.Watch(r.ctx, r.authority, r.profile)
	if r.keep(stop, err, errors.Is(err, profiles.ErrTooManyWatches), &r.profileStop, n, r.watchProfile) {
		return
	}
	if n == 0 {
		r.m.cfg.logger.Warn("meshgrpc: cannot watch the service profile", "authority", r.authority, "error", err)
	}
	r.answered(&r.profileAnswered) // none will come for now
}

// watchPolicy starts the target's outbound policy watch, as watchProfile
// does the profile's. The policy comes as the HTTP stack's router gets it
// ([destination.Client.Policies]): an IP target's by address, or the
// forward to its profile's endpoint.
func (r *meshResolver) watchPolicy(n int) {
	stop, err := r.m.dst.Policies().Watch(r.ctx, r.authority, r.policy)
	if r.keep(stop, err, errors.Is(err, policy.ErrTooManyWatches), &r.policyStop, n, r.watchPolicy) {
		return
	}
	if n == 0 {
		r.m.cfg.logger.Warn("meshgrpc: cannot watch the outbound policy; the target's endpoints take every call until it can", "authority", r.authority, "error", err)
	}
	r.mu.Lock()
	var stops []func()
	if !r.closed && !r.policied {
		r.policied = true // none will come for now: calls go to the target
		stops = r.wantLocked(r.wantedLocked(), r.forwards)
	}
	r.mu.Unlock()
	for _, s := range stops {
		s()
	}
	r.push()
	r.answered(&r.policyAnswered)
}

// keep records a started watch's stop in *slot, or, for one refused at
// the client's bound (bound), a retry of again(n+1) after the n-th delay;
// it reports whether the watch started (or the resolver closed meanwhile,
// which stops it). Any other error (a closed client) is not tried again.
func (r *meshResolver) keep(stop func(), err error, bound bool, slot *func(), n int, again func(int)) bool {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		if stop != nil {
			stop()
		}
		return true
	}
	if err != nil {
		if bound {
			t := time.AfterFunc(registry.DefaultRetry.Delay(n), func() { again(n + 1) })
			*slot = func() { t.Stop() }
		}
		r.mu.Unlock()
		return false
	}
	*slot = stop
	r.mu.Unlock()
	return true
}

type meshResolver struct {
	m         *mesh
	cc        resolver.ClientConn
	authority string
	ctx       context.Context
	cancel    context.CancelFunc

	mu         sync.Mutex
	closed     bool
	policyStop func()
	// profileStop ends the ServiceProfile watch.
	profileStop func()
	backends    []string                    // the backend authorities, the target's first
	sets        map[string]*endpoint.Update // the last update of each backend's watch
	stops       map[string]func()
	// forwards are the backends the policy forwards to, by key (see
	// forwardKey): their one endpoint is their set, with no watch.
	forwards map[string]endpoint.Endpoint
	// policyBackends are the backends of the target's policy; logical is
	// the logical authority of its profile, when that routes calls to it.
	policyBackends []string
	logical        string
	// split holds the backends of the profile's dst overrides, which
	// its calls go to by weight.
	split []string
	// routed: the target's policy routes every call to backends other
	// than the target, so that a failed watch of the target's own
	// endpoints (the Destination API's Get refuses an IP, a Service's
	// clusterIP as a pod's) fails no call.
	routed bool
	// ip: the target is an IP address, whose own endpoints Get refuses
	// (Linkerd's proxy never asks it for one): they are watched only
	// when a call may go to the target as it is (see ownLocked).
	ip bool
	// policied: the policy watch has delivered an update, or cannot
	// start; policyRoutes: the last update routes calls (a Service's
	// policy, a forward) or forbids them.
	policied, policyRoutes bool
	// selfProfile: the target's profile routes calls, to the target
	// itself (it names no logical authority).
	selfProfile bool
	// refused holds the pending retry of each backend whose endpoint
	// watch the Destination client refused (its bound): the watch is
	// tried again after a delay that grows with each refusal in a row.
	refused map[string]*refusal
	// policyAnswered and profileAnswered: the target's outbound policy
	// and ServiceProfile have answered, or their watch failed.
	policyAnswered, profileAnswered bool
	// unanswered fires noAnswer once the discovery wait has passed.
	unanswered *time.Timer
}

// answered records the first answer of one of the target's watches (flag
// is policyAnswered or profileAnswered); with both in, the calls that
// wait for them go on.
func (r *meshResolver) answered(flag *bool) {
	r.mu.Lock()
	first := !*flag
	*flag = true
	both := first && r.policyAnswered && r.profileAnswered && !r.closed
	r.mu.Unlock()
	if both {
		r.m.discovered(r.authority)
	}
}

// profile takes a ServiceProfile update: a profile with routes of an IP
// target that names its service sends calls to that name (see
// [profiles.Profile.LogicalAuthority]), whose endpoints are watched, as
// are those of the backends of its dst overrides.
func (r *meshResolver) profile(u profiles.Update) {
	ps := r.m.setProfile(r.authority, r, u)
	if ps != nil {
		logical := ""
		if ps.applies() {
			logical = ps.logical
		}
		self := ps.applies() && logical == ""
		split := ps.splitBackends
		r.mu.Lock()
		if r.closed || logical == r.logical && self == r.selfProfile && slices.Equal(split, r.split) {
			r.mu.Unlock()
		} else {
			r.logical, r.selfProfile, r.split = logical, self, split
			stops := r.wantLocked(r.wantedLocked(), r.forwards)
			r.mu.Unlock()
			for _, s := range stops {
				s()
			}
			r.push()
		}
	}
	r.answeredBy(&r.profileAnswered, u.Err)
}

// answeredBy records an update of one of the target's watches, whose
// error is err (nil for an answer). A control plane the client cannot
// reach answers nothing (destination.ErrUnreachable): the target's
// endpoints come from it too, so a call waiting for them loses nothing by
// waiting for its route as well, and would otherwise be sent, once the
// control plane is back, without the route that came with its endpoints.
// Any answer of the control plane's own, an error status included, ends
// the wait.
func (r *meshResolver) answeredBy(flag *bool, err error) {
	if errors.Is(err, destination.ErrUnreachable) {
		return
	}
	r.answered(flag)
}

// ResolveNow is a hint grpc-go gives after every failed connection; the
// watches push every change already, so it does nothing (no storm of
// lookups when endpoints churn).
func (r *meshResolver) ResolveNow(resolver.ResolveNowOptions) {}

func (r *meshResolver) Close() {
	r.mu.Lock()
	r.closed = true
	if r.unanswered != nil {
		r.unanswered.Stop()
	}
	stops := []func(){r.policyStop, r.profileStop}
	for _, s := range r.stops {
		stops = append(stops, s)
	}
	r.stops = nil
	r.mu.Unlock()
	r.cancel()
	for _, s := range stops {
		if s != nil {
			s()
		}
	}
	r.m.forget(r.authority, r)
}

// policy takes a policy update: its compiled routes go to the
// interceptors, its backend authorities are watched.
func (r *meshResolver) policy(u policy.Update) {
	st := r.m.setPolicy(r.authority, r, u)
	var forwards map[string]endpoint.Endpoint
	var backends []string
	if st != nil {
		backends, forwards = st.backends, st.forwards
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.routed = st != nil && st.routes != nil && !slices.Contains(st.backends, r.authority)
	// A policy that forbids its target sends calls nowhere: they fail in
	// the interceptors, and the target's own endpoints are not watched.
	r.policied, r.policyRoutes = true, st != nil && (st.routes != nil || st.table.Forbidden())
	r.policyBackends = backends
	stops := r.wantLocked(r.wantedLocked(), forwards)
	r.mu.Unlock()
	for _, s := range stops {
		s()
	}
	r.push()
	// After the push: the balancer has the policy's backends and their
	// configuration before a waiting call is routed to one.
	r.answeredBy(&r.policyAnswered, u.Err)
}

// wantedLocked returns the backends the channel's calls may go to: the
// target (when ownLocked), its policy's backends, its profile's logical
// authority and the backends of its profile's dst overrides.
func (r *meshResolver) wantedLocked() []string {
	var want []string
	if r.ownLocked() {
		want = append(want, r.authority)
	}
	add := func(a string) {
		if a != "" && !slices.Contains(want, a) {
			want = append(want, a)
		}
	}
	for _, a := range r.policyBackends {
		add(a)
	}
	add(r.logical)
	for _, a := range r.split {
		add(a)
	}
	return want
}

// ownLocked reports whether the target's own endpoints are watched: a
// name's always; an IP's when a call may go to the target as it is: its
// policy answered none (or cannot be watched), or its profile routes calls
// to it. An IP's policy that routes calls (a Service's, a forward) leaves
// them unwatched, and before its first answer nothing is watched: the
// calls wait for it.
func (r *meshResolver) ownLocked() bool {
	return !r.ip || r.policied && !r.policyRoutes || r.selfProfile
}

// firstLocked reports whether the channel has had its first answer: that
// of any backend its calls may go to (see wantedLocked), once an IP
// target's policy answered when its own endpoints are not watched. The
// target's own set is not awaited by a call sent elsewhere: a Service with
// no endpoints, which the control plane answers with silence until the
// Destination client's first-message timeout, whose dst overrides or
// route backends send every call to another Service, has its calls
// answered as soon as that Service's endpoints are known. A call to a
// backend not answered yet waits for it in the picker. This follows
// Linkerd's proxy, whose distribution waits only for the backend it draws
// (linkerd/distribute/src/service/random.rs, poll_ready).
func (r *meshResolver) firstLocked() bool {
	if !r.ownLocked() && !r.policied {
		return false
	}
	for _, b := range r.backends {
		if r.sets[b] != nil {
			return true
		}
	}
	return false
}

// wantLocked starts the endpoint watches of the authorities in want that
// have none and returns the stops of those no longer wanted. A backend in
// forwards is its endpoint alone, never watched: the target itself too,
// when the policy forwards to its address (a pod's, which the Destination
// API's Get refuses, as Linkerd's proxy never asks it).
func (r *meshResolver) wantLocked(want []string, forwards map[string]endpoint.Endpoint) (stops []func()) {
	r.backends = want
	for a, s := range r.stops {
		_, was := r.forwards[a]
		_, is := forwards[a]
		if !slices.Contains(want, a) || was != is {
			stops = append(stops, s)
			delete(r.stops, a)
			delete(r.sets, a)
			delete(r.refused, a)
		}
	}
	r.forwards = forwards
	for _, a := range want {
		if ep, ok := forwards[a]; ok {
			r.sets[a] = &endpoint.Update{Set: &endpoint.Set{Exists: true, Endpoints: []endpoint.Endpoint{ep}}}
			r.stops[a] = func() {}
			continue
		}
		if _, ok := r.stops[a]; ok {
			continue
		}
		stop, err := r.m.dst.WatchEndpoints(r.ctx, a, func(u endpoint.Update) { r.endpoints(a, u) })
		if err != nil {
			r.sets[a] = &endpoint.Update{Err: err}
			if !errors.Is(err, profiles.ErrTooManyWatches) {
				r.stops[a] = func() {} // a closed client: nothing to try again
				continue
			}
			rf := &refusal{}
			if prev := r.refused[a]; prev != nil {
				rf.n = prev.n + 1
			}
			rf.t = time.AfterFunc(registry.DefaultRetry.Delay(rf.n), func() { r.retry(a, rf) })
			r.refused[a] = rf
			r.stops[a] = func() { rf.t.Stop() }
			continue
		}
		delete(r.refused, a)
		r.stops[a] = stop
	}
	return stops
}

// refusal is the pending retry of one refused endpoint watch, the n-th
// refusal in a row (from 0).
type refusal struct {
	t *time.Timer
	n int
}

// retry watches a backend whose watch was refused again, if the channel
// still wants it and rf is still its pending retry (not one that a policy
// update dropped, the backend wanted again since): a bound that was full a
// moment ago (another channel's or stack's watches) may have room now.
// Without it, a refusal lasted as long as the channel.
func (r *meshResolver) retry(a string, rf *refusal) {
	r.mu.Lock()
	if r.closed || r.refused[a] != rf {
		r.mu.Unlock()
		return
	}
	delete(r.stops, a) // wantLocked watches a again, and keeps rf's count
	stops := r.wantLocked(r.backends, r.forwards)
	r.mu.Unlock()
	for _, s := range stops {
		s()
	}
	r.push()
}

func (r *meshResolver) endpoints(a string, u endpoint.Update) {
	u = addressItself(a, u)
	r.mu.Lock()
	if _, fwd := r.forwards[a]; r.closed || fwd || r.stops[a] == nil && !slices.Contains(r.backends, a) {
		r.mu.Unlock()
		return
	}
	r.sets[a] = &u
	r.mu.Unlock()
	r.push()
}

// addressItself returns u, or, for an IP address that is no service (an
// address outside the client's search networks, which the Destination
// client never looks up), the address alone, in plaintext: as the HTTP
// stack's balancer sends a request to such an address itself, and
// Linkerd's policy controller forwards to an address outside the cluster
// ("egress-fallback"). Without it such a channel failed every call.
func addressItself(a string, u endpoint.Update) endpoint.Update {
	if u.Set == nil || u.Set.Exists {
		return u
	}
	ap, err := netip.ParseAddrPort(a)
	if err != nil {
		return u
	}
	return endpoint.Update{Set: &endpoint.Set{Exists: true, Endpoints: []endpoint.Endpoint{{Addr: ap, Weight: endpoint.DefaultWeight}}}}
}

// push gives grpc-go the addresses of every backend that answered: one
// per endpoint and backend, carrying the endpoint's identity (for the
// credentials), its backend and the endpoint (for the balancer). Nothing
// is pushed before the first answer of a backend (see firstLocked): calls
// wait meanwhile. A watch that failed with no set is reported as a
// resolver error.
func (r *meshResolver) push() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || !r.firstLocked() {
		return
	}
	var eps []resolver.Endpoint
	var addrs []resolver.Address
	var errs []error
	var answered, forwarded []string
	for _, b := range r.backends {
		u := r.sets[b]
		if u == nil {
			continue
		}
		answered = append(answered, b)
		if _, ok := r.forwards[b]; ok {
			forwarded = append(forwarded, b)
		}
		if u.Set == nil {
			if u.Err != nil && !(b == r.authority && r.routed) {
				errs = append(errs, fmt.Errorf("%s: %w", b, u.Err))
			}
			continue
		}
		for i := range u.Set.Endpoints {
			e := &u.Set.Endpoints[i]
			ba := attributes.New(backendKey{}, b).WithValue(endpointKey{}, epAttr{e})
			addr := resolver.Address{Addr: e.Addr.String()}
			addr = withEndpointIdentity(addr, e.Identity, e.ServerName)
			addr.Attributes = addr.Attributes.WithValue(backendKey{}, b) // one sub-channel per backend
			addrs = append(addrs, addr)
			eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{addr}, Attributes: ba})
		}
	}
	if len(addrs) == 0 && len(errs) > 0 {
		r.cc.ReportError(errors.Join(errs...))
		return
	}
	st := resolver.State{Addresses: addrs, Endpoints: eps,
		Attributes: attributes.New(backendKey{}, r.authority).WithValue(meshKey{}, r.m).
			WithValue(answeredKey{}, strings.Join(answered, "\n")).
			WithValue(forwardedKey{}, strings.Join(forwarded, "\n"))}
	// An empty set is a state too: the balancer fails calls that do not
	// wait for ready at once. grpc-go's answer (ErrBadResolverState when a
	// balancer refuses it) asks for a re-resolution, which a watch needs
	// not: the next change comes by itself.
	_ = r.cc.UpdateState(st)
}

// backendOf returns the backend authority of addresses' attributes.
func backendOf(a *attributes.Attributes) string {
	s, _ := a.Value(backendKey{}).(string)
	return s
}

// endpointOf returns the endpoint in attributes, nil without one.
func endpointOf(a *attributes.Attributes) *endpoint.Endpoint {
	e, _ := a.Value(endpointKey{}).(epAttr)
	return e.e
}
