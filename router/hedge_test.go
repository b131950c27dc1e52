package router

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hedgeEndpoints are loopback endpoints that record which request (by its
// X-Request-Id) reached which of them, and stall the first attempt of a
// request marked X-Stall that is not a hedge (see hedgeMarker) until its
// context ends or stall passes: only a hedge answers it sooner. The first
// attempt is known by its mark, not by the order of arrival: on a loaded
// machine a hedge can reach its endpoint before the first attempt reaches
// its own.
type hedgeEndpoints struct {
	eps   []endpoint.Endpoint
	stall time.Duration

	mu        sync.Mutex
	seen      map[string][]int         // request id -> the endpoints it reached, in order
	firsts    map[string]int           // request id -> its attempts other than hedges
	arrived   map[string]chan struct{} // request id -> closed when its first attempt reached an endpoint
	cancelled int                      // stalled requests whose context ended
}

// firstArrived returns a channel closed once the first attempt of the
// request id has reached an endpoint.
func (h *hedgeEndpoints) firstArrived(id string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.arrivalLocked(id)
}

func (h *hedgeEndpoints) arrivalLocked(id string) chan struct{} {
	c, ok := h.arrived[id]
	if !ok {
		c = make(chan struct{})
		h.arrived[id] = c
	}
	return c
}

// fixture is hedgeFixture over h's endpoints, whose hedges wait until
// their request's first attempt has reached its endpoint: on a loaded
// machine a first attempt still dialing when its hedge answers never
// arrives, and the test could not tell which endpoint it was sent to.
func (h *hedgeEndpoints) fixture(t *testing.T, hp *hedge.Policy, opts ...Option) *healthFixture {
	f := hedgeFixture(t, h.eps, hp, opts...)
	f.client.Transport = f.r.Transport(hedgeMarker{base: f.bal.Transport(testutil.NewTransport(t, testutil.H1)), after: h.firstArrived})
	return f
}

func newHedgeEndpoints(t *testing.T, n int, stall time.Duration) *hedgeEndpoints {
	h := &hedgeEndpoints{stall: stall, seen: make(map[string][]int), firsts: make(map[string]int),
		arrived: make(map[string]chan struct{})}
	for i := range n {
		srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			id := r.Header.Get("X-Request-Id")
			h.mu.Lock()
			h.seen[id] = append(h.seen[id], i)
			first := false
			if r.Header.Get(hedgeMark) == "" {
				first = h.firsts[id] == 0
				h.firsts[id]++
				if first {
					close(h.arrivalLocked(id))
				}
			}
			h.mu.Unlock()
			if first && r.Header.Get("X-Stall") != "" {
				select {
				case <-r.Context().Done():
					h.mu.Lock()
					h.cancelled++
					h.mu.Unlock()
					return
				case <-time.After(h.stall):
				}
			}
			fmt.Fprintf(w, "endpoint %d", i)
		}))
		h.eps = append(h.eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(srv.Listener.Addr().String()), Weight: endpoint.DefaultWeight})
	}
	return h
}

func (h *hedgeEndpoints) reached(id string) []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.seen[id]...)
}

func (h *hedgeEndpoints) cancels() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cancelled
}

const hedgeBackend = "backend.test:80"

// hedgeMark is the header hedgeMarker sets on a hedge.
const hedgeMark = "X-Test-Hedge"

// hedgeMarker marks each hedge (an attempt that excludes the endpoints its
// request tried) that goes through it with hedgeMark, for hedgeEndpoints.
// With after, a hedge waits until after(its X-Request-Id) is closed (or
// the request ends) before it is sent.
type hedgeMarker struct {
	base  http.RoundTripper
	after func(id string) <-chan struct{}
}

func (m hedgeMarker) RoundTrip(req *http.Request) (*http.Response, error) {
	if _, exclude := balancer.TriedFromContext(req.Context()); exclude {
		if m.after != nil {
			select {
			case <-m.after(req.Header.Get("X-Request-Id")):
			case <-req.Context().Done():
				return nil, req.Context().Err()
			}
		}
		req = req.Clone(req.Context())
		req.Header.Set(hedgeMark, "1")
	}
	return m.base.RoundTrip(req)
}

