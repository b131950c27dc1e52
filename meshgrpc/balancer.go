package meshgrpc

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	grpcbalancer "google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
)

// BalancerName is the name meshgrpc's balancer is registered under in
// grpc-go's registry; [DialOptions] chooses it with a default service
// config.
const BalancerName = "inmesh_p2c"

func init() { grpcbalancer.Register(balancerBuilder{}) }

// meshKey is the key of the channel's *mesh in the resolver state's
// attributes: the balancer is registered globally and finds its channel's
// configuration there.
type meshKey struct{}

type balancerBuilder struct{}

func (balancerBuilder) Name() string { return BalancerName }

func (balancerBuilder) Build(cc grpcbalancer.ClientConn, _ grpcbalancer.BuildOptions) grpcbalancer.Balancer {
	return &meshBalancer{cc: cc, subs: make(map[subKey]*subConn), pools: make(map[string]*backendPool), stop: make(chan struct{})}
}

// meshBalancer balances a channel's calls. The design: each backend
// authority (the target, and each backend its GRPCRoutes name) is one
// [balancer.Pool] of its own, with its own loads and failure accrual, as
// a Linkerd proxy builds one balancer per backend; each endpoint of a
// backend is one sub-channel (an address that two backends share gets one
// per backend, so that their states stay apart). The route interceptor
// puts the call's backend in the call's context; the picker reads it
// (PickInfo.Ctx) and picks in that backend's pool among its READY
// sub-channels; a call without one goes to the target's own endpoints.
//
// grpc-go calls the balancer's methods on its serializer; mu orders them
// with the queue's ticks ([meshBalancer.tick]), which run on a goroutine
// of their own. The picker takes no lock.
type meshBalancer struct {
	mu     sync.Mutex
	cc     grpcbalancer.ClientConn
	subs   map[subKey]*subConn
	pools  map[string]*backendPool
	target string
	mesh   *mesh
	// resolved: the resolver gave a state; rerr its last error.
	resolved bool
	rerr     error
	closed   bool
	// last is the state last published, which a tick publishes again
	// with a new picker; ticking says a tick goroutine runs; stop ends it
	// when the balancer closes.
	last    grpcbalancer.State
	ticking bool
	stop    chan struct{}
}

type subKey struct {
	backend string
	addr    netip.AddrPort
}

type subConn struct {
	sc      grpcbalancer.SubConn
	ep      endpoint.Endpoint
	addr    resolver.Address
	state   connectivity.State
	lastErr error
	// md is the metadata of its picks: the endpoint's authority override
	// (see authorityMD), nil without one.
	md metadata.MD
}

// backendPool is the pool of one backend and the configuration it was
// made with.
type backendPool struct {
	pool *balancer.Pool
	conf *balancer.BackendConfig
	// forward: the backend is a forward, its pool a balancer.NewForwardPool.
	forward bool
	// eps is the number of endpoints the backend has, ready or not.
	eps int
	q   *callQueue
}

// callQueue is the queue of one backend's calls: grpc-go's picker cannot
// block, so a call that finds no endpoint of the backend in rotation (its
// set empty, its endpoints connecting, failing to connect or out of
// rotation) is told to wait (ErrNoSubConnAvailable) and picks again at
// each picker the balancer publishes; while calls wait, the balancer
// publishes one every [queuePoll], so that an endpoint whose
// failure-accrual penalty ended takes them, and fails them fast once they
// waited the pool's failfast timeout, as the HTTP balancer's queue does
// (linkerd2-proxy's balancer queue, linkerd/proxy/balance/queue): from
// then on the backend's calls fail at once until one finds an endpoint in
// rotation.
type callQueue struct {
	// since is the clock reading (UnixNano) at which a call first found
	// no endpoint in rotation; 0 while the backend's calls are picked.
	since atomic.Int64
	// failfast: a call waited the failfast timeout.
	failfast atomic.Bool
}

// queuePoll is how often the picker is published again while calls
// wait: how soon after a penalty ends they are picked.
const queuePoll = 10 * time.Millisecond

