package destination

import (
	"context"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/classify"
	authpkg "github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/proxyerr"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/profiles"
)

// Defaults of the [Balancer].
const (
	DefaultResolveTimeout = time.Second
	// ewmaDecay is the time constant of the latency average.
	ewmaDecay = 10 * time.Second
)

// BalancerOption configures a [Balancer].
type BalancerOption interface{ applyBalancer(*Balancer) }

type balancerOptionFunc func(*Balancer)

func (f balancerOptionFunc) applyBalancer(b *Balancer) { f(b) }

// WithResolveTimeout bounds how long a request waits for the first answer
// about its authority (default [DefaultResolveTimeout]); d <= 0 changes
// nothing.
func WithResolveTimeout(d time.Duration) BalancerOption {
	return balancerOptionFunc(func(b *Balancer) {
		if d > 0 {
			b.resolveTimeout = d
		}
	})
}

// WithFallback sets whether a request for a service the control plane says
// does not exist (or will not resolve) goes to its own address, unchanged
// (default true). Without fallback it fails with 503.
func WithFallback(on bool) BalancerOption {
	return balancerOptionFunc(func(b *Balancer) { b.fallback = on })
}

// Balancer resolves each request's authority through the Get stream of a
// [Client] and sends the request to one of its endpoints. When the
// authority's profile has dst overrides, the request first goes to one of
// them by weight (weight 0 is ignored; all zero means the authority itself).
// Among endpoints it picks by weight, and with several endpoints the better
// of two picked at random by a moving average of their latency. It puts the endpoint's protocol hint into the
// request context for origproto and its labels (as dst_*) for classify.
// It is safe for concurrent use; Close stops its watches.
type Balancer struct {
	c              *Client
	resolveTimeout time.Duration
	fallback       bool

	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.RWMutex
	hosts  map[string]hostEntry // by the Host a request gave
	dests  map[string]*balancedDest
	splits map[string]*split
	// full is the destination of every authority past the client's bound
	// on watches: it has no endpoints and an error, so requests fall back.
	full *balancedDest
}

// hostEntry is what a request's Host resolves to, cached so that the
// per-request path neither normalizes nor allocates.
type hostEntry struct {
	authority string
	split     *split
}

// split is the traffic split of an authority: its profile's dst overrides
// with a weight above zero, authorities normalized.
type split struct {
	dsts  atomic.Pointer[[]profiles.WeightedDst]
	total atomic.Uint64
	stop  func()
}

func (s *split) update(u profiles.Update) {
	var dsts []profiles.WeightedDst
	var total uint64
	if u.Profile != nil {
		for _, d := range u.Profile.DstOverrides {
			a, err := authpkg.Normalize(d.Authority)
			if d.Weight == 0 || err != nil {
				continue
			}
			dsts = append(dsts, profiles.WeightedDst{Authority: a, Weight: d.Weight})
			total += uint64(d.Weight)
		}
	}
	s.total.Store(total)
	s.dsts.Store(&dsts)
}

// pick returns the authority a request for the split's authority goes to:
// an override by weight, or "" for the authority itself.
func (s *split) pick() string {
	p := s.dsts.Load()
	if p == nil || len(*p) == 0 {
		return ""
	}
	n := rand.Uint64N(s.total.Load())
	for _, d := range *p {
		if n < uint64(d.Weight) {
			return d.Authority
		}
		n -= uint64(d.Weight)
	}
	return (*p)[len(*p)-1].Authority
}

type balancedDest struct {
	ready chan struct{} // closed at the first answer
	once  sync.Once
	state atomic.Pointer[balancedState]
	stop  func()
}

// balancedState is one endpoint set, ready for picking.
type balancedState struct {
	set       *EndpointSet
	err       error
	endpoints []*balancedEndpoint
	total     uint64 // sum of weights
}