func hedgeFixture(t *testing.T, eps []endpoint.Endpoint, hp *hedge.Policy, opts ...Option) *healthFixture {
	rule := policy.HTTPRule{Backends: to(balancerBackend("backend", hedgeBackend)), Hedge: hp}
	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{hedgeBackend: eps})
	require.NoError(t, err)
	f := &healthFixture{m: testutil.NewMetrics(t)}
	f.bal = balancer.New(src)
	t.Cleanup(f.bal.Close)
	pol := policy.NewStaticSource(map[string]*policy.Policy{authority: httpPolicy(rule)})
	f.r = New(append([]Option{WithPolicies(pol), WithMeterProvider(f.m.Provider), WithBalancer(f.bal)}, opts...)...)
	t.Cleanup(f.r.Close)
	f.client = &http.Client{Transport: f.r.Transport(hedgeMarker{base: f.bal.Transport(testutil.NewTransport(t, testutil.H1))})}
	req, _ := http.NewRequest("GET", "http://svc.test/", nil)
	require.Eventually(t, func() bool { return f.r.Explain(req).Model == ModelPolicy }, testutil.Timeout, 5*time.Millisecond)
	return f
}

// A request that stalls past the route's delay is sent again to another
// endpoint; the first answer wins and the stalled attempt is cancelled.
// The cases are the rules of the hedge: idempotent methods or a route
// marked idempotent, bodies within the replay limit, never to the same
// endpoint (with one endpoint, no hedge), a percentile only once learnt,
// and the share of extra load.
func TestHedgeToAnotherEndpoint(t *testing.T) {
	fixed := &hedge.Policy{Delay: 20 * time.Millisecond}
	for _, tc := range []struct {
		name      string
		endpoints int
		policy    *hedge.Policy
		option    *hedge.Policy // WithHedging
		method    string
		body      string
		unknown   bool // the body's length unknown (net/http's ContentLength 0)
		hedged    bool
	}{
		{name: "GET is hedged", endpoints: 3, policy: fixed, method: "GET", hedged: true},
		{name: "PUT with a body is hedged", endpoints: 3, policy: fixed, method: "PUT", body: "payload", hedged: true},
		{name: "DELETE is hedged", endpoints: 2, policy: fixed, method: "DELETE", hedged: true},
		{name: "POST is not", endpoints: 3, policy: fixed, method: "POST", body: "x"},
		{name: "POST on an idempotent route is", endpoints: 3, policy: &hedge.Policy{Delay: 20 * time.Millisecond, Idempotent: true},
			method: "POST", body: "payload", hedged: true},
		{name: "a body past the replay limit is not", endpoints: 3, policy: fixed, method: "PUT",
			body: strings.Repeat("x", MaxRetryBodyBytes+1)},
		{name: "a body of unknown length is not", endpoints: 3, policy: fixed, method: "PUT", body: "payload", unknown: true},
		{name: "one endpoint: no other to hedge to", endpoints: 1, policy: fixed, method: "GET"},
		{name: "a percentile not learnt yet hedges nothing", endpoints: 3, policy: &hedge.Policy{Percentile: 95}, method: "GET"},
		{name: "the router's option for routes without their own", endpoints: 3, option: fixed, method: "GET", hedged: true},
		{name: "no policy, no hedge", endpoints: 3, method: "GET"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stall := 300 * time.Millisecond
			if tc.hedged {
				stall = time.Minute // only a hedge can answer in time
			}
			h := newHedgeEndpoints(t, tc.endpoints, stall)
			f := h.fixture(t, tc.policy, WithHedging(tc.option))
			var body io.Reader = strings.NewReader(tc.body)
			if tc.unknown {
				body = struct{ io.Reader }{body} // no Len: NewRequest cannot measure it
			}
			req, err := http.NewRequest(tc.method, "http://svc.test/", body)
			require.NoError(t, err)
			req.Header.Set("X-Request-Id", "r1")
			req.Header.Set("X-Stall", "1")
			resp, err := f.client.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			got := h.reached("r1")
			sent := f.m.Value(t, "outbound_http_route_hedge_requests_total")
			won := f.m.Value(t, "outbound_http_route_hedge_wins_total")
			if !tc.hedged {
				assert.Len(t, got, 1, "endpoints reached")
				assert.Contains(t, []string{"", "0"}, sent, "hedges sent")
				return
			}
			require.Len(t, got, 2, "endpoints reached")
			assert.NotEqual(t, got[0], got[1], "the hedge went to the endpoint already trying")
			assert.Equal(t, fmt.Sprintf("endpoint %d", got[1]), string(b), "the hedge's answer wins")
			assert.Equal(t, "1", sent)
			assert.Equal(t, "1", won)
			require.Eventually(t, func() bool { return h.cancels() == 1 }, testutil.Timeout, 5*time.Millisecond,
				"the stalled attempt is cancelled")
			e := f.r.Explain(req)
			require.NotNil(t, e.Hedge)
			assert.Equal(t, uint64(1), e.Hedge.Sent)
			assert.Equal(t, uint64(1), e.Hedge.Won)
			assert.Contains(t, e.Hedge.Policy, "after 20ms")
		})
	}
}