// failfastPoll is how often it is published while the backend fails
// fast and no call waits: calls that wait for ready pick again at each.
const failfastPoll = 100 * time.Millisecond

// picked ends the queue's wait and its failfast: a call found an endpoint.
func (q *callQueue) picked() {
	if q.since.Load() != 0 {
		q.since.Store(0)
	}
	if q.failfast.Load() {
		q.failfast.Store(false)
	}
}

func (b *meshBalancer) UpdateClientConnState(s grpcbalancer.ClientConnState) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.resolved, b.rerr = true, nil
	b.target = backendOf(s.ResolverState.Attributes)
	if m, ok := s.ResolverState.Attributes.Value(meshKey{}).(*mesh); ok {
		b.mesh = m
	}
	seen := make(map[subKey]bool)
	count := make(map[string]int)
	for _, ep := range s.ResolverState.Endpoints {
		if len(ep.Addresses) == 0 {
			continue
		}
		e := endpointOf(ep.Attributes)
		backend := backendOf(ep.Attributes)
		if e == nil {
			continue
		}
		k := subKey{backend, e.Addr}
		seen[k] = true
		count[backend]++
		if sub := b.subs[k]; sub != nil {
			if sub.addr.Attributes.Equal(ep.Addresses[0].Attributes) {
				// A new weight, labels or authority override: the same
				// connection.
				if e.AuthorityOverride != sub.ep.AuthorityOverride {
					sub.md = authorityMD(e.AuthorityOverride)
				}
				sub.ep = *e
				continue
			}
			// A new identity: never reuse a connection verified for the
			// old one.
			sub.sc.Shutdown()
			delete(b.subs, k)
		}
		sub := &subConn{ep: *e, addr: ep.Addresses[0], state: connectivity.Idle, md: authorityMD(e.AuthorityOverride)}
		// One address per sub-channel, which is what the future of the
		// deprecated NewSubConn allows.
		//lint:ignore SA1019 grpc-go offers a balancer no other way to make a sub-channel.
		sc, err := b.cc.NewSubConn([]resolver.Address{ep.Addresses[0]}, grpcbalancer.NewSubConnOptions{
			StateListener: func(st grpcbalancer.SubConnState) { b.subState(k, sub, st) },
		})
		if err != nil {
			continue
		}
		sub.sc = sc
		b.subs[k] = sub
		sc.Connect()
	}
	for k, sub := range b.subs {
		if !seen[k] {
			sub.sc.Shutdown()
			delete(b.subs, k)
		}
	}
	// The pools: one per backend named, its configuration the policy's.
	var conf map[string]*balancer.BackendConfig
	if b.mesh != nil {
		if st := b.mesh.state(b.target); st != nil {
			conf = st.balancing
		}
	}
	// A backend that answered with no endpoints is known, and empty.
	if a, _ := s.ResolverState.Attributes.Value(answeredKey{}).(string); a != "" {
		for name := range strings.SplitSeq(a, "\n") {
			if _, ok := count[name]; !ok {
				count[name] = 0
			}
		}
	}
	// A forward backend's calls are recorded without an authority label,
	// as Linkerd's proxy records a forward's, which has none
	// (linkerd/app/outbound/src/http/logical/policy/router.rs, mk_concrete).
	var forwards map[string]bool
	if f, _ := s.ResolverState.Attributes.Value(forwardedKey{}).(string); f != "" {
		forwards = make(map[string]bool)
		for name := range strings.SplitSeq(f, "\n") {
			forwards[name] = true
		}
	}
	for name := range b.pools {
		if _, ok := count[name]; !ok {
			delete(b.pools, name)
		}
	}
	for name := range count {
		c := conf[name]
		// The policy compiles a new configuration on every update: a pool
		// whose configuration is unchanged in value keeps its loads and
		// its failure accrual.
		if p := b.pools[name]; p == nil || !sameConfig(p.conf, c) || p.forward != forwards[name] {
			var opts []balancer.Option
			if b.mesh != nil {
				opts = b.mesh.cfg.balancer
			}
			newPool := balancer.NewPool
			if forwards[name] {
				newPool = balancer.NewForwardPool
			}
			b.pools[name] = &backendPool{pool: newPool(c, opts...), conf: c, forward: forwards[name], q: &callQueue{}}
		}
		b.pools[name].eps = count[name]
	}
	for name, p := range b.pools {
		p.pool.Retain(func(a netip.AddrPort) bool { return seen[subKey{name, a}] })
	}
	b.update()
	return nil
}

