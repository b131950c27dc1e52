// Package mesh assembles inmesh's layers into the two stacks of a meshed
// service, so that a program does not wire them by hand:
//
//	outbound: router.Router.Transport (ServiceProfiles, then outbound
//	          policies) -> balancer.Balancer -> classify.Transport ->
//	          origproto.Transport -> net/http
//	inbound:  origproto.NewHandler -> router.Router.Handler ->
//	          classify.NewHandler -> the application
//
// classify sits below the balancer on the way out, so that the endpoint's
// labels (dst_*, its address as target_*) are on request_total and
// response_total. Each layer stays usable on its own; this package only
// chooses the order and passes the options through.
package mesh

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/inmesh/inmesh/tap"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/transport"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ClientOption configures [NewClient]; ServerOption configures
// [NewServer]. An Option configures either: the options both stacks share.
// An option of one stack given to the other does not compile.
type (
	ClientOption interface{ applyClient(*config) }
	ServerOption interface{ applyServer(*config) }
	Option       interface {
		ClientOption
		ServerOption
	}
)

// ClientOptions returns shared options as client options, so that a slice
// of them can be given to [NewClient] with options of its own.
func ClientOptions(opts ...Option) []ClientOption {
	out := make([]ClientOption, len(opts))
	for i, o := range opts {
		out[i] = o
	}
	return out
}

// ServerOptions returns shared options as server options, for [NewServer].
func ServerOptions(opts ...Option) []ServerOption {
	out := make([]ServerOption, len(opts))
	for i, o := range opts {
		out[i] = o
	}
	return out
}

// optionFunc is an option of both stacks, clientOption and serverOption
// options of one.
type (
	optionFunc   func(*config)
	clientOption func(*config)
	serverOption func(*config)
)

func (f optionFunc) applyClient(c *config)   { f(c) }
func (f optionFunc) applyServer(c *config)   { f(c) }
func (f clientOption) applyClient(c *config) { f(c) }
func (f serverOption) applyServer(c *config) { f(c) }

type config struct {
	mp             metric.MeterProvider
	logger         *slog.Logger
	dst            *destination.Client
	source         profiles.Source
	policies       policy.Source
	noPolicies     bool
	endpoints      balancer.Source
	balancerOpts   []balancer.Option
	trust          func(*http.Request) bool
	networks       []netip.Prefix
	maxAuthorities int
	idleTimeout    time.Duration
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)
	local          []string
	conns          transport.Limits // see transport.go
	identity       *identity.Local
	discoveryWait  time.Duration
	inbound        []authz.Option
	tap            *tap.Hub
	reg            *registrationConfig // registration.go
	drainDelay     *time.Duration
	mirror         router.MirrorLimits
	tp             trace.TracerProvider
	prop           propagation.TextMapPropagator
}

// WithTap publishes the stack's requests to hub (package tap): a client's
// as outbound events, a server's as inbound ones, each with its route,
// retries and, inbound, the policy's decision and the client's verified
// identity. While nobody watches the hub, a request pays one atomic load.
func WithTap(hub *tap.Hub) Option { return optionFunc(func(c *config) { c.tap = hub }) }

// WithDiscoveryWait lets an outbound request wait up to d for its
// authority's first profile and policy answers before it takes a route
// (see router.WithDiscoveryWait). By default discovery never blocks: the
// first request to an authority takes the default route at once.
func WithDiscoveryWait(d time.Duration) ClientOption {
	return clientOption(func(c *config) { c.discoveryWait = d })
}

// WithMirrorLimits bounds the request mirrors of the outbound policy
// routes (copies in flight per route, time per copy, body size; see
// router.WithMirrorLimits); zero fields keep the defaults.
func WithMirrorLimits(l router.MirrorLimits) ClientOption {
	return clientOption(func(c *config) { c.mirror = l })
}

// WithMeterProvider sets where the metrics go (default: the global
// provider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithLogger sets the logger of the layers (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.logger = l }) }

// WithDestination sets the control-plane client: unless [WithEndpoints] or
// [WithProfiles] say otherwise, it resolves endpoints and supplies the
// profiles.
func WithDestination(d *destination.Client) Option {
	return optionFunc(func(c *config) { c.dst = d })
}

// WithProfiles sets the source of service profiles (default: the
// destination client; with neither, every request takes the default route).
func WithProfiles(src profiles.Source) Option { return optionFunc(func(c *config) { c.source = src }) }

