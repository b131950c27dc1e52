package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/cpaddr"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/proxyapi/registrationpb"
)

// boundHook, when set (by tests), runs after a registration subscribed to
// its binding and before it checks the binding once more.
var boundHook atomic.Pointer[func()]

// The bounds of what one registrant can make the control plane hold,
// unless [WithRegistrationLimits] sets others. An endpoint's labels are
// bounded as in an endpoints file (manifest.CheckLabels).
const (
	// DefaultMaxRegisteredEndpoints bounds the endpoints of one
	// registration (one stream).
	DefaultMaxRegisteredEndpoints = 64
	// DefaultMaxRegistrationsPerIdentity bounds the registrations (open
	// streams) of one identity on one replica (of one IP address for
	// plaintext callers, with insecure registration).
	DefaultMaxRegistrationsPerIdentity = 16
)

// The reasons of registration_refused_total.
const (
	RefusedPlaintext = "plaintext" // a caller without a verified identity
	RefusedIdentity  = "identity"  // an endpoint with another identity than the caller's
	RefusedService   = "service"   // a Service (or port) the caller may not serve
	RefusedInvalid   = "invalid"   // a malformed request or endpoint
	RefusedLimit     = "limit"     // past a bound of WithRegistrationLimits or of the labels
	RefusedAddress   = "address"   // an address that an endpoint of another identity holds
)

// Registry keeps the endpoints that workloads register: [Store] itself by
// default (the replica's memory), or etcd (package etcdstore) so that every
// replica serves them. Implementations are safe for concurrent use.
type Registry interface {
	// Open starts a registration, empty until Put.
	Open(ctx context.Context) (Lease, error)
}

// Lease is one registration: its endpoints stay registered until Release,
// or until the Registry loses it (Lost closed), as an etcd lease that
// expired.
type Lease interface {
	// Put replaces the registration's endpoints, by authority.
	Put(ctx context.Context, sets map[string][]endpoint.Endpoint) error
	// Release removes the endpoints at once when remove is true; else
	// (the replica is shutting down, the workload will register again
	// elsewhere) it leaves them to expire, when the Registry has a bound
	// on their life.
	Release(ctx context.Context, remove bool) error
	// Lost is closed when the registration ended without Release.
	Lost() <-chan struct{}
}

type registrationConfig struct {
	registry       Registry
	insecure       bool
	maxEndpoints   int
	maxPerIdentity int
	mp             metric.MeterProvider
}

// WithRegistry sets where the registration server keeps registered
// endpoints (default: the Server's [Store], in memory). Nil changes
// nothing.
func WithRegistry(r Registry) Option {
	return optionFunc(func(c *config) {
		if r != nil {
			c.reg.registry = r
		}
	})
}

// WithInsecureRegistration lets callers without a verified mTLS identity
// register, for development: their endpoints carry the identity they claim
// (none, usually), for any Service of the cluster's name form, unchecked.
// The Server logs a warning when it is built with it.
func WithInsecureRegistration() Option {
	return optionFunc(func(c *config) { c.reg.insecure = true })
}

// WithRegistrationLimits bounds the endpoints of one registration and the
// open registrations of one identity (defaults
// [DefaultMaxRegisteredEndpoints] and
// [DefaultMaxRegistrationsPerIdentity]); a value <= 0 keeps its default.
func WithRegistrationLimits(maxEndpoints, maxPerIdentity int) Option {
	return optionFunc(func(c *config) {
		if maxEndpoints > 0 {
			c.reg.maxEndpoints = maxEndpoints
		}
		if maxPerIdentity > 0 {
			c.reg.maxPerIdentity = maxPerIdentity
		}
	})
}

// WithMeterProvider sets the meter provider of the Server's metrics
// (registration_refused_total, stream_refused_total); default
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.reg.mp = mp })
}

// registrationServer serves the Registration API of a Server.
type registrationServer struct {
	registrationpb.UnimplementedRegistrationServer
	s        *Server
	cfg      registrationConfig
	log      *ratelog.Logger
	refused  metric.Int64Counter
	open     *peerCounts // registrations by peer
	refusals map[string]metric.AddOption
}