// sameConfig reports whether a and b configure a pool alike.
func sameConfig(a, b *balancer.BackendConfig) bool {
	return a == b || reflect.DeepEqual(a, b)
}

func (b *meshBalancer) ResolverError(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.rerr = err
	if !b.resolved || len(b.subs) == 0 {
		b.publish(grpcbalancer.State{ConnectivityState: connectivity.TransientFailure,
			Picker: errPicker{fmt.Errorf("meshgrpc: resolving %s: %w", b.target, err)}})
	}
}

func (b *meshBalancer) subState(k subKey, sub *subConn, st grpcbalancer.SubConnState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.subs[k] != sub {
		return
	}
	sub.state = st.ConnectivityState
	if st.ConnectionError != nil {
		sub.lastErr = st.ConnectionError
	}
	if sub.state == connectivity.Idle {
		sub.sc.Connect()
	}
	b.update()
}

// update gives each pool its READY endpoints and publishes the picker and
// the channel's state: READY when a sub-channel is; CONNECTING when some
// are connecting, or the target's endpoint set is empty; TRANSIENT_FAILURE
// when all failed to connect, or the resolver failed with no endpoint
// known. Whatever the state, a known backend's calls queue in the picker
// while none of its endpoints is in rotation (see [callQueue]): a
// connection attempt that failed ends no call, the failfast timeout does.
// Called with mu held.
func (b *meshBalancer) update() {
	ready := make(map[string][]endpoint.Endpoint)
	scs := make(map[subKey]pickSub)
	// A sub-channel's connections are mTLS, verified for the identity in
	// its address, only when the channel has a local identity; otherwise
	// they are plaintext (see [clientCreds]).
	meshTLS := b.mesh != nil && b.mesh.cfg.identity != nil
	pending := make(map[string]int)
	failed := make(map[string]error)
	var connecting bool
	for k, sub := range b.subs {
		switch sub.state {
		case connectivity.Ready:
			ready[k.backend] = append(ready[k.backend], sub.ep)
			ps := pickSub{sc: sub.sc, md: sub.md}
			if meshTLS {
				ps.verified, _ = endpointIdentity(sub.addr.Attributes)
			}
			scs[k] = ps
		case connectivity.Connecting, connectivity.Idle:
			connecting = true
			pending[k.backend]++
		case connectivity.TransientFailure:
			if sub.lastErr != nil || failed[k.backend] == nil {
				failed[k.backend] = sub.lastErr
			}
		}
	}
	pools := make(map[string]pickPool, len(b.pools))
	for name, p := range b.pools {
		p.pool.Update(ready[name])
		pools[name] = pickPool{pool: p.pool, eps: p.eps, connecting: pending[name], lastErr: failed[name], q: p.q}
	}
	pk := &picker{target: b.target, pools: pools, scs: scs, queueing: b.queueing}
	if b.mesh != nil {
		pk.calls, pk.mesh = b.mesh.calls, b.mesh
	}
	// The resolver's first state names the target's set, or, for an IP
	// whose policy routes its calls elsewhere (its own set unwatched),
	// the first of their backends' sets.
	known := len(b.pools) > 0
	switch {
	case len(scs) > 0:
		b.publish(grpcbalancer.State{ConnectivityState: connectivity.Ready, Picker: pk})
	case len(b.subs) == 0 && b.rerr == nil && known:
		// The sets are known and empty: calls queue in the picker, as
		// requests do in the HTTP balancer's queue.
		b.publish(grpcbalancer.State{ConnectivityState: connectivity.Connecting, Picker: pk})
	case len(b.subs) == 0:
		err := fmt.Errorf("meshgrpc: %s has no endpoints", b.target)
		if b.rerr != nil {
			err = fmt.Errorf("meshgrpc: resolving %s: %w", b.target, b.rerr)
		}
		b.publish(grpcbalancer.State{ConnectivityState: connectivity.TransientFailure, Picker: errPicker{err}})
	case connecting:
		b.publish(grpcbalancer.State{ConnectivityState: connectivity.Connecting, Picker: pk})
	default:
		// Every endpoint failed to connect, and each tries again after
		// its backoff: the calls queue meanwhile, as the HTTP balancer's
		// do while its endpoints are unreachable.
		b.publish(grpcbalancer.State{ConnectivityState: connectivity.TransientFailure, Picker: pk})
	}
}