type balancedEndpoint struct {
	Endpoint
	addr   string
	labels *classify.Labels
	// ewma is the latency average in nanoseconds, as float64 bits.
	ewma    atomic.Uint64
	stamp   atomic.Int64 // unix nanos of the last update
	pending atomic.Int64
}

// NewBalancer returns a Balancer over c's endpoint watches.
func NewBalancer(c *Client, opts ...BalancerOption) *Balancer {
	b := &Balancer{c: c, resolveTimeout: DefaultResolveTimeout, fallback: true,
		hosts: make(map[string]hostEntry), dests: make(map[string]*balancedDest), splits: make(map[string]*split),
		full: &balancedDest{ready: make(chan struct{})}}
	b.full.update(EndpointsUpdate{Err: profiles.ErrTooManyWatches})
	b.ctx, b.cancel = context.WithCancel(context.Background())
	for _, o := range opts {
		if o != nil {
			o.applyBalancer(b)
		}
	}
	return b
}

// Close stops every watch.
func (b *Balancer) Close() {
	b.cancel()
	b.mu.Lock()
	var stops []func()
	for _, d := range b.dests {
		stops = append(stops, d.stop)
	}
	for _, s := range b.splits {
		stops = append(stops, s.stop)
	}
	b.mu.Unlock()
	for _, stop := range stops {
		if stop != nil {
			stop()
		}
	}
}