func newRegistrationServer(s *Server, cfg config) *registrationServer {
	rc := cfg.reg
	if rc.registry == nil {
		rc.registry = storeRegistry{s.store}
	}
	if rc.maxEndpoints <= 0 {
		rc.maxEndpoints = DefaultMaxRegisteredEndpoints
	}
	if rc.maxPerIdentity <= 0 {
		rc.maxPerIdentity = DefaultMaxRegistrationsPerIdentity
	}
	r := &registrationServer{s: s, cfg: rc, log: ratelog.New(cfg.logger, cfg.logInterval), open: newPeerCounts(rc.maxPerIdentity),
		refusals: make(map[string]metric.AddOption)}
	var err error
	if r.refused, err = metrics.Meter(rc.mp, ScopeName).Int64Counter("registration_refused_total",
		metric.WithDescription("Endpoint registrations refused, by reason: plaintext, identity, service, invalid, limit or address.")); err != nil {
		otel.Handle(err)
	}
	for _, reason := range []string{RefusedPlaintext, RefusedIdentity, RefusedService, RefusedInvalid, RefusedLimit, RefusedAddress} {
		r.refusals[reason] = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", reason)))
	}
	if rc.insecure {
		cfg.logger.Warn("controlplane: INSECURE REGISTRATION: callers without a verified mTLS identity may register endpoints, unchecked; for development only")
	}
	return r
}

// refusal is a refused registration: its gRPC error and metric reason.
type refusal struct {
	reason string
	err    error
}

func (r *registrationServer) refuse(ctx context.Context, f *refusal) error {
	if r.refused != nil {
		r.refused.Add(ctx, 1, r.refusals[f.reason])
	}
	r.log.WarnErr("registration refused "+f.reason, "controlplane: refused a registration", f.err, "reason", f.reason)
	return f.err
}

// callerOf returns the caller's verified identity: that of a TLS
// connection whose client certificate verified (credentials.TLSInfo with
// verified chains, as a server with identity.Local's ServerConfig makes
// it); "" and false for a plaintext caller or one without a certificate.
func callerOf(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", false
	}
	id := identity.PeerFromState(&info.State).ID
	return id, id != ""
}

// Register serves one registration stream (see the Registration API in
// proto/registration.proto).
func (r *registrationServer) Register(stream grpc.BidiStreamingServer[registrationpb.RegisterRequest, registrationpb.RegisterResponse]) error {
	ctx := stream.Context()
	caller, verified := callerOf(ctx)
	if !verified && !r.cfg.insecure {
		return r.refuse(ctx, &refusal{RefusedPlaintext, status.Error(codes.PermissionDenied,
			"registration: the caller has no verified mTLS identity; register over mTLS with the workload's identity (a plaintext registrant is accepted only by a control plane started with insecure registration)")})
	}
	stop, err := r.s.begin()
	if err != nil {
		return err
	}
	defer r.s.streams.Done()
	// Plaintext callers (insecure registration) are counted by address.
	p := peerOf(ctx)
	if !r.open.acquire(p.key) {
		return r.refuse(ctx, &refusal{RefusedLimit, status.Errorf(codes.ResourceExhausted,
			"registration: %s already holds %d registrations, the most one replica keeps", p, r.cfg.maxPerIdentity)})
	}
	defer r.open.release(p.key, 1)

	reqs := make(chan *registrationpb.RegisterRequest)
	recvErr := make(chan error, 1)
	go r.receive(stream, reqs, recvErr)

	var lease Lease
	lost := (<-chan struct{})(nil)
	// While endpoints are registered, the stream watches the Services they
	// serve: a manifest change that no longer binds the caller's identity
	// to one of them (its Pod or annotation gone, the port removed) ends
	// the registration as a refusal would have refused it.
	var (
		accepted []*registrationpb.Endpoint
		binding  *waiter
		rebound  <-chan struct{}
	)
	unwatch := func() {
		if binding != nil {
			r.s.store.unsubscribe(binding)
			binding, rebound = nil, nil
		}
	}
	defer unwatch()
	// release ends the lease: with remove, its endpoints go at once (or,
	// when that fails, with the lease), else they are left to the lease.
	release := func(remove bool) error {
		if lease == nil {
			return nil
		}
		// The stream's context may be gone: the release gets its own.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownReleaseTimeout)
		defer cancel()
		err := lease.Release(rctx, remove)
		if err != nil {
			r.log.WarnErr("registration release", "controlplane: cannot release a registration; its lease will expire", err, "identity", caller)
		}
		return err
	}
	// leaving reports whether the Server shuts down or went on standby:
	// the workload registers again with another replica, and its
	// endpoints stay until their lease expires, so that callers never
	// see them gone meanwhile.
	leaving := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for {
		select {
		case req := <-reqs:
			switch k := req.GetKind().(type) {
			case *registrationpb.RegisterRequest_Endpoints:
				sets, n, f := r.check(caller, verified, k.Endpoints.GetEndpoints())
				if f != nil {
					_ = release(true)
					return r.refuse(ctx, f)
				}
				if lease == nil {
					var err error
					if lease, err = r.cfg.registry.Open(ctx); err != nil {
						return status.Errorf(codes.Unavailable, "registration: cannot open a registration: %v", err)
					}
					lost = lease.Lost()
				}
				if err := lease.Put(ctx, sets); err != nil {
					_ = release(true)
					return status.Errorf(codes.Unavailable, "registration: cannot register: %v", err)
				}
				if err := stream.Send(&registrationpb.RegisterResponse{Kind: &registrationpb.RegisterResponse_Accepted{
					Accepted: &registrationpb.Accepted{Endpoints: uint32(n), Identity: caller}}}); err != nil {
					_ = release(!leaving())
					return err
				}
				if verified {
					unwatch()
					accepted = k.Endpoints.GetEndpoints()
					binding = r.s.store.subscribe(bindingKeys(sets)...)
					rebound = binding.c
					if h := boundHook.Load(); h != nil {
						(*h)()
					}
					// A change between the check and the subscription
					// is not missed: check once more now. A change since
					// the subscription may have filled the one slot
					// already, which asks for the same check.
					select {
					case binding.c <- struct{}{}:
					default:
					}
				}
			case *registrationpb.RegisterRequest_Deregister:
				if err := release(true); err != nil {
					// The workload must not take the endpoints for gone
					// (and close its listener) while callers may still
					// be given them.
					return status.Errorf(codes.Unavailable,
						"registration: cannot remove the endpoints now (%v): they stay in the answers until the registration's lease expires", err)
				}
				return stream.Send(&registrationpb.RegisterResponse{Kind: &registrationpb.RegisterResponse_Deregistered{
					Deregistered: &registrationpb.Deregistered{}}})
			default:
				_ = release(true)
				return r.refuse(ctx, &refusal{RefusedInvalid, status.Error(codes.InvalidArgument, "registration: a request with neither endpoints nor deregister")})
			}
		case err := <-recvErr:
			// The workload closed its side, went away or broke: its
			// endpoints go at once. A connection closed by the Server's
			// standby is not the workload's end.
			_ = release(!leaving())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-rebound:
			if _, _, f := r.check(caller, verified, accepted); f != nil {
				_ = release(true)
				f.err = status.Errorf(status.Code(f.err), "%s (the manifests changed after the registration was accepted)", status.Convert(f.err).Message())
				return r.refuse(ctx, f)
			}
		case <-lost:
			return status.Error(codes.Unavailable, "registration: the registration's lease was lost; register again")
		case <-stop:
			// The Server shuts down or went on standby.
			_ = release(false)
			return r.s.stopErr()
		}
	}
}