// publish gives grpc-go st and keeps it for the queue's ticks. Called
// with mu held.
func (b *meshBalancer) publish(st grpcbalancer.State) {
	b.last = st
	b.cc.UpdateState(st)
}

// queueing is what a pick calls when it starts a backend's queue: the
// balancer publishes its picker again every queuePoll until no call
// waits.
func (b *meshBalancer) queueing() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ticking || b.closed {
		return
	}
	b.ticking = true
	go b.tick()
}

// tick publishes the picker again, with a new identity so that grpc-go's
// waiting calls pick again, every queuePoll while a backend's calls
// queue (every failfastPoll while one fails fast), and puts a queue that
// waited its failfast timeout into failfast. It returns when no backend
// queues or fails fast, or the balancer closed.
func (b *meshBalancer) tick() {
	t := time.NewTimer(queuePoll)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return
		}
		now := time.Now().UnixNano()
		queued, failing := false, false
		for name, p := range b.pools {
			if since := p.q.since.Load(); since != 0 && time.Duration(now-since) >= p.pool.FailFast() {
				if p.q.failfast.CompareAndSwap(false, true) && b.mesh != nil {
					b.mesh.cfg.logger.Info("meshgrpc: no endpoint ready within the failfast timeout, failing fast",
						"authority", name, "timeout", p.pool.FailFast())
				}
				p.q.since.CompareAndSwap(since, 0)
			}
			queued = queued || p.q.since.Load() != 0
			failing = failing || p.q.failfast.Load()
		}
		if pk, ok := b.last.Picker.(*picker); ok {
			np := *pk
			b.publish(grpcbalancer.State{ConnectivityState: b.last.ConnectivityState, Picker: &np})
		}
		if !queued && !failing {
			b.ticking = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		if queued {
			t.Reset(queuePoll)
		} else {
			t.Reset(failfastPoll)
		}
	}
}

func (b *meshBalancer) UpdateSubConnState(grpcbalancer.SubConn, grpcbalancer.SubConnState) {}

func (b *meshBalancer) ExitIdle() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, sub := range b.subs {
		if sub.state == connectivity.Idle {
			sub.sc.Connect()
		}
	}
}

func (b *meshBalancer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		close(b.stop)
	}
	b.closed = true
	for k, sub := range b.subs {
		sub.sc.Shutdown()
		delete(b.subs, k)
	}
}

type errPicker struct{ err error }

func (p errPicker) Pick(grpcbalancer.PickInfo) (grpcbalancer.PickResult, error) {
	return grpcbalancer.PickResult{}, p.err
}

// picker is an immutable view of the balancer: the pools (whose own
// state moves under it, safely) and the READY sub-channels.
type picker struct {
	target string
	pools  map[string]pickPool
	scs    map[subKey]pickSub
	calls  *classify.Recorder // nil: not recorded
	// mesh is the channel's mesh state, nil without one: a redraw
	// ([picker.redraw]) reads the target's profile in force there.
	mesh *mesh
	// queueing tells the balancer that a backend's calls queue.
	queueing func()
}