// WithPolicies sets the source of outbound policies (HTTPRoute and
// GRPCRoute) the outbound stack routes by where no ServiceProfile with
// routes applies (default, and with nil: the destination client's
// OutboundPolicies API).
func WithPolicies(src policy.Source) ClientOption {
	return clientOption(func(c *config) {
		if src != nil {
			c.policies, c.noPolicies = src, false
		}
	})
}

// WithoutPolicies turns policy routing off: every request the profiles do
// not route takes the default route.
func WithoutPolicies() ClientOption {
	return clientOption(func(c *config) { c.policies, c.noPolicies = nil, true })
}

// WithEndpoints sets the source of endpoints the outbound stack balances
// over (default: the destination client; with neither, requests go to
// their own address), such as a [balancer.StaticSource].
func WithEndpoints(src balancer.Source) ClientOption {
	return clientOption(func(c *config) { c.endpoints = src })
}

// WithBalancerOptions adds options of the outbound balancer (resolve
// timeout, fallback, peak-EWMA parameters, error penalty). The stack's
// logger, profile source and authority bound come first, so these
// override them.
func WithBalancerOptions(opts ...balancer.Option) ClientOption {
	return clientOption(func(c *config) { c.balancerOpts = append(c.balancerOpts, opts...) })
}

// WithZone makes the outbound balancer zone-aware, zone being the zone the
// process runs in (balancer.WithLocalZone): requests stay with the
// endpoints whose zone label is zone while their load is healthy, and
// spill to the other zones as it rises. Empty: every endpoint alike.
func WithZone(zone string) ClientOption {
	return clientOption(func(c *config) { c.balancerOpts = append(c.balancerOpts, balancer.WithLocalZone(zone)) })
}

// WithTrust sets which inbound peers are mesh peers (see
// origproto.WithTrust).
func WithTrust(f func(*http.Request) bool) ServerOption {
	return serverOption(func(c *config) { c.trust = f })
}

// WithTrustedNetworks adds networks of trusted inbound peers.
func WithTrustedNetworks(nets ...netip.Prefix) ServerOption {
	return serverOption(func(c *config) { c.networks = append(c.networks, nets...) })
}

// WithMaxAuthorities bounds the authorities routed by profile and those
// the balancer keeps endpoints for, and, for the life of the stack,
// classify's authority label values and the balancer's Service labels.
// Keep the destination client's watch bound (destination.WithMaxWatches)
// at least as large: a request whose endpoint watch it refuses gets a 503.
func WithMaxAuthorities(n int) Option { return optionFunc(func(c *config) { c.maxAuthorities = n }) }

// WithIdleTimeout sets how long the stacks keep an authority no request
// used: the router's profile watch, the balancer's endpoint and split
// watches and classify's metric targets are released after it (defaults:
// each layer's own), so that the control-plane client's watch bound frees
// again. d <= 0 changes nothing.
func WithIdleTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.idleTimeout = d
		}
	})
}

// WithDialContext sets how the outbound stack opens connections, to an
// endpoint or a fallback address (default: a net.Dialer); nil changes
// nothing.
func WithDialContext(dial func(ctx context.Context, network, addr string) (net.Conn, error)) ClientOption {
	return clientOption(func(c *config) {
		if dial != nil {
			c.dial = dial
		}
	})
}

// WithLocalAuthorities names the service's own authorities (host:port),
// the only ones the inbound stack routes by profile (see
// router.WithLocalAuthorities) and the only values of its metrics'
// authority label: a request for any other Host is counted under
// authority="other" (classify.WithAuthorities). Without it every inbound
// request takes the default route, no Host a client sends makes the stack
// watch anything, and the authority label is the request's Host, as in
// Linkerd's proxy, within the bound of WithMaxAuthorities: a server that
// untrusted clients reach should name its authorities, or a client naming
// many Hosts takes the label values for the life of the process.
func WithLocalAuthorities(authorities ...string) ServerOption {
	return serverOption(func(c *config) { c.local = append(c.local, authorities...) })
}

// WithIdentity makes the stacks meshed mTLS peers with the identity local:
// the outbound stack reaches every endpoint that discovery gives an
// identity only over mTLS that verifies it (never in plaintext), presenting
// local's certificate; the inbound stack's [Server.Listener] terminates
// mTLS whose SNI is local's name on the same port as plaintext, and gives
// the application the client's verified identity (l5d-client-id,
// identity.PeerFromContext). A meshed connection waits for local's first
// certificate, within the request's context. Without it, nothing is
// encrypted and endpoint identities are ignored; nil changes nothing.
func WithIdentity(local *identity.Local) Option {
	return optionFunc(func(c *config) {
		if local != nil {
			c.identity = local
		}
	})
}

