package meshgrpc

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/router"
)

// clientScope is the instrumentation scope of the client's metrics; the
// families and labels are those of the router (outbound_grpc_route_*,
// route_*) and of package classify (response_total).
const clientScope = "github.com/inmesh/inmesh/meshgrpc"

// DialOptions returns the options that put a grpc-go client in the mesh,
// for a target inmesh:///host:port:
//
//   - the resolver of scheme [Scheme], fed by dst: the endpoints of the
//     target and of every backend its outbound policy's routes name (a
//     forward backend is its one endpoint) and of its ServiceProfile's
//     logical authority and dst overrides, with their weights, labels and
//     identities, pushed as
//     they change (ResolveNow does nothing: no re-resolution storm when
//     connections fail); an empty set is pushed too, a failed watch
//     reported as a resolver error;
//   - the balancer [BalancerName], chosen by a default service config:
//     per backend authority one [balancer.Pool] (power of two choices over
//     peak-EWMA load with failure accrual and probation, the HTTP
//     balancer's own code) over the READY sub-channels; a call that finds
//     none in rotation (an empty set, endpoints connecting or failing to
//     connect, every one tripped) waits in the balancer's queue, at most
//     the failfast timeout, then fails DEADLINE_EXCEEDED, while
//     wait-for-ready calls wait until their deadline;
//   - per attempt, the legacy request_total, response_total (with
//     classification) and response_latency_ms series of package classify,
//     labelled with the backend authority (none for a forward backend, as
//     Linkerd's proxy labels a forward's) and the endpoint's dst_*, tls
//     and target_* (its address) labels;
//   - unary and stream interceptors that route each call, the first on a
//     new channel as every later one: a call that comes before the
//     target's first answers (its outbound policy and ServiceProfile, or
//     the word that there is none) starts the channel's watches and
//     waits for them, at most [WithDiscoveryWait] (by default
//     [DefaultDiscoveryWait]) or until its own deadline; then a
//     ServiceProfile with routes or dst overrides first (unary calls: the
//     route's timeout, budgeted retries, route_* series; every call: the
//     backend the overrides draw by weight), else the outbound policy's
//     GRPCRoutes (or
//     its HTTPRoutes, for a Service without GRPCRoutes)
//     (best match by the policy package, on /pkg.Service/Method and the
//     outgoing metadata): the rule's filters (header modifiers on the
//     metadata; the failure injector's code and message), the backend by
//     the distribution (put in the call's context for the balancer), the
//     request timeout over the whole call, counted retries on the rule's
//     gRPC codes (a stream only before its response headers, as gRFC A6
//     commits a call: only a Trailers-Only failure is retried; its
//     sent messages replayed while they fit the retry's body limit,
//     MaxRequestBytes, 64 KiB by default, each measured as the call's
//     codec encodes it, whatever the codec (grpc.ForceCodecV2, a
//     content-subtype); a message the codec cannot measure counts as
//     past the limit; past it the stream is not retried), and the
//     outbound_grpc_route_* series of
//     the router's metric code, grpc_status on each; a call made as
//     several attempts gives its grpc.Header, grpc.Trailer, grpc.Peer
//     and grpc.OnFinish options the attempt whose answer it returns,
//     once, as grpc-go's own retries do;
//   - transport credentials: mTLS with each endpoint's identity when
//     [WithIdentity] gives a local identity, plaintext to an endpoint
//     without one;
//   - an endpoint's authority override as the :authority of the calls
//     sent to it (a call's grpc.CallAuthority wins), which then go without
//     their l5d-dst-canonical metadata;
//   - l5d-require-id ([RequireIDMetadata]): removed from every call (one
//     an interceptor chained after these adds is checked but stays); a
//     call that names an identity its picked endpoint's connection did
//     not verify fails UNAVAILABLE unsent;
//   - grpc.WithNoProxy (endpoint addresses are pod addresses, never to be
//     sent through HTTPS_PROXY) and grpc.WithDisableRetry (the route's
//     retries are the only configured ones; grpc-go's transparent retries
//     stay).
//
// Options that mean nothing to a client ([WithInboundPolicy]) are ignored.
// A channel that goes idle closes its resolver, which ends its watches;
// the next call starts them again.
func DialOptions(dst *destination.Client, opts ...Option) []grpc.DialOption {
	cfg := newConfig(opts)
	if cfg.discoveryWait == 0 {
		cfg.discoveryWait = DefaultDiscoveryWait
	}
	m := &mesh{discovery: make(map[string]*discovery), dst: dst, cfg: cfg, fam: metrics.NewOutbound(metrics.Meter(cfg.mp, clientScope), true),
		calls:  classify.NewOutboundRecorder(classify.WithMeterProvider(cfg.mp)),
		states: make(map[string]*channelState), profiles: make(map[string]*profileState),
		live: make(map[string]map[*meshResolver]*channelState)}
	meter := metrics.Meter(cfg.mp, clientScope)
	m.httpFam = metrics.NewOutbound(meter, false)
	m.tcpRoutes = metrics.NewTCPRoutes(meter)
	m.routeFam, m.actualFam = metrics.NewFamily(meter, "route_", true), metrics.NewFamily(meter, "route_actual_", false)
	m.hedges = metrics.NewHedges(meter, true)
	m.plog = ratelog.New(cfg.logger, 0)
	cfg.balancer = append([]balancer.Option{balancer.WithMeshTLS(cfg.identity != nil)}, cfg.balancer...)
	creds := insecure.NewCredentials()
	if cfg.identity != nil {
		creds = newClientCreds(cfg.identity)
	}
	return append(clientTraceOptions(cfg),
		grpc.WithResolvers(resolverBuilder{m}),
		grpc.WithDefaultServiceConfig(fmt.Sprintf(`{"loadBalancingConfig":[{%q:{}}]}`, BalancerName)),
		grpc.WithTransportCredentials(creds),
		grpc.WithChainUnaryInterceptor(m.unaryInterceptor),
		grpc.WithChainStreamInterceptor(m.streamInterceptor),
		grpc.WithNoProxy(),
		grpc.WithDisableRetry(),
	)
}

