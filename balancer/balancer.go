package balancer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
	authpkg "github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/meshtrace"
	"github.com/inmesh/inmesh/internal/proxyerr"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/internal/registry"
	origproto "github.com/inmesh/inmesh/orig-proto"
)

// ErrClosed is why a closed [Balancer] sends no request: each gets a 503
// naming it, never a fallback to its own address, since a closed Balancer
// no longer knows which authorities are mesh Services.
var ErrClosed = errors.New("balancer: closed")

// Balancer resolves each request's authority through a [Source] and sends
// the request to one of its endpoints, picked by power of two choices over
// peak-EWMA load (see the package documentation). With [WithSplits], a
// request first goes to one of its authority's split backends by weight.
//
// While an authority has no answer yet, a request waits at most the
// resolve timeout, then gets a 503 with l5d-proxy-error. A request for an
// authority with no endpoints waits in its queue for one, as for one whose
// endpoints are all out of rotation ([WithQueue]). One the source says
// does not exist goes to its own address (unless [WithFallback](false):
// it has no endpoints), and so does one the source cannot resolve (unless
// WithFallback(false): 503); one whose watch the source refused (its bound
// on watched authorities) gets a 503, and the watch is tried again after
// a delay.
//
// It puts the endpoint's h2 hint into the request context for origproto,
// its labels (as dst_*) for classify, and the endpoint itself for
// [EndpointFromContext]. A Balancer is safe for concurrent use; Close stops
// its watches.
type Balancer struct {
	src     Source
	cfg     config
	decay   float64
	rtt     float64
	log     *ratelog.Logger
	def     *groupConf // the configuration of the options
	metrics *balMetrics
	ctx     context.Context
	cancel  context.CancelFunc
	table   table
	fwd     forwardLabels // the labels of WithForward's endpoints
}

// New returns a Balancer over the endpoint sets of src. It panics when src
// is nil (a nil interface or a nil pointer, map, func or channel in one):
// a Balancer without a source could answer no request.
func New(src Source, opts ...Option) *Balancer {
	if isNil(src) {
		panic("balancer: New: nil Source")
	}
	cfg := newConfig(opts)
	b := &Balancer{src: src, cfg: cfg, decay: float64(cfg.decay), rtt: float64(cfg.defaultRTT),
		log: ratelog.New(cfg.logger, 0)}
	b.def = newGroupConf(b.defaultKey())
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.table.init(cfg, b.def)
	b.metrics = newBalMetrics(b)
	return b
}

// isNil reports whether v is nil or holds a nil pointer, map, func, channel,
// slice or interface.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface, reflect.UnsafePointer:
		return r.IsNil()
	}
	return false
}

// Close stops every watch and waits for their callbacks to return. It is
// safe to call more than once, and on a nil Balancer (or one not made by
// [New]), where it does nothing.
func (b *Balancer) Close() {
	if b == nil || b.cancel == nil {
		return
	}
	b.cancel()
	b.metrics.close()
	b.table.close()
}

// authority is the state the Balancer keeps for one authority: its
// traffic split, whether its watches have started, how to stop them when
// the authority is released, and its groups: the balancing of its
// endpoints under each configuration requests carry (def: the balancer's
// options), each with its own snapshot behind an atomic pointer.
type authority struct {
	name     string
	split    atomic.Pointer[Split]
	watching atomic.Bool // endpoints
	splitOn  atomic.Bool // split
	def      *group
	cur      atomic.Pointer[group]     // the group of the latest request, for Ready and Endpoints
	recent   atomic.Pointer[[]confRef] // the configurations seen last, newest first
	metrics  atomic.Pointer[authMetrics]

	// endpointsRetry and splitRetry remember a failed watch of each kind.
	endpointsRetry, splitRetry retry

	mu       sync.Mutex
	stops    []func()
	released bool
	groups   map[confKey]*group // the configured groups but def
	addrs    *addrs             // the Balancer's counts of addresses, nil without

	// live is one past its place in its table's list of live
	// authorities, 0 when it is not there; under the table's liveMu.
	live int
}

// confRef is a BackendConfig and the group it is balanced by.
type confRef struct {
	src *BackendConfig
	g   *group
}

// maxRecent bounds the BackendConfigs an authority recognises by address.
const maxRecent = 8

func newAuthority(name string, def *groupConf) *authority {
	a := &authority{name: name, def: newGroup(def)}
	a.def.publish(&snapshot{wait: make(chan struct{}), health: def.health(), group: a.def})
	a.cur.Store(a.def)
	return a
}

// keep records the stop function of a watch, or calls it when the
// authority is already released.
func (a *authority) keep(stop func()) {
	a.mu.Lock()
	if !a.released {
		a.stops = append(a.stops, stop)
		stop = nil
	}
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// release stops the authority's watches, once; requests that still hold
// it keep their snapshots.
func (a *authority) release() {
	a.mu.Lock()
	stops := a.stops
	if !a.released {
		a.addrs.release(a.def.state.Load())
	}
	a.stops, a.released = nil, true
	a.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}

// current returns the group of the latest request.
func (a *authority) current() *group { return a.cur.Load() }

// each calls f for every group of a, under its lock.
func (a *authority) each(f func(*group)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a.def)
	for _, g := range a.groups {
		f(g)
	}
}

