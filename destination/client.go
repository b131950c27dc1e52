package destination

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/cpaddr"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// ErrRejected is wrapped by the error of an update when the control plane
// rejected the lookup (InvalidArgument or FailedPrecondition): the watch has
// stopped, with no profile and no endpoints.
var ErrRejected = errors.New("destination: lookup rejected by the control plane")

// ErrClosed is returned by the watch methods of a closed [Client].
var ErrClosed = errors.New("destination: client closed")

// errTooManyWatches wraps profiles.ErrTooManyWatches for both kinds.
var errTooManyWatches = profiles.ErrTooManyWatches

// Client watches endpoints and service profiles through the Destination API.
// It is a [profiles.Source]. A Client is safe for concurrent use; Close
// releases it.
type Client struct {
	api  pb.DestinationClient
	conn *grpc.ClientConn // closed by Close when the client made it
	cfg  config
	log  *ratelog.Logger // every line a stream or an update can trigger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	close  sync.Once

	profiles  *watches[*pb.DestinationProfile, profiles.Update]
	endpoints *watches[*pb.Update, endpoint.Update]
	policies  *watches[*outboundpb.OutboundPolicy, policy.Update]
	policyAPI outboundpb.OutboundPoliciesClient
	inbound   *watches[*inboundpb.Server, InboundUpdate]
	// reach is the last error met on the way to the control plane, which
	// the inbound policy source gives as the cause of a port's missing
	// policy (authz.PendingCause).
	reach *reach
	// mux carries the profile, endpoint and policy watches when the
	// control plane serves inmesh's Watches service; nil with
	// WithLinkerdStreams.
	mux *mux
}

var (
	_ profiles.Source = (*Client)(nil)
	_ profiles.Cache  = (*Client)(nil)
)

