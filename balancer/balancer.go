package balancer

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/classify"
	authpkg "github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/proxyerr"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/internal/registry"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/profiles"
)

// ErrClosed is why a closed [Balancer] cannot resolve an authority it was
// not watching yet: such requests fall back, or fail with 503.
var ErrClosed = errors.New("balancer: closed")

// Balancer resolves each request's authority through a [Source] and sends
// the request to one of its endpoints, picked by power of two choices over
// peak-EWMA load (see the package documentation). With [WithProfiles], a
// request first goes to one of its authority's dst overrides by weight.
//
// While an authority has no answer yet, a request waits at most the
// resolve timeout, then gets a 503 with l5d-proxy-error. An authority with
// no endpoints fails at once the same way. One the source says does not
// exist, or cannot resolve, goes to its own address (unless
// [WithFallback](false): 503).
//
// It puts the endpoint's h2 hint into the request context for origproto,
// its labels (as dst_*) for classify, and the endpoint itself for
// [EndpointFromContext]. A Balancer is safe for concurrent use; Close stops
// its watches.
type Balancer struct {
	src   Source
	cfg   config
	decay float64
	rtt   float64
	log   *ratelog.Logger
	// health: picks check endpoint health; penDecay: the load penalty's
	// time constant.
	health   bool
	penDecay float64
	def      *groupConf // the configuration of the options
	metrics  *balMetrics
	ctx      context.Context
	cancel   context.CancelFunc
	table    table
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
	b.health = cfg.accrual != nil || cfg.penaltyEWMA != nil
	b.penDecay = b.decay
	if p := cfg.penaltyEWMA; p != nil && p.PenaltyDecay > 0 {
		b.penDecay = float64(p.PenaltyDecay)
	}
	b.def = b.defaultConf()
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.table.init(cfg)
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
// safe to call more than once.
func (b *Balancer) Close() {
	b.cancel()
	b.metrics.close()
	b.table.close()
}

// authority is the state the Balancer keeps for one authority: its
// traffic split and its endpoints, each one immutable snapshot behind an
// atomic pointer, whether their watches have started, and how to stop
// them when the authority is released.
type authority struct {
	name     string
	split    atomic.Pointer[Split]
	state    atomic.Pointer[snapshot]
	watching atomic.Bool // endpoints
	splitOn  atomic.Bool // profile
	group    *group
	queued   atomic.Int64 // requests in the queue
	metrics  atomic.Pointer[authMetrics]

	mu       sync.Mutex
	stops    []func()
	released bool
}

func newAuthority(name string) *authority {
	a := &authority{name: name, group: &group{}}
	a.state.Store(&snapshot{wait: make(chan struct{}), group: a.group})
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
// it keep its last snapshot.
func (a *authority) release() {
	a.mu.Lock()
	stops := a.stops
	a.stops, a.released = nil, true
	a.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}

// publish makes s the authority's snapshot; the first answer releases
// the requests waiting for one.
func (a *authority) publish(s *snapshot) {
	prev := a.state.Swap(s)
	if prev.wait != nil {
		close(prev.wait)
	}
}

// endpoints returns the authority's snapshot, watching its endpoints on
// first use. The watch starts outside every lock: a Source doing I/O holds
// up only the requests for this authority, which wait for the first answer
// anyway.
func (b *Balancer) endpoints(a *authority) *snapshot {
	if !a.watching.Load() && a.watching.CompareAndSwap(false, true) {
		b.watchEndpoints(a)
	}
	return a.state.Load()
}

func (b *Balancer) watchEndpoints(a *authority) {
	if b.ctx.Err() != nil {
		a.publish(&snapshot{err: ErrClosed})
		return
	}
	stop, err := b.src.WatchEndpoints(b.ctx, a.name, func(u Update) {
		if u.Set == nil && u.Err == nil {
			return
		}
		if u.Err != nil {
			b.log.Info("endpoints unavailable", "endpoints unavailable", "authority", a.name, "error", u.Err)
		}
		prev := a.state.Load()
		ns := newSnapshot(u, prev, b.rtt, b.cfg.now())
		ns.health = b.health
		n := ns.countReady()
		a.group.mu.Lock()
		a.group.ready = n
		a.group.mu.Unlock()
		a.publish(ns)
		a.group.notify()
		b.metrics.update(a, prev, ns)
	})
	if err != nil {
		b.log.Warn("watch endpoints", "cannot watch endpoints", "authority", a.name, "error", err)
		a.publish(&snapshot{err: err})
		return
	}
	a.keep(stop)
}

// watchSplit watches the profile of a request's authority for its dst
// overrides, on first use.
func (b *Balancer) watchSplit(a *authority) {
	if b.cfg.profiles == nil || a.splitOn.Load() || !a.splitOn.CompareAndSwap(false, true) {
		return
	}
	stop, err := b.cfg.profiles.Watch(b.ctx, a.name, func(u profiles.Update) {
		var s *Split
		if u.Profile != nil {
			s = NewSplit(u.Profile.DstOverrides)
		}
		a.split.Store(s)
	})
	if err != nil {
		b.log.Warn("watch split", "cannot watch the traffic split", "authority", a.name, "error", err)
		return
	}
	a.keep(stop)
}

// Transport returns the balancing RoundTripper around base (nil:
// http.DefaultTransport; an origproto.Transport to upgrade requests to mesh
// peers, under a classify.Transport to label metrics by endpoint).
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
	a, ent := b.table.lookup(host)
	if a == nil {
		return t.base.RoundTrip(req) // not an authority we can resolve
	}
	b.watchSplit(a)
	if to := a.split.Load().Pick(); to != "" {
		if o, oe := b.table.lookup(to); o != nil {
			a, ent = o, oe // traffic split: the request goes to an override's endpoints
		}
	}
	// The request holds its authority until it ends (its response body
	// included), so that the idle sweep never releases the state it uses:
	// the loads of the endpoints, their failure accrual, the queue.
	ent.Hold()
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
	if bc, _ := req.Context().Value(backendConfigKey{}).(*BackendConfig); bc != nil {
		b.configure(a.group, bc)
	}
	name := a.name
	if a == b.table.closed {
		name = host
	}
	s := b.endpoints(a)
	if s.wait != nil {
		var err error
		if s, err = b.wait(req, a, s); err != nil {
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
		if b.cfg.fallback {
			resp, err := t.base.RoundTrip(req)
			return resp, false, err
		}
		closeBody(req)
		return proxyerr.Response(req, http.StatusServiceUnavailable, "cannot resolve "+name+": "+s.err.Error()), false, nil
	case !s.exists:
		if b.cfg.fallback {
			resp, err := t.base.RoundTrip(req)
			return resp, false, err
		}
		closeBody(req)
		return proxyerr.Response(req, http.StatusServiceUnavailable, "unknown service "+name), false, nil
	case len(s.eps) == 0:
		closeBody(req)
		return proxyerr.Response(req, http.StatusServiceUnavailable, "no endpoints for "+name), false, nil
	}
	start := b.cfg.now()
	e, probe := s.choose(start, b.decay)
	if e == nil {
		var resp *http.Response
		var err error
		if e, probe, resp, err = b.queue(req, a, name); e == nil {
			closeBody(req)
			return resp, false, err
		}
	}
	b.metrics.dequeued(a, req.Context(), b.cfg.now()-start)
	return t.send(req, host, e, probe, ent)
}

// queuePoll is how often a queued request looks again for an endpoint
// whose penalty ended (other changes wake it at once).
const queuePoll = 10 * time.Millisecond

// queue waits until an endpoint of a is in rotation, at most the failfast
// timeout; past the capacity it refuses at once. It returns the endpoint,
// or the response (503 fail-fast or load-shed) or error (the request's
// own) to answer with.
func (b *Balancer) queue(req *http.Request, a *authority, name string) (*endpoint, bool, *http.Response, error) {
	conf := b.conf(a.group)
	if a.queued.Add(1) > int64(conf.queueCap) {
		a.queued.Add(-1)
		b.log.Info("load shed", "queue full, request refused", "authority", name)
		return nil, false, failResponse(req, ErrLoadShed, "load shed: the queue of "+name+" is full"), nil
	}
	defer a.queued.Add(-1)
	b.metrics.gate(a, req.Context(), false)
	timer := time.NewTimer(conf.failfast)
	defer timer.Stop()
	tick := time.NewTicker(queuePoll)
	defer tick.Stop()
	for {
		wake := a.group.wake()
		if e, probe := a.state.Load().choose(b.cfg.now(), b.decay); e != nil {
			b.metrics.gate(a, req.Context(), true)
			return e, probe, nil, nil
		}
		select {
		case <-wake:
		case <-tick.C:
		case <-timer.C:
			b.metrics.failfast(a, req.Context())
			return nil, false, failResponse(req, ErrFailFast, "fail-fast: no endpoint of "+name+" ready within "+conf.failfast.String()), nil
		case <-req.Context().Done():
			return nil, false, nil, req.Context().Err()
		}
	}
}

// failResponse is the 503 the balancer answers with for err.
func failResponse(req *http.Request, err error, msg string) *http.Response {
	resp := proxyerr.Response(req, http.StatusServiceUnavailable, msg)
	resp.Body = errBody{err}
	return resp
}

// wait waits for the first answer about a: the snapshot, nil after the
// resolve timeout, or the error of the request's context.
func (b *Balancer) wait(req *http.Request, a *authority, s *snapshot) (*snapshot, error) {
	timer := time.NewTimer(b.cfg.resolveTimeout)
	defer timer.Stop()
	select {
	case <-s.wait:
		return a.state.Load(), nil
	case <-timer.C:
		return nil, nil
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
}

// send sends req to e and accounts for it in e's load until the response
// body ends.
func (t *transport) send(req *http.Request, host string, e *endpoint, probe bool, ent *registry.Entry[authority]) (_ *http.Response, held bool, _ error) {
	b := t.b
	ctx := context.WithValue(origproto.WithPeer(req.Context(), e.H2), endpointKey{}, &e.Endpoint)
	if e.Identity != "" {
		ctx = origproto.WithServerIdentity(ctx, e.Identity) // mTLS to it, never plaintext
	}
	if e.labels != nil {
		ctx = classify.WithLabels(ctx, e.labels)
	}
	out := req.WithContext(ctx)
	u := *req.URL
	u.Host = e.addr
	if u.Scheme == "" {
		u.Scheme = "http"
	}
	out.URL = &u
	if out.Host == "" {
		out.Host = host
	}
	if e.AuthorityOverride != "" {
		out.Host = e.AuthorityOverride
	}
	l := e.load
	l.pending.Add(1)
	start := b.cfg.now()
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		l.pending.Add(-1)
		if req.Context().Err() == nil {
			now := b.cfg.now()
			l.observe(float64(b.cfg.penalty), now, b.decay)
			b.record(e, outcome{failure: true}, probe, now)
		} else if probe {
			l.release()
		}
		return nil, false, err
	}
	now := b.cfg.now()
	l.observe(float64(now-start), now, b.decay)
	o, final := headOutcome(resp, time.Now())
	if c := b.conf(e.group()); c.penalty != nil {
		p := c.penalty
		if o.exhausted {
			l.penalize(float64(p.Penalty), c.penDecay, now)
		}
		if o.retryIn > 0 {
			l.avoidFor(min(o.retryIn, int64(p.MaxRetryAfter)), now)
		}
	}
	if final {
		b.record(e, o, probe, now)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil || resp.Body == http.NoBody {
		l.pending.Add(-1)
		if !final {
			b.record(e, o, probe, now)
		}
		return resp, false, nil
	}
	pb := &pendingBody{ReadCloser: resp.Body, b: b, e: e, load: l, ctx: req.Context(), resp: resp, hold: ent}
	if !final {
		pb.verdict, pb.probe, pb.head = true, probe, o
	}
	resp.Body = pb
	return resp, true, nil
}

// record folds an outcome into e's accrual; an endpoint back in rotation
// wakes the queue.
func (b *Balancer) record(e *endpoint, o outcome, probe bool, now int64) {
	if e.load.record(o, probe, now, b.conf(e.group()).acc, e.group()) {
		e.group().notify()
	}
}

// pendingBody keeps its request in flight on the endpoint's load until
// the body ends, fails or is closed. A failure other than the caller's own
// cancellation also counts as a penalty sample.
type pendingBody struct {
	io.ReadCloser
	b    *Balancer
	e    *endpoint
	load *load
	ctx  context.Context
	resp *http.Response
	hold *registry.Entry[authority] // the authority's entry, held until the end
	done atomic.Bool
	// verdict: the outcome waits for the trailers (gRPC).
	verdict bool
	probe   bool
	head    outcome
}

func (p *pendingBody) Read(buf []byte) (int, error) {
	n, err := p.ReadCloser.Read(buf)
	if err != nil {
		p.finish(err)
	}
	return n, err
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
	p.load.pending.Add(-1)
	failed := err != nil && !errors.Is(err, io.EOF) && p.ctx.Err() == nil
	if failed {
		p.load.observe(float64(p.b.cfg.penalty), p.b.cfg.now(), p.b.decay)
	}
	if !p.verdict {
		return
	}
	switch {
	case failed:
		p.head.failure = true
	case p.ctx.Err() != nil || err == nil: // cancelled, or closed before the end: no verdict
		if p.probe {
			p.load.release()
		}
		return
	default:
		if code, ok := grpcStatus(p.resp.Trailer); ok {
			p.head.grpc(code, p.resp.Trailer)
		}
	}
	p.b.record(p.e, p.head, p.probe, p.b.cfg.now())
}

type endpointKey struct{}

// EndpointFromContext returns the endpoint a [Balancer] picked for the
// request with context ctx (its address, weight, labels, identity and
// protocol hints), or nil. The endpoint is shared and must not be changed.
func EndpointFromContext(ctx context.Context) *Endpoint {
	e, _ := ctx.Value(endpointKey{}).(*Endpoint)
	return e
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
	reg    *registry.Registry[authority]
	live   sync.Map   // *authority -> struct{}: the entries not released, for the metrics
	closed *authority // what requests get once the Balancer is closed
	shut   atomic.Bool
}

func (t *table) init(cfg config) {
	t.closed = newAuthority("")
	t.closed.watching.Store(true)
	t.closed.splitOn.Store(true)
	t.closed.publish(&snapshot{err: ErrClosed})
	t.reg = registry.New(newAuthority, func(e *registry.Entry[authority]) (func(), error) {
		a := e.Load()
		t.live.Store(a, struct{}{})
		return func() {
			t.live.Delete(a)
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

func (t *table) close() {
	t.shut.Store(true)
	t.reg.Close()
}

// each calls f for every authority not released.
func (t *table) each(f func(*authority)) {
	t.live.Range(func(k, _ any) bool {
		f(k.(*authority))
		return true
	})
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