func newClientConfig(opts []ClientOption) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o.applyClient(&c)
		}
	}
	return c.withDefaults()
}

func newServerConfig(opts []ServerOption) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o.applyServer(&c)
		}
	}
	return c.withDefaults()
}

func (c config) withDefaults() config {
	if c.source == nil && c.dst != nil {
		c.source = c.dst
	}
	if c.source == nil {
		c.source = profiles.NewStaticSource(nil)
	}
	if c.policies == nil && !c.noPolicies && c.dst != nil {
		c.policies = c.dst.Policies()
	}
	if c.endpoints == nil && c.dst != nil {
		c.endpoints = c.dst
	}
	return c
}

func (c config) routerOptions() []router.Option {
	return []router.Option{
		router.WithProfiles(c.source), router.WithMeterProvider(c.mp), router.WithLogger(c.logger),
		router.WithMaxAuthorities(c.maxAuthorities), router.WithIdleTimeout(c.idleTimeout),
		router.WithTracerProvider(c.tp), router.WithPropagator(c.prop),
	}
}

func (c config) classifyOptions() []classify.Option {
	return []classify.Option{
		classify.WithMeterProvider(c.mp), classify.WithMaxAuthorities(c.maxAuthorities), classify.WithIdleTimeout(c.idleTimeout),
	}
}

// Client is the outbound stack. Close it to stop its watches.
type Client struct {
	http.RoundTripper
	router   *router.Router
	balancer *balancer.Balancer
	h1       *transport.Recycling
	h2       *http.Transport
	peers    *origproto.Transport
	accepted *connMetrics // the connections of Listener's listeners
	dialled  *dialled     // the connections to the peers, by address
}

// Listener returns ln as a proxy serves its application's outbound
// requests on it, with origproto.NewServer: guarded against ambiguous
// framing (origproto.GuardListener), its connections counted in the tcp_*
// families as Linkerd's proxy counts those of its outbound listener
// (direction="outbound", peer="src"). The stack's own connections to its
// peers are counted whether or not it is served.
func (c *Client) Listener(ln net.Listener) net.Listener {
	return origproto.GuardListener(c.accepted.countAccepted(ln))
}

// NewClient returns the outbound stack. Requests are addressed by Host to a
// service authority; without a source of endpoints they go to that address
// itself. HTTP/1 requests to mesh peers are upgraded to HTTP/2 (orig-proto);
// HTTP/2 and gRPC requests (a net/http-based gRPC client such as
// connect-go, whatever ProtoMajor it sets) go as HTTP/2 with prior
// knowledge, and the errors the stack answers itself reach a gRPC client
// as gRPC statuses.
func NewClient(opts ...ClientOption) *Client {
	c := newClientConfig(opts)
	cl := &Client{}
	if c.dial == nil {
		c.dial = transport.Dialer().DialContext
	}
	cl.dialled = newDialled()
	c.dial = newConnMetrics(c.mp, "outbound", "dst").withAuthorities(c.maxAuthorities).dial(c.dial, cl.dialled)
	cl.accepted = newConnMetrics(c.mp, "outbound", "src")
	cl.h1, cl.h2 = c.transports()
	topts := []origproto.Option{origproto.WithHTTP1(cl.h1), origproto.WithH2(cl.h2), origproto.WithDialContext(c.dial)}
	if c.identity != nil {
		topts = append(topts, origproto.WithClientIdentity(c.identity))
	}
	cl.peers = origproto.NewTransport(topts...)
	// l5d-require-id is checked above the endpoint metrics, so that a
	// refused request is not counted in them, as in Linkerd's proxy.
	next := cl.peers.RequireID(classify.NewTransport(cl.peers, c.classifyOptions()...))
	ropts := append(c.routerOptions(), router.WithPolicies(c.policies), router.WithDiscoveryWait(c.discoveryWait),
		router.WithMirrorLimits(c.mirror))
	if c.endpoints != nil {
		opts := []balancer.Option{
			balancer.WithLogger(c.logger), balancer.WithSplits(profiles.Splits(c.source)), balancer.WithMaxAuthorities(c.maxAuthorities),
			balancer.WithIdleTimeout(c.idleTimeout), balancer.WithMeshTLS(c.identity != nil),
			balancer.WithEndpointRemoved(cl.dialled.closeTo),
		}
		if c.mp != nil {
			opts = append(opts, balancer.WithMeterProvider(c.mp))
		}
		opts = append(opts, c.balancerOpts...)
		cl.balancer = balancer.New(c.endpoints, opts...)
		next = cl.balancer.Transport(next)
		ropts = append(ropts, router.WithBalancer(cl.balancer))
	}
	cl.router = router.New(ropts...)
	cl.RoundTripper = cl.router.Transport(next)
	if c.tap != nil {
		cl.RoundTripper = c.tap.Transport(cl.RoundTripper)
	}
	return cl
}