// NewClient returns a Client that makes its calls on cc. The caller keeps
// ownership of cc and must close it after the Client.
func NewClient(cc grpc.ClientConnInterface, opts ...Option) *Client {
	cfg := newConfig(opts)
	c := &Client{api: pb.NewDestinationClient(cc), cfg: cfg, log: ratelog.New(cfg.logger, cfg.logInterval), reach: cfg.reach}
	if c.reach == nil {
		c.reach = new(reach)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if !cfg.linkerdStreams {
		c.mux = &mux{api: watchespb.NewWatchesClient(cc), ctx: c.ctx, timeout: cfg.firstMessageTimeout, wg: &c.wg}
	}
	c.profiles = &watches[*pb.DestinationProfile, profiles.Update]{
		c: c,
		kind: &kind[*pb.DestinationProfile, profiles.Update]{
			name: "GetProfile",
			open: func(ctx context.Context, authority string, s sink[*pb.DestinationProfile], opts ...grpc.CallOption) (recvStream[*pb.DestinationProfile], error) {
				if c.mux != nil {
					if ok, err := subscribeMux(ctx, c.mux, watchespb.Kind_PROFILE, c.request(authority), s, opts); ok || err != nil {
						return nil, err
					}
				}
				return c.api.GetProfile(ctx, c.request(authority), opts...)
			},
			decode: c.decodeProfile,
			rejected: func(err error) profiles.Update {
				return profiles.Update{Err: fmt.Errorf("%w: %w", profiles.ErrNoProfile, err)}
			},
			// A Service that does not exist has no profile: the default
			// route applies, as for a name outside the search path.
			notFound:   func() profiles.Update { return noProfile },
			unanswered: func(err error) profiles.Update { return profiles.Update{Err: err} },
		},
		m: make(map[string]*watch[*pb.DestinationProfile, profiles.Update]),
	}
	c.endpoints = &watches[*pb.Update, endpoint.Update]{
		c: c,
		kind: &kind[*pb.Update, endpoint.Update]{
			name: "Get",
			open: func(ctx context.Context, authority string, s sink[*pb.Update], opts ...grpc.CallOption) (recvStream[*pb.Update], error) {
				if c.mux != nil {
					if ok, err := subscribeMux(ctx, c.mux, watchespb.Kind_ENDPOINTS, c.request(authority), s, opts); ok || err != nil {
						return nil, err
					}
				}
				return c.api.Get(ctx, c.request(authority), opts...)
			},
			decode:   c.decodeEndpoints,
			rejected: func(err error) endpoint.Update { return endpoint.Update{Err: err} },
			// Linkerd's controller stays silent for a service that exists
			// with no endpoints (it never sends no_endpoints{exists: true}).
			silent: func() endpoint.Update { return endpoint.Update{Set: &endpoint.Set{Exists: true}} },
			// Linkerd's controller answers a Service that does not exist
			// NotFound: no such service, as no_endpoints{exists: false}
			// says it.
			notFound: func() endpoint.Update { return noService },
		},
		m: make(map[string]*watch[*pb.Update, endpoint.Update]),
	}
	c.initPolicies(cc)
	c.initInbound(cc)
	return c
}

// Dial returns a Client over a new plaintext gRPC connection to target (a
// host:port, or any gRPC target), which Close closes.
//
// A target that lists several control-plane replicas, comma-separated
// ("10.0.0.1:8086,10.0.0.2:8086"), reaches the first of them that accepts
// a connection; when that connection is lost (the replica died) the client
// moves to the next live one, in the order given, and every watch
// re-opens its stream there with the last state it delivered still in
// force (as after any reconnect; see [Client.WatchEndpoints]). A replica
// lost without closing the connection (its host gone, a frozen process)
// is noticed by the silence of the connection: see [WithKeepalive]. A DNS name
// with several addresses ("dns:///destination.example:8086", or the name
// alone) fails over the same way through gRPC's DNS resolver. Connection attempts go
// through a [backoff.Dialer] with the client's backoff policy, so that a
// control plane that cannot be reached is retried after a delay, never in a
// tight loop. That one policy governs reconnection: gRPC's own connection
// backoff is turned off, and a watch's stream waits for the connection
// rather than failing and backing off on its own while the control plane
// is down, so that watches resume within the policy's maximum delay of the
// control plane's return. Dial does not wait for the connection. An
// invalid backoff policy (see [backoff.Policy.Validate]) is an error, and
// so is a workload ([WithWorkload]) that [ParseWorkload] refuses.
func Dial(target string, opts ...Option) (*Client, error) {
	cfg := newConfig(opts)
	if err := cfg.policy.Validate(); err != nil {
		return nil, fmt.Errorf("destination: WithBackoff: %w", err)
	}
	if cfg.workload != "" {
		if _, _, err := ParseWorkload(cfg.workload); err != nil {
			return nil, fmt.Errorf("destination: WithWorkload: %w", err)
		}
	}
	ka := cfg.keepalive
	if len(cfg.dialOptions) > 0 {
		// Options of the caller's may set gRPC's keepalive otherwise,
		// and come last: what gRPC will use is not known here.
		ka.Time = cpaddr.NoPing
	}
	rec := new(reach)
	dialer := backoff.NewDialer(recordingDial(userTimeoutDial(cfg.dial, ka), rec), cfg.policy)
	dialOpts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer.DialGRPC),
		// The Dialer holds each attempt back; gRPC's own reconnect delay
		// would only add to it.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: time.Millisecond, Multiplier: 1, MaxDelay: time.Millisecond},
			MinConnectTimeout: 20 * time.Second,
		}),
		// A replica lost without a reset is noticed by its silence.
		grpc.WithKeepaliveParams(cfg.keepalive),
	}, cfg.dialOptions...)
	grpcTarget := target
	if cpaddr.IsList(target) && !strings.Contains(target, "://") {
		var resolve grpc.DialOption
		var err error
		if grpcTarget, resolve, err = cpaddr.Target(target); err != nil {
			return nil, fmt.Errorf("destination: dial %s: %w", target, err)
		}
		dialOpts = append(dialOpts, resolve)
	}
	conn, err := grpc.NewClient(grpcTarget, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("destination: dial %s: %w", target, err)
	}
	c := NewClient(conn, append(opts[:len(opts):len(opts)], optionFunc(func(c *config) { c.reach = rec }))...)
	c.conn = conn
	return c, nil
}