// redraw returns the backend of a call whose backend has no pool: a
// backend that the target's dst overrides drew and no longer name (the
// profile changed between the draw and the pick, and the channel stopped
// following it) is drawn again by the profile in force, or goes where a
// call the profile does not route goes (its logical authority, else the
// target) when that no longer routes calls; any other is backend itself, which
// the call waits for. Without it such a call waited for a backend whose
// endpoints would never come, until its deadline.
func (p *picker) redraw(ctx context.Context, backend string) string {
	if drawn, _ := ctx.Value(drawnCtxKey{}).(bool); !drawn || p.mesh == nil {
		return backend
	}
	ps := p.mesh.profile(p.target)
	if !ps.applies() {
		// The calls go where a call without overrides goes: the
		// logical authority (an IP's Service), else the target.
		if ps != nil && ps.logical != "" {
			return ps.logical
		}
		return p.target
	}
	if slices.Contains(ps.splitBackends, backend) {
		return backend // named still: its endpoints are on their way
	}
	return cmp.Or(ps.backend(), p.target)
}

// pickSub is a READY sub-channel as a picker sees it.
type pickSub struct {
	sc grpcbalancer.SubConn
	// verified is the identity its connections verified in their mTLS
	// handshake, the one its address carries (a sub-channel whose
	// identity changes is replaced, never reused); empty when they are
	// plaintext. A call's l5d-require-id is checked against it.
	verified string
	// md is the metadata of its picks (see authorityMD), nil for none.
	md metadata.MD
}

// authorityMD returns the pick metadata that makes a call to an endpoint
// with an authority override carry it as its :authority, nil without one.
// Linkerd's proxy replaces the authority of a request to such an endpoint
// (linkerd/app/outbound/src/http/endpoint.rs lines 125-128, and
// linkerd/http/override-authority/src/lib.rs, set_authority), as the
// HTTP balancer replaces the Host; grpc-go sends a picker's :authority in
// place of the channel's (gRFC A81), unless the call sets its own with
// grpc.CallAuthority. A value that is no authority (empty, or with a
// space or a byte outside printable ASCII, which grpc-go would refuse for
// every call) is ignored, as Linkerd's proxy ignores an override it cannot
// parse. A call to an endpoint with an override goes without its own
// l5d-dst-canonical, which [withoutMeshMetadata] took out and the picker
// gives back only to an endpoint without one, as Linkerd's proxy removes
// the header with the authority (NewOverrideAuthority names both). The
// metadata is made once per endpoint and shared by its picks, which
// grpc-go only reads.
func authorityMD(override string) metadata.MD {
	if override == "" {
		return nil
	}
	for i := 0; i < len(override); i++ {
		if c := override[i]; c <= ' ' || c > '~' {
			return nil
		}
	}
	return metadata.MD{":authority": {override}}
}

// pickPool is a backend's pool as a picker sees it.
type pickPool struct {
	pool *balancer.Pool
	eps  int // the backend's endpoints, ready or not
	// connecting is the number of the backend's sub-channels CONNECTING
	// or IDLE (about to connect); lastErr the last connection error of
	// one in TRANSIENT_FAILURE.
	connecting int
	lastErr    error
	q          *callQueue
}

// backendCtxKey is the key of the call's backend authority in its
// context, set by the route interceptor.
type backendCtxKey struct{}

// withBackend puts the call's backend authority in ctx for the picker of
// the channel of target. A call to the target itself (the common case: a
// route whose backend is the service) needs no value, as the picker picks
// among the target's endpoints without one, unless ctx carries another
// backend from elsewhere.
func withBackend(ctx context.Context, target, authority string) context.Context {
	if authority == target {
		if b, ok := ctx.Value(backendCtxKey{}).(string); !ok || b == "" || b == target {
			return ctx
		}
	}
	return &backendCtx{Context: ctx, backend: authority}
}