// update makes u the answer of every group of a; it returns the default
// group's snapshots before and after.
func (a *authority) update(u endpoint.Update, defaultRTT float64, now int64, meshTLS bool) (prev, next *snapshot) {
	a.mu.Lock()
	defer a.mu.Unlock()
	prev = a.def.state.Load()
	next = newSnapshot(u, prev, defaultRTT, now, meshTLS, a.name)
	if !a.released {
		a.addrs.swap(prev, next)
	}
	a.def.publish(next)
	for _, g := range a.groups {
		gs := newSnapshot(u, g.state.Load(), defaultRTT, now, meshTLS, a.name)
		for i, e := range gs.eps {
			e.ref = next.eps[i].ref // the same endpoints, in the same order
		}
		g.publish(gs)
	}
	return prev, next
}

// group returns the group that balances requests carrying c (nil: the
// balancer's options), making it on first use; now is the clock reading of
// the request. A BackendConfig seen lately is found without a lock or an
// allocation.
func (b *Balancer) group(a *authority, c *BackendConfig, now int64) *group {
	g := a.def
	if c != nil {
		g = nil
		if r := a.recent.Load(); r != nil {
			for _, ref := range *r {
				if ref.src == c {
					g = ref.g
					break
				}
			}
		}
		if g == nil {
			g = b.groupSlow(a, c, now)
		}
		if g != a.def && g.used.Load() != now {
			g.used.Store(now)
		}
	}
	if a.cur.Load() != g {
		a.cur.Store(g)
	}
	return g
}

func (b *Balancer) groupSlow(a *authority, c *BackendConfig, now int64) *group {
	k := b.keyOf(c)
	a.mu.Lock()
	defer a.mu.Unlock()
	g := a.def
	if k != a.def.conf.key {
		if g = a.groups[k]; g == nil {
			g = a.addGroupLocked(newGroupConf(k), b.rtt, now)
		}
	}
	var refs []confRef
	if r := a.recent.Load(); r != nil {
		refs = *r
	}
	next := make([]confRef, 0, maxRecent)
	next = append(next, confRef{c, g})
	for _, ref := range refs {
		if len(next) == maxRecent {
			break
		}
		if ref.src != c {
			next = append(next, ref)
		}
	}
	a.recent.Store(&next)
	return g
}

// addGroupLocked makes the group of conf, its endpoints those of the
// latest answer, each ready with a new load; past [MaxConfigurations] the
// least recently used group is dropped (its requests in flight end in it).
func (a *authority) addGroupLocked(conf *groupConf, defaultRTT float64, now int64) *group {
	if a.groups == nil {
		a.groups = make(map[confKey]*group)
	}
	if len(a.groups) >= MaxConfigurations {
		var lru *group
		for _, g := range a.groups {
			if lru == nil || g.used.Load() < lru.used.Load() {
				lru = g
			}
		}
		delete(a.groups, lru.conf.key)
		if r := a.recent.Load(); r != nil {
			kept := make([]confRef, 0, len(*r))
			for _, ref := range *r {
				if ref.g != lru {
					kept = append(kept, ref)
				}
			}
			a.recent.Store(&kept)
		}
		a.cur.CompareAndSwap(lru, a.def)
		lru.notify()
	}
	g := newGroup(conf)
	g.used.Store(now)
	g.publish(a.def.state.Load().fork(g, defaultRTT, now))
	a.groups[conf.key] = g
	return g
}

// endpoints returns g's snapshot, watching a's endpoints on first use.
// The watch starts outside every lock: a Source doing I/O holds up only
// the requests for this authority, which wait for the first answer
// anyway.
func (b *Balancer) endpoints(a *authority, g *group) *snapshot {
	if !a.watching.Load() && a.watching.CompareAndSwap(false, true) || a.endpointsRetry.due(b.cfg.now) {
		b.watchEndpoints(a)
	}
	return g.state.Load()
}

// retry remembers a watch that failed (a control-plane client at its
// bound, say) for a backoff delay, after which one request tries it
// again; until then requests keep the answer the failure left, and the
// source is not asked again by each of them. The delays are the
// registry's ([registry.DefaultRetry]), growing while the failures go on.
type retry struct {
	at       atomic.Int64 // the clock reading after which to try; 0: no failure
	failures atomic.Int32
}

// due claims the next attempt of a failed watch once its delay has
// passed. Without a failure it costs one atomic load.
func (r *retry) due(now func() int64) bool {
	at := r.at.Load()
	return at != 0 && now() >= at && r.at.CompareAndSwap(at, 0)
}

// failed records a failed attempt.
func (r *retry) failed(now int64) {
	d := registry.DefaultRetry.Delay(int(r.failures.Add(1) - 1))
	r.at.Store(max(now+int64(d), 1))
}

// succeeded forgets the failures.
func (r *retry) succeeded() { r.failures.Store(0) }

func (b *Balancer) watchEndpoints(a *authority) {
	if b.ctx.Err() != nil {
		a.update(endpoint.Update{Err: &watchError{ErrClosed}}, b.rtt, b.cfg.now(), b.cfg.meshTLS)
		return
	}
	stop, err := b.src.WatchEndpoints(b.ctx, a.name, func(u endpoint.Update) {
		if u.Set == nil && u.Err == nil {
			return
		}
		if u.Err != nil {
			b.log.Info("endpoints unavailable", "endpoints unavailable", "authority", a.name, "error", u.Err)
		}
		prev, next := a.update(u, b.rtt, b.cfg.now(), b.cfg.meshTLS)
		b.metrics.update(a, prev, next)
	})
	if err != nil {
		b.log.WarnErr("watch endpoints", "cannot watch endpoints", err, "authority", a.name)
		a.update(endpoint.Update{Err: &watchError{err}}, b.rtt, b.cfg.now(), b.cfg.meshTLS)
		a.endpointsRetry.failed(b.cfg.now())
		return
	}
	a.endpointsRetry.succeeded()
	a.keep(stop)
}