// Close stops every watch, waits for their goroutines and, for a client
// made by [Dial], closes the connection. It is safe to call more than once.
func (c *Client) Close() error {
	var err error
	c.close.Do(func() {
		c.cancel()
		c.profiles.stopAll()
		c.endpoints.stopAll()
		c.policies.stopAll()
		c.inbound.stopAll()
		c.wg.Wait()
		if c.conn != nil {
			err = c.conn.Close()
		}
	})
	return err
}

// Watch implements [profiles.Source]: it streams the service profile of
// authority (host:port) from GetProfile. A part of a profile that does not
// convert is left out and logged, and the rest applies (see
// [ProfileFromProto]). When the control
// plane rejects the lookup the last update has a nil Profile and an Err
// wrapping [profiles.ErrNoProfile] and [ErrRejected].
func (c *Client) Watch(ctx context.Context, authority string, update func(profiles.Update)) (func(), error) {
	if !c.inScope(authority) {
		return outOfScope(c, ctx, noProfile, update), nil
	}
	return c.profiles.subscribe(c, ctx, authority, update)
}

// CachedProfile returns the last profile update of authority, when the
// client watches it and an answer came: it makes the Client a
// [profiles.Cache], so that a traffic split (profiles.Splits) starts from
// the profile the client already has.
func (c *Client) CachedProfile(authority string) (profiles.Update, bool) {
	if !c.inScope(authority) {
		return profiles.Update{}, false
	}
	return c.profiles.cached(authority)
}

// WatchEndpoints streams the endpoint set of authority (host:port) from Get,
// with the semantics of [profiles.Source.Watch]; it makes the Client a
// balancer.Source. After a reconnect the last set stays in force until the
// new stream's first message replaces it, however long the new stream stays
// silent (a wedged control plane that accepts streams and never answers
// cannot take it away). A first stream of an authority that stays silent
// past the first-message deadline (see [WithFirstMessageTimeout]) is kept
// open and stands for a service that exists with no endpoints yet, as with
// Linkerd's controller: an update with Exists true and no endpoints is
// delivered (a balancer queues requests for endpoints, then fails them
// fast with 503), and the stream's first later message applies as usual.
func (c *Client) WatchEndpoints(ctx context.Context, authority string, update func(endpoint.Update)) (func(), error) {
	if !c.inScope(authority) {
		return outOfScope(c, ctx, noService, update), nil
	}
	return c.endpoints.subscribe(c, ctx, authority, update)
}

// Stats describes the client's watches.
type Stats struct {
	// ProfileWatches, EndpointWatches, PolicyWatches and InboundWatches
	// are the targets watched now.
	ProfileWatches, EndpointWatches, PolicyWatches, InboundWatches int
	// RejectedWatches counts watches refused because the bound was reached.
	RejectedWatches uint64
}

// Stats returns the current counts.
func (c *Client) Stats() Stats {
	return Stats{
		ProfileWatches:  c.profiles.len(),
		EndpointWatches: c.endpoints.len(),
		PolicyWatches:   c.policies.len(),
		InboundWatches:  c.inbound.len(),
		RejectedWatches: c.profiles.rejected.Load() + c.endpoints.rejected.Load() + c.policies.rejected.Load() + c.inbound.rejected.Load(),
	}
}

func (c *Client) request(authority string) *pb.GetDestination {
	return &pb.GetDestination{Scheme: c.cfg.scheme, Path: authority, ContextToken: c.cfg.contextToken}
}