// Balancer returns the balancer of the stack, nil without a source of
// endpoints.
func (c *Client) Balancer() *balancer.Balancer { return c.balancer }

// Router returns the router of the stack, over ServiceProfiles and outbound
// policies; its Explain says how a request is routed.
func (c *Client) Router() *router.Router { return c.router }

// Close stops the watches and closes idle connections.
func (c *Client) Close() {
	c.router.Close()
	if c.balancer != nil {
		c.balancer.Close()
	}
	c.peers.CloseIdleConnections()
}

// Server is the inbound stack around an application handler.
type Server struct {
	http.Handler
	router   *router.Router
	identity *identity.Local
	authz    *authz.Handler
	reg      *registrations // nil without WithRegistration
	conns    *connMetrics
	tls      *classify.TLSLabels
}

// Listener returns ln as the server must be served on it, with
// origproto.NewServer: guarded against ambiguous framing
// (origproto.GuardListener) and, with [WithIdentity], serving meshed mTLS
// beside plaintext (origproto.MeshTLSListener).
//
// With [WithRegistration], it registers ln's address as the endpoint of
// the registration's authorities.
//
// With [WithInboundPolicy], it starts the watch of ln's port, so that the
// port's policy is on its way before the first request (which waits for
// it, up to authz.WithPolicyWait's bound).
func (s *Server) Listener(ln net.Listener) net.Listener {
	if s.authz != nil {
		if a, ok := ln.Addr().(*net.TCPAddr); ok {
			s.authz.WatchPorts(uint16(a.Port))
		}
	}
	if s.reg != nil {
		s.reg.start(ln.Addr())
	}
	ln = s.conns.wire(ln)
	if s.identity != nil {
		ln = origproto.MeshTLSListener(ln, s.identity)
	}
	return origproto.GuardListener(s.conns.labelled(ln, s.tls, s.authz))
}

// NewServer returns the inbound stack around app. Serve it with
// origproto.NewServer, so that peers can reach it over h2c. HTTP/1
// requests are served full duplex: app may answer, or stream, while the
// request body still arrives. A request that came as HTTP/2 reaches app
// as HTTP/2, trailers and streaming intact, so app may be a grpc.Server
// (which is an http.Handler).
func NewServer(app http.Handler, opts ...ServerOption) *Server {
	c := newServerConfig(opts)
	s := &Server{router: router.New(append(c.routerOptions(), router.WithLocalAuthorities(c.local...))...), identity: c.identity,
		conns: newConnMetrics(c.mp, "inbound", "src"), tls: classify.NewTLSLabels(c.identity != nil)}
	if c.reg != nil {
		s.reg = newRegistrations(c)
	}
	var hopts []origproto.HandlerOption
	if c.trust != nil {
		hopts = append(hopts, origproto.WithTrust(c.trust))
	}
	hopts = append(hopts, origproto.WithTrustedNetworks(c.networks...))
	var next, classified http.Handler
	copts := c.classifyOptions()
	if len(c.local) > 0 {
		// The Host of a request to a server is its client's choice: only
		// the server's own authorities are label values.
		copts = append(copts, classify.WithAuthorities(c.local...))
	}
	if c.inbound == nil {
		next = newEndpointLabels(classify.NewHandler(app, copts...), s.tls)
	} else {
		// The policy gives each allowed request its labels, tls included.
		classified = classify.NewHandler(app, copts...)
		next = classified
	}
	next = s.router.Handler(next)
	if c.inbound != nil {
		// Authorization comes before routing, metrics and the app: a
		// request it refuses is counted in the inbound_http_authz_*
		// families only, as in Linkerd's proxy. An allowed one carries
		// its target, srv_*, route_*, authz_* and tls labels into the
		// inbound request and response metrics.
		// Each series of allowed requests has its own handler in front of
		// the same router, metrics and app, labelled with the series'
		// labels: they cost a request no new context.
		labelled := func(l *classify.Labels) http.Handler {
			return s.router.Handler(classify.HandlerWithLabels(classified, l))
		}
		opts := []authz.Option{authz.WithMeterProvider(c.mp), authz.WithLogger(c.logger), authz.WithLabelledNext(labelled)}
		if c.identity != nil {
			opts = append(opts, authz.WithMeshTLS())
		}
		opts = append(opts, c.inbound...)
		h, err := authz.New(next, opts...)
		if err != nil {
			panic("mesh: NewServer: WithInboundPolicy: " + err.Error())
		}
		s.authz, next = h, h
	}
	serverID := ""
	if c.identity != nil {
		serverID = c.identity.Name()
	}
	next = meshtrace.New(c.tp, c.prop, serverID).Handler(next)
	s.Handler = origproto.NewHandler(next, hopts...)
	if c.tap != nil {
		s.Handler = c.tap.Handler(s.Handler)
	}
	return s
}