// watchError is a watch the source refused (its bound on watched
// authorities, a closed client): not the source's answer about the
// authority, so its requests never fall back to their own address. A
// Service the balancer could not watch for a moment is still a Service:
// sending its requests outside the mesh (plaintext, by the resolver's
// answer) would be a silent bypass.
type watchError struct{ err error }

func (e *watchError) Error() string { return e.err.Error() }
func (e *watchError) Unwrap() error { return e.err }

// watchSplit watches the traffic split of a request's authority, on first
// use, and again after a failed watch's retry delay.
func (b *Balancer) watchSplit(a *authority) {
	if b.cfg.splits == nil {
		return
	}
	if (a.splitOn.Load() || !a.splitOn.CompareAndSwap(false, true)) && !a.splitRetry.due(b.cfg.now) {
		return
	}
	stop, err := b.cfg.splits.WatchSplit(b.ctx, a.name, func(dsts []endpoint.WeightedDst) {
		a.split.Store(NewSplit(dsts))
	})
	if err != nil {
		b.log.WarnErr("watch split", "cannot watch the traffic split", err, "authority", a.name)
		a.splitRetry.failed(b.cfg.now())
		return
	}
	a.splitRetry.succeeded()
	a.keep(stop)
}

// Transport returns the balancing RoundTripper around base (nil:
// http.DefaultTransport; an origproto.Transport to upgrade requests to mesh
// peers, under a classify.Transport to label metrics by endpoint).
//
// A request is balanced over the endpoints of its authority: its Host, or
// its URL's host when it has no Host. A request a router sent to a backend
// ([WithConcrete], [ConcreteContext]) is balanced over the endpoints of its
// URL's host, the backend, while its Host stays as the caller sent it. The
// Host goes to the endpoint unchanged, as Linkerd's proxy sends the
// authority its application sent, unless the endpoint has an
// AuthorityOverride, which replaces it and removes l5d-dst-canonical.
//
// It panics when b is nil or was not made by [New].
func (b *Balancer) Transport(base http.RoundTripper) http.RoundTripper {
	if b == nil || b.ctx == nil {
		panic("balancer: Transport of a Balancer not made by New")
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{b: b, base: base}
}

type transport struct {
	b    *Balancer
	base http.RoundTripper
}

var _ http.RoundTripper = (*transport)(nil)

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	b := t.b
	host := req.Host
	if host == "" && req.URL != nil {
		host = req.URL.Host
	}
	mark, _ := req.Context().Value(backendKey{}).(*backendMark)
	if mark != nil {
		if mark.forward != nil {
			return t.forward(req, mark.forward) // WithForward: one endpoint, no lookup
		}
		if req.URL != nil && req.URL.Host != "" {
			host = req.URL.Host // the backend a router chose; the Host is the caller's
		}
	}
	// The request holds its authority until it ends (its response body
	// included), so that the idle sweep never releases the state it uses:
	// the loads of the endpoints, their failure accrual, the queue.
	a, ent := b.table.hold(host)
	if a == nil {
		return t.base.RoundTrip(req) // not an authority we can resolve
	}
	if mark == nil {
		b.watchSplit(a)
		if to := a.split.Load().Pick(); to != "" {
			if o, oe := b.table.hold(to); o != nil {
				// Traffic split: the request goes to an override's
				// endpoints.
				ent.Unhold()
				a, ent = o, oe
			}
		}
	}
	resp, held, err := t.roundTrip(req, host, a, ent)
	if !held {
		ent.Unhold()
	}
	return resp, err
}

