package destination

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/classify"
	pb "github.com/inmesh/inmesh/destination/destinationpb"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

func backend(t *testing.T, name string) (*httptest.Server, Endpoint) {
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = origproto.NewServer(origproto.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name+" "+r.Proto+" "+r.Host)
	})))
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, Endpoint{Addr: netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://")), Weight: DefaultWeight}
}

func balancedClient(t *testing.T, c *Client, opts ...BalancerOption) (*Balancer, *http.Client) {
	b := NewBalancer(c, opts...)
	t.Cleanup(b.Close)
	h2 := origproto.NewH2Transport()
	t.Cleanup(h2.CloseIdleConnections)
	h1 := &http.Transport{}
	t.Cleanup(h1.CloseIdleConnections)
	return b, &http.Client{Transport: b.Transport(origproto.NewTransport(origproto.WithH2(h2), origproto.WithHTTP1(h1))), Timeout: testutil.Timeout}
}

func fetch(t *testing.T, c *http.Client, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestBalancerRoutesToEndpoints(t *testing.T) {
	_, a := backend(t, "a")
	_, b := backend(t, "b")
	a.H2 = true // a is a mesh peer: upgraded
	store := NewStore()
	store.PutEndpoints(books+":7000", []Endpoint{a, b})
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	_, client := balancedClient(t, newTestClient(t, cp.addr))
	seen := map[string]int{}
	for range 200 {
		status, body, _ := fetch(t, client, "http://"+books+":7000/x")
		require.Equal(t, 200, status)
		seen[body]++
	}
	assert.Len(t, seen, 2, "both endpoints get traffic: %v", seen)
	assert.Positive(t, seen["a HTTP/1.1 "+books+":7000"], "the h2-hinted endpoint got HTTP/1.1 through orig-proto: %v", seen)
	assert.Positive(t, seen["b HTTP/1.1 "+books+":7000"], "%v", seen)
}

func TestBalancerWeights(t *testing.T) {
	_, a := backend(t, "a")
	_, b := backend(t, "b")
	a.Weight, b.Weight = 9000, 1000
	store := NewStore()
	store.PutEndpoints(books+":7000", []Endpoint{a, b})
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	_, client := balancedClient(t, newTestClient(t, cp.addr))
	count := map[string]int{}
	for range 400 {
		_, body, _ := fetch(t, client, "http://"+books+":7000/")
		count[body[:1]]++
	}
	// P2C by weight: a is picked unless both draws are b (1%), or b wins
	// on latency; a must clearly dominate.
	assert.Greater(t, count["a"], 3*count["b"], "%v", count)
}

func TestBalancerFailsFast(t *testing.T) {
	store := NewStore()
	store.PutEndpoints("empty.ns.svc.cluster.local:80", nil)
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	c := newTestClient(t, cp.addr)
	_, client := balancedClient(t, c, WithFallback(false))
	status, _, h := fetch(t, client, "http://empty.ns.svc.cluster.local/")
	assert.Equal(t, 503, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), "no endpoints")
	status, _, h = fetch(t, client, "http://unknown.ns.svc.cluster.local/")
	assert.Equal(t, 503, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), "unknown service")
}

func TestBalancerFallsBackForUnknownService(t *testing.T) {
	direct := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "direct") }))
	cp := serve(t, NewServer(NewStore(), WithLogger(quietLogger)))
	_, client := balancedClient(t, newTestClient(t, cp.addr))
	status, body, _ := fetch(t, client, direct.URL) // 127.0.0.1:port: exists=false
	assert.Equal(t, 200, status)
	assert.Equal(t, "direct", body)
}

func TestBalancerBoundedWait(t *testing.T) {
	s := newScripted()
	s.get = func(_ int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.Update]) error {
		return block(st.Context()) // never answers
	}
	cp := serve(t, s)
	_, client := balancedClient(t, newTestClient(t, cp.addr), WithResolveTimeout(100*time.Millisecond))
	start := time.Now()
	status, _, h := fetch(t, client, "http://"+books+":7000/")
	assert.Equal(t, 503, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), "no answer")
	assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)
}