// bindingKeys returns the keys of the Services that sets (by authority)
// serve: a change to the manifests wakes them (manifestsChangedLocked).
func bindingKeys(sets map[string][]endpoint.Endpoint) []watchKey {
	keys := make([]watchKey, 0, len(sets))
	seen := make(map[serviceRef]bool, len(sets))
	for authority := range sets {
		host, _, err := hostAndPort(authority)
		if err != nil {
			continue
		}
		ref, _, err := clusterService(host)
		if err != nil || seen[ref] {
			continue
		}
		seen[ref] = true
		keys = append(keys, serviceKey(ref))
	}
	return keys
}

// shutdownReleaseTimeout bounds the removal of a registration.
const shutdownReleaseTimeout = 5 * time.Second

// receive reads the stream's requests until it fails.
func (r *registrationServer) receive(stream grpc.BidiStreamingServer[registrationpb.RegisterRequest, registrationpb.RegisterResponse], out chan<- *registrationpb.RegisterRequest, errc chan<- error) {
	for {
		req, err := stream.Recv()
		if err != nil {
			errc <- err
			return
		}
		select {
		case out <- req:
		case <-stream.Context().Done():
			errc <- stream.Context().Err()
			return
		}
	}
}

// peerHost returns the IP address of the caller.
func peerHost(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
			return ap.Addr().String()
		}
		return p.Addr.String()
	}
	return ""
}