// roundTrip sends req to an endpoint of a. held says whether the response
// body took over the hold of ent.
func (t *transport) roundTrip(req *http.Request, host string, a *authority, ent *registry.Entry[authority]) (_ *http.Response, held bool, _ error) {
	b := t.b
	name := a.name
	g := a.def
	if a == b.table.closed {
		name = host
	} else if bc, _ := req.Context().Value(backendConfigKey{}).(*BackendConfig); bc != nil {
		g = b.group(a, bc, b.cfg.now())
	} else if a.cur.Load() != g {
		a.cur.Store(g)
	}
	s := b.endpoints(a, g)
	var waited time.Duration // for the first answer, out of the failfast timeout
	if s.wait != nil {
		var err error
		begin := time.Now()
		s, err = b.wait(req, g, s)
		waited = time.Since(begin)
		if err != nil {
			closeBody(req)
			return nil, false, err
		}
		if s == nil {
			closeBody(req)
			return proxyerr.Response(req, http.StatusServiceUnavailable, "no answer from the control plane for "+name), false, nil
		}
	}
	switch {
	case s.err != nil:
		var refused *watchError
		if errors.As(s.err, &refused) {
			closeBody(req)
			return proxyerr.Response(req, http.StatusServiceUnavailable, "cannot watch "+name+": "+s.err.Error()), false, nil
		}
		if b.cfg.fallback {
			resp, err := t.fallback(req)
			return resp, false, err
		}
		closeBody(req)
		return proxyerr.Response(req, http.StatusServiceUnavailable, "cannot resolve "+name+": "+s.err.Error()), false, nil
	case !s.exists && b.cfg.fallback:
		resp, err := t.fallback(req)
		return resp, false, err
	}
	// An empty set (or, without fallback, a service that does not exist:
	// linkerd2-proxy's balancer resets its pool to no endpoints on
	// DoesNotExist) is a pool with nothing ready: its requests queue.
	start := b.cfg.now()
	g.sweepOutliers(start)
	if meshtrace.Enabled(req.Context()) {
		g.ejectedEvent(req.Context())
	}
	tried, exclude := triedFrom(req.Context())
	if exclude && tried != nil {
		// A hedge: only an endpoint the request has not tried, in rotation
		// now; never a queue, never a tried one.
		if s = s.without(tried); s == nil {
			closeBody(req)
			return nil, false, ErrNoOtherEndpoint
		}
		e, probe := s.choose(start, b.decay)
		if e == nil {
			closeBody(req)
			return nil, false, ErrNoOtherEndpoint
		}
		if g.failfast.Load() {
			b.leaveFailfast(a, g, req.Context())
		}
		tried.Add(e.Addr)
		if e.locality != localityNone {
			b.metrics.zoned(a, req.Context(), e.locality)
		}
		return t.sendElsewhereIfRefused(req, host, s, e, probe, ent, tried)
	}
	e, probe := s.choose(start, b.decay)
	if e == nil {
		var resp *http.Response
		var err error
		if s, e, probe, resp, err = b.queue(req, a, g, name, waited); e == nil {
			closeBody(req)
			return resp, false, err
		}
	} else if g.failfast.Load() {
		b.leaveFailfast(a, g, req.Context())
	}
	b.metrics.dequeued(a, req.Context(), b.cfg.now()-start)
	if tried != nil {
		tried.Add(e.Addr)
	}
	if e.locality != localityNone {
		b.metrics.zoned(a, req.Context(), e.locality)
	}
	return t.sendElsewhereIfRefused(req, host, s, e, probe, ent, tried)
}

// MaxRefusedConnects bounds the endpoints one request is sent to when
// each refuses its connection: the first and up to two others.
const MaxRefusedConnects = 3

// sendElsewhereIfRefused sends req to e and, when e refuses the connection
// (nothing of the request was sent: an endpoint whose process died before
// the control plane took it out of its answers), to another endpoint of s
// in rotation, up to [MaxRefusedConnects] in all. A request whose body
// cannot be sent again (a body without GetBody) is not. tried, when not
// nil, gets each endpoint too.
func (t *transport) sendElsewhereIfRefused(req *http.Request, host string, s *snapshot, e *member, probe bool, ent *registry.Entry[authority], tried *Tried) (*http.Response, bool, error) {
	resp, held, err := t.send(req, host, e, probe, ent)
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || len(s.eps) < 2 {
		return resp, held, err
	}
	refused := &Tried{}
	for range MaxRefusedConnects - 1 {
		refused.Add(e.Addr)
		if req.Context().Err() != nil {
			return nil, false, err
		}
		again, ok := resendable(req)
		if !ok {
			return nil, false, err
		}
		others := s.without(refused)
		if others == nil {
			return nil, false, err
		}
		if e, probe = others.choose(t.b.cfg.now(), t.b.decay); e == nil {
			return nil, false, err
		}
		if tried != nil {
			tried.Add(e.Addr)
		}
		if resp, held, err = t.send(again, host, e, probe, ent); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return resp, held, err
		}
		req = again
	}
	return nil, false, err
}

// resendable returns req with a fresh body to send it again, ok false when
// its body cannot be had again.
func resendable(req *http.Request) (_ *http.Request, ok bool) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, false
	}
	out := *req
	out.Body = body
	return &out, true
}

// queuePoll is how often a queued request looks again for an endpoint
// whose penalty ended (other changes wake it at once).
const queuePoll = 10 * time.Millisecond