// WithInboundPolicy makes the server enforce inbound policy (package
// authz) before the application sees a request: who may call which
// route, rate limits and a limit of requests in flight, per port, from
// the Servers that opts' authz.WithSource delivers. A port's watch starts
// when [Server.Listener] wraps its listener (or at its first request), and
// a request to a port whose first answer is pending waits for it, up to
// authz.WithPolicyWait's bound (default authz.DefaultPolicyWait); only
// past it does authz.WithDefault's Server (default: all-unauthenticated)
// decide, logged and counted, until the answer arrives.
// The stack's meter provider and logger apply unless opts set others.
// NewServer panics when the default Server does not compile.
func WithInboundPolicy(opts ...authz.Option) ServerOption {
	return serverOption(func(c *config) { c.inbound = append(c.inbound, opts...) })
}

// endpointLabels gives the inbound request metrics of a classify handler
// Linkerd's inbound endpoint labels where no policy gives them: the
// client's tls labels (classify.TLSLabels) by its verified identity, and
// the target_addr, target_ip and target_port of the address its
// connection was accepted on (classify.TLSLabels.ForTarget). Each label
// set has a handler of its own (classify.HandlerWithLabels), made once and
// kept, so that a request costs no context or request copy.
type endpointLabels struct {
	next http.Handler // made by classify.NewHandler
	tls  *classify.TLSLabels

	mu       sync.RWMutex
	handlers map[*classify.Labels]http.Handler // bounded by maxEndpointHandlers
}

// maxEndpointHandlers bounds the handlers endpointLabels keeps, as the
// label sets they are made for are bounded; past it, a request's handler
// is made for it.
const maxEndpointHandlers = 4096

func newEndpointLabels(next http.Handler, tls *classify.TLSLabels) *endpointLabels {
	return &endpointLabels{next: next, tls: tls, handlers: make(map[*classify.Labels]http.Handler)}
}

func (h *endpointLabels) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	peer, _ := identity.PeerFromContext(r.Context())
	var target netip.AddrPort
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		target = a.AddrPort()
	}
	l := h.tls.ForTarget(peer.TLS, peer.ID, target)
	h.mu.RLock()
	next := h.handlers[l]
	h.mu.RUnlock()
	if next == nil {
		next = classify.HandlerWithLabels(h.next, l)
		h.mu.Lock()
		if len(h.handlers) < maxEndpointHandlers {
			h.handlers[l] = next
		}
		h.mu.Unlock()
	}
	next.ServeHTTP(w, r)
}

// InboundPolicy returns the handler enforcing [WithInboundPolicy], for
// introspection (authz.Handler.Explain); nil without it.
func (s *Server) InboundPolicy() *authz.Handler { return s.authz }

// Router returns the router of the stack, which routes inbound requests by
// the ServiceProfiles of the local authorities.
func (s *Server) Router() *router.Router { return s.router }

// Close deregisters the server's endpoints ([WithRegistration]) and stops the watches. With [WithInboundPolicy], the ports whose
// policy never arrived refuse their requests from then on (authz.Handler.Close).
func (s *Server) Close() {
	if s.reg != nil {
		s.reg.deregister(context.Background())
	}
	s.router.Close()
	if s.authz != nil {
		s.authz.Close()
	}
}