// check validates and authorizes the endpoints of a request and returns
// them by authority, with their number. An endpoint listed twice (one
// authority, one address) is invalid: over etcd both would be one key.
// An address that the endpoints file or a registration gives with another
// identity (another workload's, or another registrant's) is refused
// FailedPrecondition: a registrant may not take over the address of
// another workload, whose clients would then expect the registrant's
// identity and protocol there (GetProfile of the address). The same
// identity may give an address again (a workload that restarted while its
// last lease runs, an address the file gives it too).
func (r *registrationServer) check(caller string, verified bool, eps []*registrationpb.Endpoint) (map[string][]endpoint.Endpoint, int, *refusal) {
	if len(eps) > r.cfg.maxEndpoints {
		return nil, 0, &refusal{RefusedLimit, status.Errorf(codes.ResourceExhausted,
			"registration: %d endpoints, more than the %d one registration may hold", len(eps), r.cfg.maxEndpoints)}
	}
	type listed struct {
		authority string
		addr      netip.AddrPort
	}
	sets := make(map[string][]endpoint.Endpoint)
	allowed := make(map[serviceRef]bool)
	seen := make(map[listed]int, len(eps))
	parsed := make([]registered, 0, len(eps))
	for i, pe := range eps {
		e, authority, ref, f := parseRegistered(i, pe)
		if f != nil {
			return nil, 0, f
		}
		if first, dup := seen[listed{authority, e.Addr}]; dup {
			return nil, 0, &refusal{RefusedInvalid, status.Errorf(codes.InvalidArgument,
				"registration: endpoints[%d] repeats endpoints[%d] (%s of %s): list each endpoint once", i, first, e.Addr, authority)}
		}
		seen[listed{authority, e.Addr}] = i
		switch {
		case verified && e.Identity == "":
			e.Identity = caller
		case verified && e.Identity != caller:
			return nil, 0, &refusal{RefusedIdentity, status.Errorf(codes.PermissionDenied,
				"registration: endpoints[%d] (%s of %s) carries identity %q, but the caller is %q: an endpoint carries only its registrant's identity",
				i, e.Addr, authority, e.Identity, caller)}
		}
		if verified {
			ok, seen := allowed[ref]
			if !seen {
				ok = r.s.store.mayRegister(caller, ref)
				allowed[ref] = ok
			}
			if !ok {
				return nil, 0, &refusal{RefusedService, status.Errorf(codes.PermissionDenied,
					"registration: identity %q may not serve Service %s/%s (endpoints[%d], %s): neither a Pod its selector matches runs as that service account nor its %s annotation lists it",
					caller, ref.ns, ref.name, i, authority, manifest.AnnotationRegistrationIdentities)}
			}
			if _, port, _ := hostAndPort(authority); !r.s.store.definesPort(ref, port) {
				return nil, 0, &refusal{RefusedService, status.Errorf(codes.PermissionDenied,
					"registration: identity %q may not register port %d of Service %s/%s (endpoints[%d]): the Service does not define it",
					caller, port, ref.ns, ref.name, i)}
			}
		}
		sets[authority] = append(sets[authority], e)
		parsed = append(parsed, registered{i: i, authority: authority, e: e})
	}
	if f := r.s.store.addressTaken(parsed); f != nil {
		return nil, 0, f
	}
	return sets, len(eps), nil
}

// registered is endpoint i of a request, parsed.
type registered struct {
	i         int
	authority string
	e         endpoint.Endpoint
}

// addressTaken refuses the first endpoint of a request whose address the
// store holds with another identity, or that the request gives with two
// identities (with insecure registration, endpoints carry the identity
// they claim); nil when there is none.
func (s *Store) addressTaken(eps []registered) *refusal {
	addrs := make(map[netip.AddrPort]bool, len(eps))
	for _, r := range eps {
		addrs[r.e.Addr] = true
	}
	s.mu.Lock()
	claims := s.addressClaimsLocked(addrs)
	s.mu.Unlock()
	mine := make(map[netip.AddrPort]registered, len(eps))
	for _, r := range eps {
		var holder *claim
		if prev, ok := mine[r.e.Addr]; ok && prev.e.Identity != r.e.Identity {
			holder = &claim{identity: prev.e.Identity, authority: prev.authority}
		}
		mine[r.e.Addr] = r
		for id, c := range claims[r.e.Addr] {
			if id != r.e.Identity && (holder == nil || c.before(*holder)) {
				holder = &c
			}
		}
		if holder != nil {
			return &refusal{RefusedAddress, status.Errorf(codes.FailedPrecondition,
				"registration: endpoints[%d] (%s of %s, identity %q): the address is held by %s; a workload may not register another's address",
				r.i, r.e.Addr, r.authority, r.e.Identity, *holder)}
		}
	}
	return nil
}