// withDrawnBackend is withBackend for a backend that the dst overrides
// of the target's ServiceProfile drew (see [profileState.backend]): a
// call whose backend the overrides no longer name when it is picked is
// drawn again (see [picker.redraw]).
func withDrawnBackend(ctx context.Context, target, authority string) context.Context {
	if authority == target {
		return withBackend(ctx, target, authority)
	}
	return &backendCtx{Context: ctx, backend: authority, drawn: true}
}

// backendCtx is a context carrying a call's backend authority: one
// allocation, where context.WithValue would make two (the context and the
// boxed string).
type backendCtx struct {
	context.Context
	backend string
	// drawn: the profile's dst overrides drew the backend.
	drawn bool
}

// drawnCtxKey is the key of whether the call's backend was drawn by the
// dst overrides (a bool), set with the backend.
type drawnCtxKey struct{}

func (c *backendCtx) Value(key any) any {
	switch key.(type) {
	case backendCtxKey:
		return c.backend
	case drawnCtxKey:
		return c.drawn
	}
	return c.Context.Value(key)
}

// queue is the answer to a call that found no endpoint of backend bp in
// rotation (empty: its endpoint set is empty): wait for the next picker,
// or, once the backend's calls waited the failfast timeout, the error of
// [newFailFastError], which fails a fail-fast call at once with
// DEADLINE_EXCEEDED (see [failFastStatus]); a call that waits for ready
// keeps waiting.
func (p *picker) queue(bp pickPool, backend string, empty bool) error {
	if bp.q.failfast.Load() {
		return newFailFastError(bp, backend, empty)
	}
	if bp.q.since.CompareAndSwap(0, time.Now().UnixNano()) && p.queueing != nil {
		p.queueing()
	}
	return grpcbalancer.ErrNoSubConnAvailable
}

func (p *picker) Pick(info grpcbalancer.PickInfo) (grpcbalancer.PickResult, error) {
	backend := p.target
	if b, ok := info.Ctx.Value(backendCtxKey{}).(string); ok && b != "" {
		backend = b
	}
	bp, ok := p.pools[backend]
	if !ok {
		if to := p.redraw(info.Ctx, backend); to != backend {
			backend = to
			bp, ok = p.pools[backend]
		}
	}
	if !ok {
		// The backend's endpoints are not known yet (a policy or a
		// profile's dst overrides just named it): the call waits for the
		// picker that brings them.
		return grpcbalancer.PickResult{}, grpcbalancer.ErrNoSubConnAvailable
	}
	if bp.eps == 0 {
		return grpcbalancer.PickResult{}, p.queue(bp, backend, true)
	}
	var k balancer.Pick
	if tried, exclude := balancer.TriedFromContext(info.Ctx); tried != nil {
		// An attempt of a hedged call: the pick joins the call's tried
		// endpoints, and the hedge goes only to one they do not hold.
		// The hedge waits for an endpoint still connecting (until the
		// call ends), and is not sent when none is left.
		if k, ok = bp.pool.PickExcluding(tried, exclude); !ok && exclude {
			if bp.connecting > 0 {
				return grpcbalancer.PickResult{}, grpcbalancer.ErrNoSubConnAvailable
			}
			return grpcbalancer.PickResult{}, errNoOtherEndpoint
		}
	} else {
		k, ok = bp.pool.Pick()
	}
	if !ok {
		// No endpoint in rotation: none is ready (connecting, or failed
		// to connect and trying again after its backoff), or every ready
		// one is out of rotation (failure accrual, outlier detection, a
		// probe out). The call queues, at most the failfast timeout.
		return grpcbalancer.PickResult{}, p.queue(bp, backend, false)
	}
	bp.q.picked()
	sub, ok := p.scs[subKey{backend, k.Endpoint().Addr}]
	if !ok { // a newer picker is on its way
		k.Done(balancer.Result{Unsent: true})
		return grpcbalancer.PickResult{}, grpcbalancer.ErrNoSubConnAvailable
	}
	cm, _ := info.Ctx.Value(callMetaKey{}).(*callMeta)
	if err := refuseUnproven(info.Ctx, cm, sub.verified); err != nil {
		// The call requires an identity this endpoint does not prove: it
		// fails unsent, a status error that grpc-go neither retries nor
		// waits out. As in Linkerd's proxy, where the check is part of
		// the endpoint's stack, the failure counts in the endpoint's
		// failure accrual; the endpoint's own series do not record it.
		k.Done(balancer.Result{GRPCStatus: int(codes.Unavailable)})
		return grpcbalancer.PickResult{}, err
	}
	d := pickDones.Get().(*pickDone)
	d.k, d.ctx = k, info.Ctx
	if f, ok := info.Ctx.Value(firstDataKey{}).(*firstData); ok {
		// An attempt of a server-streaming call: its first response
		// message takes it out of the endpoint's load.
		f.bind(d, info.FullMethodName)
	}
	if p.calls != nil {
		d.ex = p.calls.Start(info.Ctx, backend, k.Labels())
	}
	md := sub.md
	if md == nil && cm != nil {
		// No authority override: the call's own l5d-dst-canonical goes
		// on (an endpoint with one gets the override instead).
		md = cm.canonical
	}
	return grpcbalancer.PickResult{SubConn: sub.sc, Done: d.fn, Metadata: md}, nil
}