func TestBalancerLabelsMetrics(t *testing.T) {
	_, a := backend(t, "a")
	a.Labels = map[string]string{"pod": "books-0"}
	store := NewStore()
	store.PutEndpoints(books+":7000", []Endpoint{a})
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	m := testutil.NewMetrics(t)
	b := NewBalancer(newTestClient(t, cp.addr))
	defer b.Close()
	h1 := &http.Transport{}
	defer h1.CloseIdleConnections()
	picked := make(chan *Endpoint, 1)
	spy := roundTrip(func(r *http.Request) (*http.Response, error) {
		picked <- EndpointFromContext(r.Context())
		return h1.RoundTrip(r)
	})
	client := &http.Client{Transport: b.Transport(classify.NewTransport(spy, classify.WithMeterProvider(m.Provider)))}
	status, _, _ := fetch(t, client, "http://"+books+":7000/")
	require.Equal(t, 200, status)
	assert.Equal(t, "1", m.Value(t, "request_total", `dst_pod="books-0"`, `direction="outbound"`))
	e := <-picked
	require.NotNil(t, e)
	assert.Equal(t, a.Addr, e.Addr)
	assert.Equal(t, "books-0", e.Labels["pod"])
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Linkerd's profile_dst_overrides cases: traffic moves between backends as
// the profile's overrides change.
func TestBalancerTrafficSplit(t *testing.T) {
	_, v1 := backend(t, "1")
	_, v2 := backend(t, "2")
	store := NewStore()
	store.PutEndpoints("books-v1.default.svc.cluster.local:7000", []Endpoint{v1})
	store.PutEndpoints("books-v2.default.svc.cluster.local:7000", []Endpoint{v2})
	_, orig := backend(t, "o")
	store.PutEndpoints(books+":7000", []Endpoint{orig})
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	_, client := balancedClient(t, newTestClient(t, cp.addr))
	setSplit := func(w1, w2 uint32) {
		sp := serviceProfile(books)
		sp.DstOverrides = []profiles.WeightedDst{
			{Authority: "books-v1.default.svc.cluster.local", Weight: w1},
			{Authority: "books-v2.default.svc.cluster.local", Weight: w2},
		}
		store.PutServiceProfile(sp)
	}
	count := func(n int) map[string]int {
		c := map[string]int{}
		for range n {
			_, body, _ := fetch(t, client, "http://"+books+":7000/")
			c[body[:1]]++
		}
		return c
	}
	waitOnly := func(name string) {
		require.Eventually(t, func() bool { c := count(5); return c[name] == 5 }, testutil.Timeout, 10*time.Millisecond)
	}
	setSplit(10000, 0) // add_a_dst_override, with a zero weight ignored
	waitOnly("1")
	assert.Equal(t, map[string]int{"1": 50}, count(50))
	setSplit(5000, 5000) // add_multiple_dst_overrides
	require.Eventually(t, func() bool { c := count(40); return c["1"] > 5 && c["2"] > 5 }, testutil.Timeout, 10*time.Millisecond)
	setSplit(0, 10000) // set_a_dst_override_weight_to_zero
	waitOnly("2")
	setSplit(0, 0) // set_all_dst_override_weights_to_zero: the original destination
	waitOnly("o")
	setSplit(10000, 0)
	waitOnly("1")
	store.PutServiceProfile(serviceProfile(books)) // remove_a_dst_override
	waitOnly("o")
}

// Past the client's bound on watches, authorities are not watched and
// requests for them fall back (or fail with a reason).
func TestBalancerBound(t *testing.T) {
	_, a := backend(t, "a")
	store := NewStore()
	for _, name := range []string{"one", "two", "three"} {
		store.PutEndpoints(name+".ns.svc.cluster.local:80", []Endpoint{a})
	}
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	b, client := balancedClient(t, newTestClient(t, cp.addr, WithMaxWatches(2)), WithFallback(false))
	for _, name := range []string{"one", "two"} {
		status, _, _ := fetch(t, client, "http://"+name+".ns.svc.cluster.local/")
		assert.Equal(t, 200, status)
	}
	status, _, h := fetch(t, client, "http://three.ns.svc.cluster.local/")
	assert.Equal(t, 503, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), "too many watched authorities")
	b.mu.RLock()
	defer b.mu.RUnlock()
	assert.Len(t, b.dests, 2)
	assert.Len(t, b.splits, 2)
}

// Power of two choices: between two endpoints of equal weight, the one
// with the lower latency average wins when the two draws differ, so it
// gets about three quarters of the picks.
func TestBalancerPrefersLowerLatency(t *testing.T) {
	d := &balancedDest{ready: make(chan struct{})}
	d.update(EndpointsUpdate{Set: &EndpointSet{Exists: true, Endpoints: []Endpoint{
		ep("10.0.0.1:80", false), ep("10.0.0.2:80", false),
	}}})
	s := d.state.Load()
	s.endpoints[0].observe(time.Millisecond)
	s.endpoints[1].observe(100 * time.Millisecond)
	fast := 0
	for range 4000 {
		if s.pick() == s.endpoints[0] {
			fast++
		}
	}
	assert.InDelta(t, 0.75, float64(fast)/4000, 0.05)

	// An endpoint set update keeps what was learnt about latency.
	d.update(EndpointsUpdate{Set: &EndpointSet{Exists: true, Endpoints: []Endpoint{
		ep("10.0.0.1:80", false), ep("10.0.0.2:80", false), ep("10.0.0.3:80", false),
	}}})
	assert.Equal(t, s.endpoints[1].ewma.Load(), d.state.Load().endpoints[1].ewma.Load())
}