// parseRegistered reads endpoint i of a request.
func parseRegistered(i int, pe *registrationpb.Endpoint) (endpoint.Endpoint, string, serviceRef, *refusal) {
	invalid := func(format string, args ...any) *refusal {
		return &refusal{RefusedInvalid, status.Errorf(codes.InvalidArgument, "registration: endpoints[%d]: %s", i, fmt.Sprintf(format, args...))}
	}
	host, port, err := hostAndPort(pe.GetAuthority())
	if err != nil || pe.GetAuthority() == "" {
		return endpoint.Endpoint{}, "", serviceRef{}, invalid("authority %q: want name.ns.svc.cluster.local:port", pe.GetAuthority())
	}
	ref, instance, err := clusterService(host)
	if err != nil || instance != "" {
		return endpoint.Endpoint{}, "", serviceRef{}, invalid("authority %q: want name.ns.svc.cluster.local:port", pe.GetAuthority())
	}
	addr, err := netip.ParseAddrPort(pe.GetAddr())
	if err != nil || addr.Port() == 0 || addr.Addr().IsUnspecified() || addr.Addr().Zone() != "" {
		return endpoint.Endpoint{}, "", serviceRef{}, invalid("addr %q: want ip:port of the workload", pe.GetAddr())
	}
	if err := manifest.CheckLabels(pe.GetLabels()); err != nil {
		return endpoint.Endpoint{}, "", serviceRef{}, &refusal{RefusedLimit, status.Errorf(codes.ResourceExhausted, "registration: endpoints[%d].labels: %v", i, err)}
	}
	if pe.GetIdentity() != "" && identity.CheckName(pe.GetIdentity()) != nil {
		return endpoint.Endpoint{}, "", serviceRef{}, invalid("identity %q is not an identity name", pe.GetIdentity())
	}
	e := endpoint.Endpoint{
		Addr:     netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port()),
		Weight:   pe.GetWeight(),
		Identity: pe.GetIdentity(),
		H2:       pe.GetProtocol() == registrationpb.ProtocolHint_PROTOCOL_HINT_H2,
		Opaque:   pe.GetProtocol() == registrationpb.ProtocolHint_PROTOCOL_HINT_OPAQUE,
	}
	if len(pe.GetLabels()) > 0 {
		e.Labels = make(map[string]string, len(pe.GetLabels()))
		for k, v := range pe.GetLabels() {
			e.Labels[k] = v
		}
	}
	return e, host + ":" + strconv.FormatUint(uint64(port), 10), ref, nil
}

// mayRegister reports whether identity id may register endpoints of the
// Service ref (manifest.Resources.RegistrationIdentities).
func (s *Store) mayRegister(id string, ref serviceRef) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.manifests == nil {
		return false
	}
	for _, allowed := range s.manifests.RegistrationIdentities(ref.ns, ref.name, s.inbound) {
		if allowed == id {
			return true
		}
	}
	return false
}

// definesPort reports whether the Service ref's manifest defines port.
func (s *Store) definesPort(ref serviceRef, port uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.manifests == nil {
		return false
	}
	svc := s.manifests.Service(ref.ns, ref.name)
	return svc != nil && port <= 0xffff && svc.HasPort(uint16(port))
}

// storeRegistry is the default Registry: the Store's memory.
type storeRegistry struct{ store *Store }

var registrationIDs atomic.Uint64

func (r storeRegistry) Open(context.Context) (Lease, error) {
	return &storeLease{store: r.store, id: "registration/" + strconv.FormatUint(registrationIDs.Add(1), 10)}, nil
}

type storeLease struct {
	store *Store
	id    string
}

func (l *storeLease) Put(_ context.Context, sets map[string][]endpoint.Endpoint) error {
	l.store.PutRegistered(l.id, sets)
	return nil
}

// Release removes the endpoints either way: a Store's registrations do
// not outlive its process.
func (l *storeLease) Release(context.Context, bool) error {
	l.store.DeleteRegistered(l.id)
	return nil
}

func (l *storeLease) Lost() <-chan struct{} { return nil }

// KeepaliveOptions are the options of a grpc.Server serving the
// Registration API whose registrations last ttl past a replica's death
// (etcdstore's lease TTL): after ttl/2 without a frame from a client the
// server pings it, and closes the connection when no answer comes within
// ttl/2 more. A registrant whose host went away or whose process froze
// (no FIN, no RST) then loses its registration within about ttl, as it
// would lose its lease; a live client's gRPC library answers the pings by
// itself. The server also lets clients ping it as often as every 10 s,
// the most often gRPC clients ping (registration.Dial does,
// [destination.WithKeepalive] and identity.Config.Keepalive may), so that
// a client notices a replica that froze as soon; a gRPC server's default
// would close such a client's connection.
func KeepaliveOptions(ttl time.Duration) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: ttl / 2, Timeout: ttl / 2}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: MinClientPing, PermitWithoutStream: true}),
	}
}

// MinClientPing is how often [KeepaliveOptions] lets a client ping: the
// most often gRPC clients ping.
const MinClientPing = cpaddr.MinPing