// givenUp reports whether a call on ctx that ended with code was given up
// by its caller rather than answered: cancelled, or ended by its own
// deadline. The caller's deadline is its own to keep, as it is for an
// application behind Linkerd's proxy, which does not enforce a
// grpc-timeout: the application resets the stream when its deadline
// passes, and the proxy's breaker takes no class from a response future
// dropped before its response (linkerd2-proxy
// linkerd/http/classify/src/channel.rs, ResponseFuture). A ServiceProfile
// route's timeout is the same: the proxy enforces it above its balancer
// (linkerd/app/outbound/src/http/logical/profile.rs, NewTimeout). A
// policy route's request, retry, response and idle timeouts (a
// [classify.ErrEndpointTimeout] cause) are not: the proxy enforces them in
// the endpoint's stack, under the breaker
// (linkerd/app/outbound/src/http/endpoint.rs, EnforceTimeouts), whose
// class is then a failure, on a stream as on a unary call. DEADLINE_EXCEEDED at
// or past the call's deadline is the end of that deadline even before
// ctx says so: the server's answer to the grpc-timeout it was sent can
// come before the client's own timer fires, which is due, and is awaited
// for its cause. A DEADLINE_EXCEEDED before the deadline is the
// server's own answer, classified by its code.
func givenUp(ctx context.Context, code codes.Code) bool {
	err := ctx.Err()
	if err == nil {
		if code != codes.DeadlineExceeded {
			return false
		}
		if d, ok := ctx.Deadline(); !ok || time.Now().Before(d) {
			return false
		}
		<-ctx.Done()
	}
	return !classify.EndpointTimedOut(ctx)
}

// plainHTTPPrefix begins the message of the status grpc-go makes of a
// response that is not gRPC's (google.golang.org/grpc/internal/transport,
// operateHeaders), and the response's HTTP status follows it.
const plainHTTPPrefix = "unexpected HTTP status code received from server: "