// queue waits until an endpoint of a is in rotation, at most the failfast
// timeout less waited (the request's wait for the first answer, which
// linkerd2-proxy's queue counts too); past the capacity it refuses at
// once. The first timeout puts g's queue in failfast, as linkerd2-proxy's
// queue enters it: the requests waiting fail fast with it, and later ones
// are shed at once until a request finds an endpoint in rotation
// ([Balancer.leaveFailfast]).
// It returns the endpoint and the snapshot it is of, or the response (503
// fail-fast or load-shed) or error (the request's own) to answer with.
func (b *Balancer) queue(req *http.Request, a *authority, g *group, name string, waited time.Duration) (*snapshot, *member, bool, *http.Response, error) {
	conf := g.conf
	if g.failfast.Load() {
		meshtrace.Event(req.Context(), meshtrace.EventLoadShed)
		return nil, nil, false, failResponse(req, http.StatusServiceUnavailable, ErrLoadShed, "load shed: failing fast, "+unready(g.state.Load(), name)), nil
	}
	if g.queued.Add(1) > int64(conf.queueCap) {
		g.queued.Add(-1)
		b.log.Info("load shed", "queue full, request refused", "authority", name)
		meshtrace.Event(req.Context(), meshtrace.EventLoadShed)
		return nil, nil, false, failResponse(req, http.StatusServiceUnavailable, ErrLoadShed, "load shed: the queue of "+name+" is full"), nil
	}
	defer g.queued.Add(-1)
	meshtrace.Event(req.Context(), meshtrace.EventQueued)
	timer := time.NewTimer(conf.failfast - waited)
	defer timer.Stop()
	tick := time.NewTicker(queuePoll)
	defer tick.Stop()
	expired := false
	for {
		wake := g.wake()
		now := b.cfg.now()
		g.sweepOutliers(now)
		s := g.state.Load()
		if e, probe := s.choose(now, b.decay); e != nil {
			b.leaveFailfast(a, g, req.Context())
			meshtrace.Event(req.Context(), meshtrace.EventDequeued)
			return s, e, probe, nil, nil
		}
		if expired || g.failfast.Load() {
			if g.failfast.CompareAndSwap(false, true) {
				b.log.Info("failfast", "no endpoint ready within the failfast timeout, failing fast", "authority", name, "timeout", conf.failfast)
				b.metrics.gate(a, req.Context(), false)
				g.notify() // the requests still waiting fail fast too
			}
			b.metrics.failfast(a, req.Context())
			meshtrace.Event(req.Context(), meshtrace.EventFailFast)
			return nil, nil, false, failResponse(req, http.StatusGatewayTimeout, ErrFailFast, "fail-fast: "+unready(s, name)+" within "+conf.failfast.String()), nil
		}
		select {
		case <-wake:
		case <-tick.C:
		case <-timer.C:
			expired = true // look once more, then fail fast
		case <-req.Context().Done():
			return nil, nil, false, nil, req.Context().Err()
		}
	}
}

// unready says why s has no endpoint for a request to name.
func unready(s *snapshot, name string) string {
	switch {
	case len(s.eps) > 0:
		return "no endpoint of " + name + " ready"
	case !s.exists && s.wait == nil:
		return "no endpoints for unknown service " + name
	}
	return "no endpoints for " + name
}

// leaveFailfast ends g's failfast, if it is in it: a request found an
// endpoint in rotation, so the requests after it queue again.
func (b *Balancer) leaveFailfast(a *authority, g *group, ctx context.Context) {
	if g.failfast.Load() && g.failfast.CompareAndSwap(true, false) {
		b.log.Info("failfast", "an endpoint is ready, no longer failing fast", "authority", a.name)
		b.metrics.gate(a, ctx, true)
	}
}

// failResponse is the answer the balancer makes for err: as Linkerd's
// outbound proxy answers (linkerd/app/outbound/src/http/server.rs), 504
// (gRPC DEADLINE_EXCEEDED) for a fail-fast, 503 (UNAVAILABLE) for a load
// shed.
func failResponse(req *http.Request, code int, err error, msg string) *http.Response {
	resp := proxyerr.Response(req, code, msg)
	resp.Body = errBody{err}
	return resp
}

// wait waits for the first answer for g: the snapshot, nil after the
// resolve timeout, or the error of the request's context.
func (b *Balancer) wait(req *http.Request, g *group, s *snapshot) (*snapshot, error) {
	timer := time.NewTimer(b.cfg.resolveTimeout)
	defer timer.Stop()
	select {
	case <-s.wait:
		return g.state.Load(), nil
	case <-timer.C:
		return nil, nil
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
}

// send sends req to e and accounts for it in e's load until the first
// chunk of its response body, and in e's failure accrual until the body
// ends.
func (t *transport) send(req *http.Request, host string, e *member, probe bool, ent *registry.Entry[authority]) (_ *http.Response, held bool, _ error) {
	b := t.b
	s := &sent{}
	s.peer.Context, s.peer.Peer = req.Context(), e.H2
	if e.Identity != "" {
		s.peer.SetServerTLS(e.Identity, e.ServerName) // mTLS to it, never plaintext
	}
	s.ep.Context, s.ep.ep = &s.peer, &e.Endpoint
	s.labels.Context, s.labels.Labels = &s.ep, e.labels
	ctx := context.Context(&s.labels)
	if meshtrace.Enabled(ctx) {
		meshtrace.EndpointChosen(ctx, e.traced())
	}
	out := req.WithContext(ctx)
	s.url = *req.URL
	s.url.Host = e.addr
	if s.url.Scheme == "" {
		s.url.Scheme = "http"
	}
	out.URL = &s.url
	if out.Host == "" {
		out.Host = host
	}
	overrideAuthority(out, e.AuthorityOverride)
	l := e.load
	l.pending.Add(1)
	ref := b.table.addrs.begin(e)
	start := b.cfg.now()
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		b.table.addrs.end(ref)
		l.pending.Add(-1)
		now := b.cfg.now()
		if req.Context().Err() == nil {
			l.observe(float64(b.cfg.penalty), now, b.decay)
			b.record(e, outcome{failure: true}, probe, now)
			return nil, false, err
		}
		if classify.EndpointTimedOut(req.Context()) {
			// Ended by its policy route's timeout, which Linkerd's proxy
			// enforces under the endpoint's breaker: a failure, whose
			// time is a sample, as the load biaser records an error's
			// elapsed time (linkerd/load-biaser/src/lib.rs,
			// LoadBiaserFuture).
			l.observe(float64(now-start), now, b.decay)
			b.record(e, outcome{failure: true}, probe, now)
			return nil, false, err
		}
		// Given up by its caller before its head (a cancellation, its
		// deadline, a timeout above the balancer such as a ServiceProfile
		// route's): the time it waited is a sample, so an endpoint
		// too slow for its callers looks slow, as Linkerd's load biaser
		// records the elapsed time of a request dropped in flight
		// (linkerd/load-biaser/src/lib.rs, Handle's drop). It is no
		// verdict on the endpoint.
		l.observe(float64(now-start), now, b.decay)
		if probe {
			l.release()
		}
		return nil, false, err
	}
	now := b.cfg.now()
	cl, grpcReq := classify.FromContext(req.Context()), classify.IsGRPC(req.Header)
	o, class, final := headOutcome(cl, grpcReq, resp, time.Now())
	// A penalized response is done with the endpoint's load at its head,
	// as Linkerd's load biaser releases a failure's in-flight count there
	// (linkerd/load-biaser/src/lib.rs, LoadBiaserFuture): its body,
	// however long, is not load. So is a response without a body.
	// Its penalty is its RTT sample, in place of the time it took.
	penalized := b.conf(e.group()).penalize(l, o, now, b.decay)
	noBody := resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil || resp.Body == http.NoBody
	if penalized || noBody {
		l.pending.Add(-1)
	}
	if noBody && !penalized {
		l.observe(float64(now-start), now, b.decay)
	}
	if noBody {
		if !final {
			o.classified(cl.End(class, grpcReq, resp.Trailer), resp.StatusCode)
		}
		b.record(e, o, probe, now)
		b.table.addrs.endOnClose(resp, ref)
		return resp, false, nil
	}
	// The verdict waits for the end of the stream, as Linkerd's breaker
	// takes a response's class when its body ends: a stream that fails
	// is a failure whatever its head said.
	pb := &s.body
	pb.ReadCloser, pb.b, pb.e, pb.ctx, pb.resp, pb.hold, pb.ref = resp.Body, b, e, req.Context(), resp, ent, ref
	pb.probe, pb.head, pb.final, pb.start = probe, o, final, start
	pb.released.Store(penalized)
	if !final {
		pb.classifier, pb.class, pb.grpc = cl, class, grpcReq
	}
	resp.Body = pb
	return resp, true, nil
}