// The share of extra load bounds hedges: a route starts with one hedge in
// hand and earns MaxExtraLoad per request; a stalled request past it is
// not hedged and counted as an overflow.
func TestHedgeShareOfExtraLoad(t *testing.T) {
	// A stall far past the delay: on a loaded machine a hedge timer or a
	// hedge's dial late by a tenth of a second still comes before the
	// stalled attempt ends.
	h := newHedgeEndpoints(t, 3, 2*time.Second)
	f := h.fixture(t, &hedge.Policy{Delay: 20 * time.Millisecond, MaxExtraLoad: 0.01})
	for i := range 3 {
		req, _ := http.NewRequest("GET", "http://svc.test/", nil)
		req.Header.Set("X-Request-Id", fmt.Sprint("r", i))
		req.Header.Set("X-Stall", "1")
		resp, err := f.client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	assert.Len(t, h.reached("r0"), 2, "the first is hedged")
	assert.Len(t, h.reached("r1"), 1, "the second is not: 1% of three requests is no hedge")
	assert.Len(t, h.reached("r2"), 1)
	assert.Equal(t, "1", f.m.Value(t, "outbound_http_route_hedge_requests_total"))
	assert.Equal(t, "2", f.m.Value(t, "outbound_http_route_hedge_overflow_total"))
}

// A percentile delay is learnt from the route's own latencies: once it has
// enough samples, requests slower than its p90 are hedged.
func TestHedgeLearntPercentile(t *testing.T) {
	h := newHedgeEndpoints(t, 3, time.Minute)
	f := h.fixture(t, &hedge.Policy{Percentile: 90, MaxExtraLoad: 1})
	req, _ := http.NewRequest("GET", "http://svc.test/", nil)
	for i := range hedge.DefaultMinSamples {
		resp, err := f.client.Get(fmt.Sprint("http://svc.test/?n=", i))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	e := f.r.Explain(req)
	require.NotNil(t, e.Hedge)
	require.NotEmpty(t, e.Hedge.Delay, "learnt after %d samples", hedge.DefaultMinSamples)
	req.Header.Set("X-Request-Id", "slow")
	req.Header.Set("X-Stall", "1")
	resp, err := f.client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	got := h.reached("slow")
	require.Len(t, got, 2)
	assert.NotEqual(t, got[0], got[1])
}

// A route with a hedge and no retry shares the router's retry budget, so
// its requests earn budget as a retried route's do: with a retry for
// every two requests and no minimum, ten plain requests pay for the hedge
// of the eleventh. A first request alone earns half a retry: its hedge is
// refused and counted as an overflow.
func TestHedgeOnlyRouteEarnsRetryBudget(t *testing.T) {
	budget := &profiles.RetryBudget{RetryRatio: 0.5, MinRetriesPerSecond: 0, TTL: 10 * time.Second}
	stalled := func(t *testing.T, f *healthFixture, id string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://svc.test/", nil)
		require.NoError(t, err)
		req.Header.Set("X-Request-Id", id)
		req.Header.Set("X-Stall", "1")
		resp, err := f.client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	t.Run("earned", func(t *testing.T) {
		h := newHedgeEndpoints(t, 3, 2*time.Second)
		f := h.fixture(t, &hedge.Policy{Delay: 20 * time.Millisecond, MaxExtraLoad: 1}, WithRetryBudget(budget))
		for range 10 {
			resp, err := f.client.Get("http://svc.test/")
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		stalled(t, f, "slow")
		assert.Len(t, h.reached("slow"), 2, "hedged on the budget ten requests earned")
	})
	t.Run("not earned", func(t *testing.T) {
		h := newHedgeEndpoints(t, 3, 2*time.Second)
		f := h.fixture(t, &hedge.Policy{Delay: 20 * time.Millisecond, MaxExtraLoad: 1}, WithRetryBudget(budget))
		stalled(t, f, "slow")
		assert.Len(t, h.reached("slow"), 1, "no budget, no hedge")
		assert.Equal(t, "1", f.m.Value(t, "outbound_http_route_hedge_overflow_total"))
	})
}

// A zone-aware balancer (three healthy endpoints in the local zone, three
// in another) behind a hedged route: every first attempt stays in the
// local zone, and so does every hedge, which has two other healthy local
// endpoints to go to.
func TestHedgeStaysInHealthyLocalZone(t *testing.T) {
	h := newHedgeEndpoints(t, 6, 10*time.Second)
	for i := range h.eps {
		zone := "zone-a"
		if i >= 3 {
			zone = "zone-b"
		}
		h.eps[i].Labels = map[string]string{balancer.ZoneLabel: zone}
	}
	rule := policy.HTTPRule{Backends: to(balancerBackend("backend", hedgeBackend)),
		Hedge: &hedge.Policy{Delay: 20 * time.Millisecond, MaxExtraLoad: 1}}
	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{hedgeBackend: h.eps})
	require.NoError(t, err)
	// Every first attempt here stalls until its hedge answers and is
	// then given up: a sample of its wait (the hedge delay and the
	// hedge's round trip) in the local endpoint's estimate. The remote
	// endpoints get no request and keep the default RTT; at the
	// library's 30 ms, waits of 60 ms on a loaded machine made the local
	// zone look twice as slow as the remote one and spill. A default of
	// a second keeps the zone healthy by the band however slow the
	// machine, which is what this test is about: where the hedges go.
	bal := balancer.New(src, balancer.WithLocalZone("zone-a"), balancer.WithPeakEWMA(time.Second, balancer.DefaultDecay))
	t.Cleanup(bal.Close)
	r := New(WithPolicies(policy.NewStaticSource(map[string]*policy.Policy{authority: httpPolicy(rule)})), WithBalancer(bal))
	t.Cleanup(r.Close)
	client := &http.Client{Transport: r.Transport(bal.Transport(testutil.NewTransport(t, testutil.H1)))}
	probe, _ := http.NewRequest("GET", "http://svc.test/", nil)
	require.Eventually(t, func() bool { return r.Explain(probe).Model == ModelPolicy }, testutil.Timeout, 5*time.Millisecond)

	const n = 30
	firstOut, hedgesOut, hedged := 0, 0, 0
	for i := range n {
		id := fmt.Sprint("r", i)
		req, _ := http.NewRequest("GET", "http://svc.test/", nil)
		req.Header.Set("X-Request-Id", id)
		req.Header.Set("X-Stall", "1")
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got := h.reached(id)
		if got[0] >= 3 {
			firstOut++
		}
		if len(got) > 1 {
			hedged++
			if got[1] >= 3 {
				hedgesOut++
			}
		}
	}
	t.Logf("first attempts out of zone: %d of %d; hedges out of zone: %d of %d; zone state %+v", firstOut, n, hedgesOut, hedged, *bal.Zone(hedgeBackend))
	require.Equal(t, n, hedged)
	require.Zero(t, firstOut, "first attempts stay in the healthy local zone")
	require.Zero(t, hedgesOut, "hedges of a healthy local zone stay in it (two other local endpoints are in rotation)")
}