// host returns the authority and traffic split of a request's Host,
// normalizing it and watching its profile on first use. Until the profile
// arrives there is no split.
func (b *Balancer) host(host string) (hostEntry, error) {
	b.mu.RLock()
	e, ok := b.hosts[host]
	b.mu.RUnlock()
	if ok {
		return e, nil
	}
	authority, err := b.normalize(host)
	if err != nil {
		return hostEntry{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.splits[authority]
	if s == nil {
		s = &split{}
		if len(b.splits) < b.c.cfg.maxWatches {
			if stop, err := b.c.Watch(b.ctx, authority, s.update); err == nil {
				s.stop = stop
			}
			b.splits[authority] = s
		}
	}
	e = hostEntry{authority: authority, split: s}
	if len(b.hosts) < 2*b.c.cfg.maxWatches {
		b.hosts[host] = e
	}
	return e, nil
}

// dest returns the endpoints of authority, watching them on first use.
func (b *Balancer) dest(authority string) *balancedDest {
	b.mu.RLock()
	d := b.dests[authority]
	b.mu.RUnlock()
	if d != nil {
		return d
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := b.dests[authority]; d != nil {
		return d
	}
	if len(b.dests) >= b.c.cfg.maxWatches {
		return b.full
	}
	d = &balancedDest{ready: make(chan struct{})}
	stop, err := b.c.WatchEndpoints(b.ctx, authority, func(u EndpointsUpdate) { d.update(u) })
	if err != nil {
		d.update(EndpointsUpdate{Err: err})
	} else {
		d.stop = stop
	}
	b.dests[authority] = d
	return d
}

func (d *balancedDest) update(u EndpointsUpdate) {
	s := &balancedState{set: u.Set, err: u.Err}
	if u.Set != nil {
		old := map[string]*balancedEndpoint{}
		if prev := d.state.Load(); prev != nil {
			for _, e := range prev.endpoints {
				old[e.addr] = e
			}
		}
		for _, e := range u.Set.Endpoints {
			be := &balancedEndpoint{Endpoint: e, addr: e.Addr.String()}
			if prev := old[be.addr]; prev != nil {
				// Keep what was learnt about its latency.
				be.ewma.Store(prev.ewma.Load())
				be.stamp.Store(prev.stamp.Load())
			}
			if len(e.Labels) > 0 {
				be.labels = classify.NewLabels("dst_", e.Labels)
			}
			s.endpoints = append(s.endpoints, be)
			s.total += uint64(max(e.Weight, 1))
		}
	}
	d.state.Store(s)
	d.once.Do(func() { close(d.ready) })
}

// pick chooses an endpoint: two at random by weight, the one with the lower
// cost (latency average times requests in flight) wins.
func (s *balancedState) pick() *balancedEndpoint {
	switch len(s.endpoints) {
	case 0:
		return nil
	case 1:
		return s.endpoints[0]
	}
	a, b := s.weighted(), s.weighted()
	if a == b {
		return a
	}
	if a.cost() <= b.cost() {
		return a
	}
	return b
}

func (s *balancedState) weighted() *balancedEndpoint {
	n := rand.Uint64N(s.total)
	for _, e := range s.endpoints {
		w := uint64(max(e.Weight, 1))
		if n < w {
			return e
		}
		n -= w
	}
	return s.endpoints[len(s.endpoints)-1]
}

func (e *balancedEndpoint) cost() float64 {
	return math.Float64frombits(e.ewma.Load()) * float64(e.pending.Load()+1)
}

// observe folds one latency into the moving average.
func (e *balancedEndpoint) observe(d time.Duration) {
	now := time.Now().UnixNano()
	last := e.stamp.Swap(now)
	prev := math.Float64frombits(e.ewma.Load())
	w := math.Exp(-float64(now-last) / float64(ewmaDecay))
	if last == 0 {
		w = 0
	}
	e.ewma.Store(math.Float64bits(prev*w + float64(d)*(1-w)))
}

// Transport returns the balancing RoundTripper around base (nil:
// http.DefaultTransport; an origproto.Transport to upgrade requests to mesh
// peers).
func (b *Balancer) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &balancerTransport{b: b, base: base}
}

type balancerTransport struct {
	b    *Balancer
	base http.RoundTripper
}

func (t *balancerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	entry, err := t.b.host(host)
	if err != nil {
		return t.base.RoundTrip(req) // not a destination we can resolve
	}
	authority := entry.authority
	if to := entry.split.pick(); to != "" {
		authority = to // traffic split: the request goes to an override's endpoints
	}
	d := t.b.dest(authority)
	select {
	case <-d.ready:
	default:
		timer := time.NewTimer(t.b.resolveTimeout)
		select {
		case <-d.ready:
			timer.Stop()
		case <-timer.C:
			closeBody(req)
			return proxyerr.Response(req, http.StatusServiceUnavailable, "no answer from the control plane for "+authority), nil
		case <-req.Context().Done():
			timer.Stop()
			closeBody(req)
			return nil, req.Context().Err()
		}
	}
	s := d.state.Load()
	switch {
	case s.err != nil:
		if t.b.fallback {
			return t.base.RoundTrip(req)
		}
		closeBody(req)
		return proxyerr.Response(req, http.StatusServiceUnavailable, "cannot resolve "+authority+": "+s.err.Error()), nil
	case s.set != nil && !s.set.Exists:
		if t.b.fallback {
			return t.base.RoundTrip(req)
		}
		closeBody(req)
		return proxyerr.Response(req, http.StatusServiceUnavailable, "unknown service "+authority), nil
	case len(s.endpoints) == 0:
		closeBody(req)
		return proxyerr.Response(req, http.StatusServiceUnavailable, "no endpoints for "+authority), nil
	}
	e := s.pick()
	ctx := context.WithValue(origproto.WithPeer(req.Context(), e.H2), endpointKey{}, &e.Endpoint)
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
	e.pending.Add(1)
	start := time.Now()
	resp, err := t.base.RoundTrip(out)
	e.pending.Add(-1)
	e.observe(time.Since(start))
	return resp, err
}

type endpointKey struct{}

// EndpointFromContext returns the endpoint the [Balancer] picked for the
// request with context ctx (its address, weight, labels, identity and
// protocol hints), or nil.
func EndpointFromContext(ctx context.Context) *Endpoint {
	e, _ := ctx.Value(endpointKey{}).(*Endpoint)
	return e
}

func (b *Balancer) normalize(host string) (string, error) {
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "80")
	}
	return authpkg.Normalize(host)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