// mesh is the state shared by the resolver, balancer and interceptors of
// the channels made with one DialOptions: the compiled policy of each
// target authority.
type mesh struct {
	dst *destination.Client
	cfg *config
	// fam is the outbound_grpc_route_* families of GRPCRoutes' calls,
	// httpFam the outbound_http_route_* ones of HTTPRoutes' calls.
	fam, httpFam *metrics.Outbound
	// tcpRoutes counts the calls refused by a forbidden opaque route.
	tcpRoutes *metrics.TCPRoutes
	// calls records the legacy response_* families of each attempt.
	calls *classify.Recorder

	// routeFam and actualFam are the route_* and route_actual_* families
	// of ServiceProfile routes.
	routeFam, actualFam *metrics.Family
	// hedges is the outbound_grpc_route_hedge_* family set.
	hedges *metrics.Hedges
	// plog writes the lines a ServiceProfile update can trigger, at most
	// once per kind and reason per interval.
	plog *ratelog.Logger

	mu       sync.Mutex
	states   map[string]*channelState
	profiles map[string]*profileState
	// live holds, per target authority, the open resolvers of the
	// channels to it and the last state each compiled (nil: none yet):
	// channels made with the same options share the authority's state,
	// and when one closes another's stays in force.
	live map[string]map[*meshResolver]*channelState
	// discovery holds, per target authority with an open resolver, the
	// wait for its first answers.
	discovery map[string]*discovery
}

// discovery is the wait for a target's first answers: done is closed once
// a resolver of the target has its outbound policy and its ServiceProfile
// answered (or knows that none will come), or the discovery wait has
// passed since the first of its open resolvers started, or the last of
// them closed.
type discovery struct {
	done  chan struct{}
	once  sync.Once
	timer *time.Timer
}