// plainHTTPStatus returns the HTTP status of the response that ended a
// call with err when that response was not gRPC's (an HTTP/2 server that
// does not speak gRPC, a proxy's own answer), 0 otherwise. grpc-go gives
// the balancer no HTTP status, only the status it made of one
// (UNAVAILABLE for 429 and 502-504, UNIMPLEMENTED for 404, UNKNOWN for
// 500, ...), whose message starts with it. A gRPC server's own status
// whose message starts the same way is read as such an answer too.
func plainHTTPStatus(err error) int {
	s, ok := status.FromError(err)
	if !ok || s == nil {
		return 0
	}
	msg, ok := strings.CutPrefix(s.Message(), plainHTTPPrefix)
	if !ok || len(msg) < 3 {
		return 0
	}
	n := 0
	for _, c := range []byte(msg[:3]) {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// pickDone is what a pick's Done needs: pooled, with its Done bound once,
// so that a pick makes no closure. grpc-go calls a pick's Done once, also
// for a pick it abandons before any call (an empty DoneInfo).
type pickDone struct {
	k   balancer.Pick
	ex  classify.Exchange // the zero Exchange records nothing
	ctx context.Context
	fn  func(grpcbalancer.DoneInfo)
	// fd is the stream attempt this pick is bound to (nil: none).
	fd *firstData
}

var pickDones sync.Pool

func init() {
	pickDones.New = func() any {
		d := &pickDone{}
		d.fn = d.done
		return d
	}
}

func (d *pickDone) done(info grpcbalancer.DoneInfo) {
	if d.fd != nil {
		d.fd.unbind(d) // k below is then the stream's last word on it
	}
	k, ex, ctx := d.k, d.ex, d.ctx
	*d = pickDone{fn: d.fn}
	pickDones.Put(d)
	if ctx == nil {
		return
	}
	if info.Err == nil && !info.BytesSent && !info.BytesReceived {
		// grpc-go found the picked sub-channel no longer ready and picks
		// again (picker_wrapper): no call was made, so nothing is learned
		// of the endpoint (a probe is not answered, no latency is taken)
		// and no response is recorded. The request this pick counted
		// stays counted: request_total may exceed response_total by such
		// re-picks.
		k.Done(balancer.Result{Unsent: true})
		return
	}
	code := status.Code(info.Err)
	r := balancer.Result{GRPCStatus: int(code)}
	if ct := info.Trailer["content-type"]; len(ct) > 0 {
		// grpc-go's transport gives the content-type in the metadata of
		// the header block that carried it, and DoneInfo the metadata of
		// the block that ended the call: the status came in the head, a
		// Trailers-Only answer of the server, which is what the load
		// penalty reads (a status grpc-go made up, as for an answer that
		// is not gRPC's, has none).
		r.TrailersOnly = true
		if v := info.Trailer["grpc-retry-pushback-ms"]; len(v) > 0 {
			r.RetryAfter = balancer.ParsePushback(v[0])
		}
	} else if info.Err != nil && info.BytesReceived {
		if s := plainHTTPStatus(info.Err); s != 0 {
			// An answer that is not gRPC's: classed and penalized by
			// its HTTP status, as the HTTP balancer reads a gRPC
			// request's plain answer.
			r.PlainHTTP, r.HTTPStatus = true, s
		}
	}
	if info.Err != nil && givenUp(ctx, code) {
		// Given up by its caller: before its response, the time it
		// waited is a load sample but no verdict on the endpoint; after
		// it began, the call counts as its response stood, without a
		// status, as Linkerd's breaker counts a response body dropped
		// early.
		r.Canceled, r.Dropped = !info.BytesReceived, info.BytesReceived
	} else if info.Err != nil && ctx.Err() != nil {
		// Ended by its policy route's timeout, whatever code grpc-go gave
		// the end of its context (CANCELLED for a stream's response or
		// idle timeout): a failure, as Linkerd's breaker classifies the
		// error of the endpoint's timeouts (linkerd/app/core/src/classify.rs,
		// Class::Error).
		r.GRPCStatus = int(codes.DeadlineExceeded)
	}
	k.Done(r)
	abandoned := info.Err != nil && classify.Abandoned(ctx)
	switch {
	case abandoned && !info.BytesReceived:
		// The application gave the call up before its response began: no
		// response, as Linkerd's proxy records none for a response
		// future dropped with its client (linkerd/http/metrics); the
		// request stays counted.
	case abandoned:
		// Given up after the response headers: the response stream as
		// it ended, without grpc-status, as Linkerd's proxy classifies a
		// response body dropped with its client (and classify a body
		// closed early).
		ex.EndGRPC(ctx, -1)
	case info.Err == nil || info.BytesReceived:
		ex.EndGRPC(ctx, int32(code))
	case code == codes.DeadlineExceeded:
		ex.EndError(ctx, context.DeadlineExceeded)
	default:
		ex.EndError(ctx, info.Err)
	}
}