// decodeProfile converts a GetProfile message of authority.
func (c *Client) decodeProfile(authority string, _ profiles.Update, _ bool, m *pb.DestinationProfile) (profiles.Update, bool) {
	p, dropped := ProfileFromProto(m)
	if strings.HasPrefix(authority, p.FullyQualifiedName) {
		// The name is the authority's host, which the watch holds
		// already: one copy for each of thousands of names.
		p.FullyQualifiedName = authority[:len(p.FullyQualifiedName)]
	}
	for _, d := range dropped {
		c.log.WarnErr("dropped profile part:"+authority, "dropped a part of a profile update that does not convert; the rest applies", d.Err, "authority", authority, "route", d.Route, "dropped", d.Field)
	}
	return profiles.Update{Profile: p}, true
}

// decodeEndpoints applies a message of a Get stream of authority to prev,
// the update the stream published last (none when fresh). The set starts
// empty for each stream, so its first update replaces whatever an earlier
// stream left. As in Linkerd's proxy, a message that changes nothing is no
// update (an Add or a Remove with no address that converts:
// linkerd/proxy/api-resolve/src/resolve.rs mk_update), and a Remove before
// the stream's first update is ignored (linkerd/proxy/resolve/src/recover.rs):
// neither replaces the set an earlier stream left. A set, sorted by
// address, is never changed in place: the next one is a copy.
func (c *Client) decodeEndpoints(authority string, prev endpoint.Update, fresh bool, m *pb.Update) (endpoint.Update, bool) {
	var eps []endpoint.Endpoint
	exists := true
	if !fresh && prev.Set != nil {
		eps, exists = prev.Set.Endpoints, prev.Set.Exists
	}
	switch u := m.GetUpdate().(type) {
	case *pb.Update_Add:
		labels := u.Add.GetMetricLabels()
		next := slices.Clip(eps)
		for i, a := range u.Add.GetAddrs() {
			e, err := EndpointFromProto(a, labels, fmt.Sprintf("add.addrs[%d]", i))
			if err != nil {
				c.log.WarnErr("bad endpoint:"+authority, "skipped a bad endpoint", err, "authority", authority)
				continue
			}
			next = append(next, e)
		}
		if len(next) == len(eps) {
			return endpoint.Update{}, false // nothing to add
		}
		exists = true
		// The latest of an address wins: after a stable sort it is
		// the last of its run.
		slices.SortStableFunc(next, byAddr)
		eps = make([]endpoint.Endpoint, 0, len(next))
		for i, e := range next {
			if i+1 < len(next) && next[i+1].Addr == e.Addr {
				continue
			}
			eps = append(eps, e)
		}
	case *pb.Update_Remove:
		if fresh {
			return endpoint.Update{}, false
		}
		gone := make(map[netip.AddrPort]bool, len(u.Remove.GetAddrs()))
		for _, a := range u.Remove.GetAddrs() {
			if addr, err := AddrFromProto(a); err == nil {
				gone[addr] = true
			}
		}
		if len(gone) == 0 {
			return endpoint.Update{}, false
		}
		eps = slices.Clip(slices.DeleteFunc(slices.Clone(eps), func(e endpoint.Endpoint) bool { return gone[e.Addr] }))
	case *pb.Update_NoEndpoints:
		eps = nil
		exists = u.NoEndpoints.GetExists()
	default:
		return endpoint.Update{}, false
	}
	if eps == nil {
		eps = []endpoint.Endpoint{}
	}
	return endpoint.Update{Set: &endpoint.Set{Exists: exists, Endpoints: eps}}, true
}

// byAddr orders endpoints by address.
func byAddr(a, b endpoint.Endpoint) int { return a.Addr.Compare(b.Addr) }

// userTimeoutDial dials with dial (nil: a net.Dialer) and, with keepalive
// on, sets TCP_USER_TIMEOUT on the connection to the keepalive's timeout,
// which gRPC sets on the connections it sees bare. With dial options of the
// caller's ([WithDialOptions]) it sets none: they may change the keepalive.
func userTimeoutDial(dial backoff.DialFunc, ka keepalive.ClientParameters) backoff.DialFunc {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	if ka.Time == cpaddr.NoPing || ka.Timeout <= 0 {
		return dial
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok && err == nil {
			_ = setUserTimeout(tc, ka.Timeout) // best effort, as gRPC's
		}
		return c, err
	}
}