func (d *discovery) end() { d.once.Do(func() { close(d.done) }) }

// register records owner as an open resolver of authority.
func (m *mesh) register(authority string, owner *meshResolver) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live[authority] == nil {
		m.live[authority] = make(map[*meshResolver]*channelState)
	}
	m.live[authority][owner] = nil
	if m.discovery[authority] == nil {
		d := &discovery{done: make(chan struct{})}
		if m.cfg.discoveryWait > 0 {
			d.timer = time.AfterFunc(m.cfg.discoveryWait, d.end)
		} else {
			d.end()
		}
		m.discovery[authority] = d
	}
}

// discovered ends the wait for the first answers of authority.
func (m *mesh) discovered(authority string) {
	m.mu.Lock()
	d := m.discovery[authority]
	m.mu.Unlock()
	if d != nil {
		if d.timer != nil {
			d.timer.Stop() // the answers are in: the bound is moot
		}
		d.end()
	}
}

// channelState is the routing state of a target: its compiled policy,
// owned by the resolver that watches it.
type channelState struct {
	owner *meshResolver
	table *policy.Table
	// routes is the table calls are routed by: the policy's gRPC routes,
	// or, without them, its HTTP/2 table's HTTP routes, as Linkerd's
	// proxy routes gRPC, HTTP/2 requests like any other, by the HTTPRoutes
	// of a Service without GRPCRoutes; nil without a policy (calls then go
	// to the target as they are).
	routes *policy.RouteTable
	// backends are the backends of its routes: balancer authorities and
	// forward keys.
	backends []string
	// forwards are the endpoints of its forward backends, by forwardKey.
	forwards map[string]endpoint.Endpoint
	targets  map[*policy.Route]*routeTarget
	// balancing is the balancer configuration of each backend authority
	// (nil: the options').
	balancing map[string]*balancer.BackendConfig
	// forbidden counts the calls refused when table forbids the
	// target's connections (nil otherwise).
	forbidden *metrics.ForbiddenConns
}

// setPolicy compiles u for authority and makes it the target's state; a
// policy that does not compile is logged and the last good one stays.
func (m *mesh) setPolicy(authority string, owner *meshResolver, u policy.Update) *channelState {
	st := &channelState{owner: owner}
	if u.Policy != nil {
		t, err := policy.Compile(u.Policy, policy.Options{})
		if err != nil {
			m.cfg.logger.Warn("meshgrpc: rejected outbound policy; keeping the last good one", "authority", authority, "error", err)
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.states[authority]
		}
		st.table = t
		if t.Forbidden() {
			st.forbidden = m.tcpRoutes.Forbidden(router.ForbiddenLabels(t, authority)...)
		}
		st.targets = make(map[*policy.Route]*routeTarget)
		if rt := t.For(&http.Request{ProtoMajor: 2}); rt != nil {
			st.routes = rt
			for _, route := range rt.Routes() {
				st.targets[route] = m.withMirror(m.newRouteTarget(route, rt.FailureAccrual()), authority)
				for _, mi := range route.Mirrors {
					if mi.Authority != "" {
						st.backends = append(st.backends, mi.Authority) // the balancer follows the mirror's endpoints too
					}
				}
				for _, b := range route.Backends.Backends {
					if f := b.Backend.Forward; f != nil {
						k := forwardKey(f)
						if st.forwards == nil {
							st.forwards = make(map[string]endpoint.Endpoint)
						}
						if _, ok := st.forwards[k]; !ok {
							st.forwards[k] = *f
							st.backends = append(st.backends, k)
						}
					}
					if b.Backend.Balancer != nil {
						a := b.Backend.Balancer.Authority
						st.backends = append(st.backends, a)
						if st.balancing == nil {
							st.balancing = make(map[string]*balancer.BackendConfig)
						}
						if _, ok := st.balancing[a]; !ok {
							st.balancing[a] = backendConfig(b.Backend, rt)
						}
					}
				}
			}
		}
	}
	m.mu.Lock()
	m.states[authority] = st
	if l := m.live[authority]; l != nil {
		if _, ok := l[owner]; ok {
			l[owner] = st
		}
	}
	m.mu.Unlock()
	return st
}