// canonicalDstHeader is the header in which Linkerd's proxy names the
// logical destination of a request it routed by a ServiceProfile.
const canonicalDstHeader = "L5d-Dst-Canonical"

// overrideAuthority applies an endpoint's authority override ("": none) to
// out, a copy of the caller's request whose header it may share: the
// override replaces the Host, and l5d-dst-canonical, which names the
// destination the caller meant, is removed, as Linkerd's proxy rewrites a
// request for an endpoint with an authority_override
// (linkerd/app/outbound/src/http/endpoint.rs, NewOverrideAuthority with
// "host" and l5d-dst-canonical). The header is copied only when there is
// one to remove.
func overrideAuthority(out *http.Request, override string) {
	if override == "" {
		return
	}
	out.Host = override
	if _, ok := out.Header[canonicalDstHeader]; ok {
		out.Header = out.Header.Clone()
		delete(out.Header, canonicalDstHeader)
	}
}

// record folds an outcome into e's accrual; an endpoint back in rotation
// wakes the queue.
func (b *Balancer) record(e *member, o outcome, probe bool, now int64) {
	if e.load.record(o, probe, now, b.conf(e.group()).acc, e.group()) {
		e.group().notify()
	}
}

// pendingBody keeps its request in flight on the endpoint's load until
// the body's first read that returns data or an error, or its closing,
// whichever comes first, and takes the RTT sample then (a penalized
// response left the load at its head), as Linkerd's balancer tracks an
// HTTP response's load until its first body frame
// (hyper-balance/src/lib.rs, PendingUntilFirstData;
// linkerd/proxy/http/src/balance.rs): a long stream is not load once it
// has begun. When the body ends, fails or is closed it gives failure
// accrual its verdict. A failure other than the caller's own cancellation
// counts as a failure and as a penalty sample; a stream its policy route's timeout
// ends ([classify.ErrEndpointTimeout]) as a failure; a body closed or
// given up before its end is classified as it stands then.
type pendingBody struct {
	io.ReadCloser
	b     *Balancer
	e     *member // its load is the request's
	ctx   context.Context
	resp  *http.Response
	hold  *registry.Entry[authority] // the authority's entry, held until the end
	ref   *addrRef                   // the request's count on its address
	done  atomic.Bool
	probe bool    // the request is its endpoint's probe
	head  outcome // what the head said
	// released: the request left the endpoint's pending count, at the
	// head (a penalized response) or at the first chunk.
	released atomic.Bool
	start    int64 // when the request was sent, on the balancer's clock
	// final: the head's class is the response's; otherwise class is its
	// tentative class, which the classifier ends with the trailers.
	final      bool
	grpc       bool // a gRPC call
	class      classify.Class
	classifier *classify.Classifier
}

func (p *pendingBody) Read(buf []byte) (int, error) {
	n, err := p.ReadCloser.Read(buf)
	if (n > 0 || err != nil) && !p.released.Load() {
		p.unload()
	}
	if err != nil {
		p.finish(err)
	}
	return n, err
}

// unload takes the request out of its endpoint's pending count, once, and
// its time to now as an RTT sample.
func (p *pendingBody) unload() {
	if p.released.Swap(true) {
		return
	}
	l, now := p.e.load, p.b.cfg.now()
	l.pending.Add(-1)
	l.observe(float64(now-p.start), now, p.b.decay)
}

func (p *pendingBody) Close() error {
	p.finish(nil)
	return p.ReadCloser.Close()
}

func (p *pendingBody) finish(err error) {
	if p.done.Swap(true) {
		return
	}
	defer p.hold.Unhold()
	defer p.b.table.addrs.end(p.ref)
	p.unload()
	failed := err != nil && !errors.Is(err, io.EOF) && p.ctx.Err() == nil
	if failed {
		p.e.load.observe(float64(p.b.cfg.penalty), p.b.cfg.now(), p.b.decay)
	}
	switch {
	case failed:
		p.head.failure, p.head.limited = true, false
	case err != nil && !errors.Is(err, io.EOF) && classify.EndpointTimedOut(p.ctx):
		// The stream its policy route's timeout ended: a failure, as
		// Linkerd's breaker classifies the error of a response body its
		// endpoint's timeouts end (linkerd/http/classify/src/channel.rs,
		// ResponseBody; linkerd/app/core/src/classify.rs, Class::Error).
		p.head.failure, p.head.limited = true, false
	case p.final:
		// Ended, closed early or given up: the class of the head.
	case errors.Is(err, io.EOF):
		p.head.classified(p.classifier.End(p.class, p.grpc, p.resp.Trailer), p.resp.StatusCode)
	default:
		// Closed or given up before the end: the class of a stream that
		// ended there without trailers, as Linkerd's classifier ends a
		// response body dropped early (linkerd2-proxy
		// linkerd/http/classify/src/channel.rs, ResponseBody's drop;
		// linkerd/app/core/src/classify.rs, Eos::eos without trailers):
		// a gRPC call without its status is a success, a tentative HTTP
		// class stands.
		p.head.classified(p.classifier.End(p.class, p.grpc, nil), p.resp.StatusCode)
	}
	p.b.record(p.e, p.head, p.probe, p.b.cfg.now())
}

// sent is what the Balancer allocates for one request it sends to an
// endpoint, in one allocation: the context that carries the endpoint (its
// h2 hint and TLS, itself, its labels), the request's URL for it and the
// watch on its response body.
type sent struct {
	peer   origproto.EndpointContext // the request's context is its parent
	ep     endpointContext           // &peer is its parent
	labels classify.LabelsContext    // &ep is its parent
	url    url.URL
	body   pendingBody
}

// endpointContext is a context in which [EndpointFromContext] returns ep,
// with Context as its parent.
type endpointContext struct {
	context.Context
	ep *endpoint.Endpoint
}

func (c *endpointContext) Value(key any) any {
	if key == (endpointKey{}) {
		return c.ep
	}
	return c.Context.Value(key)
}

func (c *endpointContext) String() string {
	return fmt.Sprintf("%v.WithValue(balancer.endpointKey, %v)", c.Context, c.ep.Addr)
}

type endpointKey struct{}

// EndpointFromContext returns the endpoint a [Balancer] picked for the
// request with context ctx (its address, weight, labels, identity and
// protocol hints), or the one [WithForward] named, or nil. The endpoint
// is shared and must not be changed.
func EndpointFromContext(ctx context.Context) *endpoint.Endpoint {
	e, _ := ctx.Value(endpointKey{}).(*endpoint.Endpoint)
	return e
}

// backendKey marks the request a router sent to a backend: concrete
// or forward.
type backendKey struct{}

type backendMark struct {
	forward *endpoint.Endpoint
}

var concrete = &backendMark{}

// ConcreteContext is a context for a request that a router sends to one
// concrete backend, named by its URL's host, its Host left as the caller
// sent it, as [WithConcrete] marks one: a [Balancer] balances it over that
// backend's endpoints alone, and watches no traffic split of the backend.
// A profile router uses it for a request to an IP whose profile names its
// service: the profile got for the IP carries the service's dst overrides,
// so the router picks the backend itself (see [Split]), as Linkerd's proxy
// builds the concrete backends of a profile's logical address from the
// targets of the profile it got for the original destination
// (linkerd/app/outbound/src/http/logical/profile.rs). Context is its
// parent. It is for a per-request object that is allocated anyway: a field
// of it used by address is that context at no allocation of its own. Set
// it before first use and leave it unchanged after.
type ConcreteContext struct {
	context.Context
}

// Value returns the mark of a concrete request for the balancer's own key,
// and the parent's value for any other key.
func (c *ConcreteContext) Value(key any) any {
	if key == (backendKey{}) {
		return concrete
	}
	return c.Context.Value(key)
}

// String names the context as context.WithValue's does.
func (c *ConcreteContext) String() string {
	return fmt.Sprintf("%v.WithValue(balancer.backendKey, concrete)", c.Context)
}

// WithForward returns ctx for a request that goes to ep alone, as a
// policy's forward backend or mirror does: a [Balancer] neither resolves
// nor balances it (its address is no authority to look up), and it is
// sent as a Balancer sends to an endpoint it picked: over mTLS with ep's
// identity when ep has one, never in plaintext, upgraded to HTTP/2 when
// ep takes it, and with ep's AuthorityOverride applied as to a picked
// endpoint. [EndpointFromContext] returns ep. The request's URL
// must name ep's address.
func WithForward(ctx context.Context, ep *endpoint.Endpoint) context.Context {
	ctx = origproto.WithPeer(ctx, ep.H2)
	if ep.Identity != "" {
		ctx = origproto.WithServerTLS(ctx, ep.Identity, ep.ServerName)
	}
	return context.WithValue(context.WithValue(ctx, endpointKey{}, ep), backendKey{}, &backendMark{forward: ep})
}