// backendConfig returns the configuration of the pool of backend b of
// table rt. A GRPCRoute's backend configures it all. An HTTPRoute's, the
// default policy's included, brings only the protocol's failure accrual:
// the Service's, which Linkerd's policy controller sends in the HTTP/2
// protocol that gRPC calls take (policy-controller/grpc/src/outbound/http.rs);
// its queue, load and outlier detection stay the client's options', as
// for the calls of a Service without GRPCRoutes before they were routed.
func backendConfig(b policy.Backend, rt *policy.RouteTable) *balancer.BackendConfig {
	c := router.BackendConfig(b, rt.FailureAccrual())
	if rt.IsGRPC() {
		return c
	}
	if c == nil || c.FailureAccrual == nil {
		return nil
	}
	return &balancer.BackendConfig{FailureAccrual: c.FailureAccrual}
}

// forwardKey is the backend key of a forward backend: its endpoint's
// address, as the HTTP router sends a forward request to that address (a
// pod's, when the policy is the forward to the target's own endpoint).
func forwardKey(ep *endpoint.Endpoint) string { return ep.Addr.String() }

// forget is owner closing. The state of authority goes with its last open
// resolver; while others remain, a state owner set gives way to the last
// one another compiled, and the ServiceProfile (the same watch's answer
// for every channel to the authority) stays until a remaining resolver's
// watch replaces it.
func (m *mesh) forget(authority string, owner *meshResolver) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.live[authority]
	delete(l, owner)
	if len(l) == 0 {
		delete(m.live, authority)
		if d := m.discovery[authority]; d != nil {
			// A call still waiting goes on, to a closed channel.
			if d.timer != nil {
				d.timer.Stop()
			}
			d.end()
			delete(m.discovery, authority)
		}
		if st := m.states[authority]; st != nil && st.owner == owner {
			delete(m.states, authority)
		}
		if ps := m.profiles[authority]; ps != nil && ps.owner == owner {
			delete(m.profiles, authority)
		}
		return
	}
	if st := m.states[authority]; st != nil && st.owner == owner {
		delete(m.states, authority)
		for _, other := range l {
			if other != nil {
				m.states[authority] = other
				break
			}
		}
	}
}

// lookup returns the routing state and the ServiceProfile of authority
// under one lock, and whether its first answers are in: a call that comes
// before them (waits is true) must wait for them ([mesh.await]). Only a
// target of the inmesh scheme whose resolver can be built (inmesh) has
// answers to wait for: a call to any other never waits.
func (m *mesh) lookup(authority string, inmesh bool) (st *channelState, ps *profileState, waits bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if inmesh && m.cfg.discoveryWait > 0 {
		d := m.discovery[authority]
		waits = d == nil || !closed(d.done)
	}
	return m.states[authority], m.profiles[authority], waits
}

// await waits for the first answers of the target of cc, authority: up to
// the discovery wait since the channel started its watches, or until ctx
// ends (its error as a status). A channel that has no resolver yet, or
// closed it when it went idle, builds it now (grpc-go runs the
// interceptors before it leaves idleness), which starts the watches.
func (m *mesh) await(ctx context.Context, cc *grpc.ClientConn, authority string) error {
	m.mu.Lock()
	d := m.discovery[authority]
	m.mu.Unlock()
	if d == nil {
		cc.Connect()
		m.mu.Lock()
		d = m.discovery[authority]
		m.mu.Unlock()
		if d == nil {
			return nil // not a target of this resolver, or a closed channel
		}
	}
	select {
	case <-d.done:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (m *mesh) state(authority string) *channelState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.states[authority]
}

// profile returns the ServiceProfile state of authority in force, nil
// without one.
func (m *mesh) profile(authority string) *profileState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.profiles[authority]
}