// WithConcrete returns ctx for a request that a policy route sends to one
// of its backends (or mirrors to one): a concrete backend, named by the
// request's URL host (its Host stays the caller's), whose endpoints alone a
// [Balancer] resolves, as Linkerd's proxy does. The backend's own
// traffic split (a ServiceProfile's dstOverrides) applies to requests
// that name it, not to those a route sends it, and is not watched for
// them: a policy's parents and backends are different names, and the
// destination client's bound on profile watches counts the names the
// router watches, not those too.
func WithConcrete(ctx context.Context) context.Context {
	return context.WithValue(ctx, backendKey{}, concrete)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// table is the Balancer's per-authority state, on an internal registry:
// an entry per authority, made on first use; past the bound the least
// recently used is released, and so is one no request used for the idle
// timeout: releasing an authority stops its watches. A request holds its
// entry until its response body ends, so an authority with requests in
// flight is never idle, and eviction takes one only when every authority
// has some. A cached Host is found without a lock or an allocation.
type table struct {
	reg *registry.Registry[authority]
	// live lists the entries not released, for the metrics: a list
	// rather than a map, as a proxy keeps thousands of authorities, each
	// of which knows its place in it.
	liveMu sync.Mutex
	live   []*authority
	closed *authority // what requests get once the Balancer is closed
	shut   atomic.Bool
	addrs  *addrs // the counts of endpoint addresses, nil without WithEndpointRemoved
	// afterLookup, set by tests only, runs in hold between the lookup and
	// the hold: where another request's lookup may evict the entry.
	afterLookup func(host string)
}

func (t *table) init(cfg config, def *groupConf) {
	t.closed = newAuthority("", def)
	t.closed.watching.Store(true)
	t.closed.splitOn.Store(true)
	t.closed.update(endpoint.Update{Err: &watchError{ErrClosed}}, 0, 0, false)
	t.addrs = newAddrs(cfg.removed)
	t.reg = registry.New(func(name string) *authority {
		a := newAuthority(name, def)
		a.addrs = t.addrs
		return a
	}, func(e *registry.Entry[authority]) (func(), error) {
		a := e.Load()
		t.addLive(a)
		return func() {
			t.removeLive(a)
			a.release()
		}, nil
	}, registry.WithMaxEntries(cfg.maxAuthorities), registry.WithIdleTimeout(cfg.idleTimeout))
}

// lookup returns the state of a request's Host (or of a normalized
// authority) and its registry entry, or nil when it is not an authority.
// Only the first request for a Host normalizes it. Once the Balancer is
// closed, an authority gets the closed state and no entry.
func (t *table) lookup(host string) (*authority, *registry.Entry[authority]) {
	if e := t.reg.Get(host); e != nil {
		return e.Load(), e
	}
	if t.shut.Load() {
		if _, err := normalize(host); err == nil {
			return t.closed, nil
		}
	}
	return nil, nil
}

// hold looks host up and holds its entry (see [registry.Entry.Hold]). An
// entry evicted between the lookup and the hold, by a full table's churn
// of new names, is looked up again (at most twice more): its request would
// otherwise watch for an authority already released, a watch beyond the
// table's bound that the source's own bound may refuse. The window is
// narrowed, not closed: an eviction that checked the hold just before it
// was taken, and removes the entry just after the check here, still
// leaves the request a released entry.
func (t *table) hold(host string) (*authority, *registry.Entry[authority]) {
	for i := 0; ; i++ {
		a, ent := t.lookup(host)
		if t.afterLookup != nil {
			t.afterLookup(host)
		}
		ent.Hold()
		if ent == nil || !ent.Released() || i == 2 {
			return a, ent
		}
		ent.Unhold()
	}
}

func (t *table) close() {
	t.shut.Store(true)
	t.reg.Close()
}

// addLive adds a to the authorities not released.
func (t *table) addLive(a *authority) {
	t.liveMu.Lock()
	defer t.liveMu.Unlock()
	if a.live == 0 {
		t.live = append(t.live, a)
		a.live = len(t.live)
	}
}

// removeLive removes a from the authorities not released.
func (t *table) removeLive(a *authority) {
	t.liveMu.Lock()
	defer t.liveMu.Unlock()
	if a.live == 0 {
		return
	}
	i, last := a.live-1, len(t.live)-1
	t.live[i] = t.live[last]
	t.live[i].live = i + 1
	t.live[last] = nil
	t.live = t.live[:last]
	a.live = 0
}

// each calls f for every authority not released. It calls f on a copy of
// the list, so that a collection does not keep new authorities waiting.
func (t *table) each(f func(*authority)) {
	t.liveMu.Lock()
	live := slices.Clone(t.live)
	t.liveMu.Unlock()
	for _, a := range live {
		f(a)
	}
}

// find returns the entry of a normalized authority, or nil; it makes none.
func (t *table) find(name string) *authority {
	if e := t.reg.Lookup(name); e != nil {
		return e.Load()
	}
	return nil
}

func (t *table) len() int { return t.reg.Len() }

// normalize makes a request's Host an authority: port 80 when it has none.
func normalize(host string) (string, error) {
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "80")
	}
	return authpkg.Normalize(host)
}
