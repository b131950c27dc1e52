package balancer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The destination client is a source of endpoints.
var _ Source = (*destination.Client)(nil)

func TestRoutesToEndpoints(t *testing.T) {
	a, b := backend(t, "a"), backend(t, "b")
	a.H2 = true // a is a mesh peer: upgraded
	store := controlplane.NewStore()
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{a, b})
	_, client := newClient(t, controlPlane(t, store))
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

func TestWeights(t *testing.T) {
	a, b := backend(t, "a"), backend(t, "b")
	a.Weight, b.Weight = 9000, 1000
	// A still clock: every RTT sample is 0, so a slow answer on a loaded
	// machine cannot make load decide instead of the weights.
	clock := &fakeClock{}
	_, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{books + ":7000": {a, b}}), withClock(clock.read))
	count := map[string]int{}
	for range 400 {
		_, body, _ := fetch(t, client, "http://"+books+":7000/")
		count[body[:1]]++
	}
	// The first draw is a nine times in ten; the second is then b, and
	// load decides. Both equally loaded: a clearly dominates.
	assert.Greater(t, count["a"], 3*count["b"], "%v", count)
	assert.Positive(t, count["b"], "%v", count)
}

// An authority with no endpoints, and without fallback one the source
// says does not exist, fails fast once its queue's failfast timeout has
// passed (TestEmptySetQueues: endpoints arriving meanwhile serve it), with
// 504 Gateway Timeout, as linkerd2-proxy's
// outbound_fails_fast_when_destination_has_no_endpoints and
// _does_not_exist (linkerd/app/integration/src/tests/discovery.rs) assert.
func TestFailsFast(t *testing.T) {
	src := staticSource(t, map[string][]endpoint.Endpoint{"empty.ns.svc.cluster.local:80": nil})
	const failfast = 100 * time.Millisecond
	_, client := newClient(t, src, WithFallback(false), WithQueue(10, failfast))
	start := time.Now()
	status, _, h := fetch(t, client, "http://empty.ns.svc.cluster.local/")
	assert.GreaterOrEqual(t, time.Since(start), failfast)
	assert.Equal(t, 504, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), "fail-fast: no endpoints")
	status, _, h = fetch(t, client, "http://unknown.ns.svc.cluster.local/")
	assert.Equal(t, 504, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), "fail-fast: no endpoints for unknown service")
}

// A service the control plane does not know (exists: false) is reached at
// its own address, unchanged.
func TestFallsBackForUnknownService(t *testing.T) {
	direct := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("direct " + r.Host))
	}))
	_, client := newClient(t, controlPlane(t, controlplane.NewStore()))
	status, body, _ := fetch(t, client, direct.URL) // 127.0.0.1:port: exists=false
	assert.Equal(t, 200, status)
	assert.Equal(t, "direct "+strings.TrimPrefix(direct.URL, "http://"), body)

	// Without fallback the same request fails fast.
	_, strict := newClient(t, controlPlane(t, controlplane.NewStore()), WithFallback(false), WithQueue(10, 100*time.Millisecond))
	status, _, h := fetch(t, strict, direct.URL)
	assert.Equal(t, 504, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), "fail-fast: no endpoints for unknown service")
}

// silentSource accepts every watch and never answers, as a control plane
// that is slow to answer.
type silentSource struct{}

func (silentSource) WatchEndpoints(ctx context.Context, _ string, _ func(endpoint.Update)) (func(), error) {
	return func() {}, nil
}

func TestBoundedWait(t *testing.T) {
	_, client := newClient(t, silentSource{}, WithResolveTimeout(100*time.Millisecond))
	start := time.Now()
	status, _, h := fetch(t, client, "http://"+books+":7000/")
	assert.Equal(t, 503, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), "no answer")
	assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)

	// A caller's own cancellation ends the wait with its error.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+books+":7000/", nil)
	b := New(silentSource{}, WithResolveTimeout(time.Hour))
	defer b.Close()
	errc := make(chan error, 1)
	go func() { _, err := b.Transport(nil).RoundTrip(req); errc <- err }()
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)
}

func TestLabelsMetrics(t *testing.T) {
	a := backend(t, "a")
	a.Labels = map[string]string{"pod": "books-0"}
	m := testutil.NewMetrics(t)
	b := New(staticSource(t, map[string][]endpoint.Endpoint{books + ":7000": {a}}), WithLogger(quietLogger))
	defer b.Close()
	h1 := &http.Transport{}
	defer h1.CloseIdleConnections()
	picked := make(chan *endpoint.Endpoint, 1)
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
	assert.Nil(t, EndpointFromContext(context.Background()))
}

// The request keeps the authority it was addressed to as its Host (the
// URL names the endpoint), unless the endpoint overrides it.
func TestHostAndAuthorityOverride(t *testing.T) {
	plain := backend(t, "p")
	over := backend(t, "o")
	over.AuthorityOverride = "books-west.example.com:7000"
	src := staticSource(t, map[string][]endpoint.Endpoint{books + ":7000": {plain}, "west.ns.svc.cluster.local:80": {over}})
	_, client := newClient(t, src)
	_, body, _ := fetch(t, client, "http://"+books+":7000/")
	assert.Equal(t, "p HTTP/1.1 "+books+":7000", body)
	// A Host header naming the authority, with the URL at some address.
	req, _ := http.NewRequest("GET", "http://127.0.0.1:1/", nil)
	req.Host = books + ":7000"
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	_, body, _ = fetch(t, client, "http://west.ns.svc.cluster.local/")
	assert.Equal(t, "o HTTP/1.1 books-west.example.com:7000", body)
}

// Linkerd's profile_dst_overrides cases: traffic moves between backends as
// the profile's overrides change.
func TestTrafficSplit(t *testing.T) {
	store := controlplane.NewStore()
	store.PutEndpoints("books-v1.default.svc.cluster.local:7000", []endpoint.Endpoint{backend(t, "1")})
	store.PutEndpoints("books-v2.default.svc.cluster.local:7000", []endpoint.Endpoint{backend(t, "2")})
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{backend(t, "o")})
	cp := controlPlane(t, store)
	_, client := newClient(t, cp, WithSplits(profiles.Splits(cp)))
	setSplit := func(w1, w2 uint32) {
		store.PutServiceProfile(&profiles.ServiceProfile{Name: books, DstOverrides: []endpoint.WeightedDst{
			{Authority: "books-v1.default.svc.cluster.local:7000", Weight: w1},
			{Authority: "books-v2.default.svc.cluster.local:7000", Weight: w2},
		}})
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
		t.Helper()
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
	store.PutServiceProfile(&profiles.ServiceProfile{Name: books}) // remove_a_dst_override
	waitOnly("o")
}

// Past the bound on authorities, the least recently used one is released:
// its watch stops, and a later request for it watches anew.
func TestBound(t *testing.T) {
	a := backend(t, "a")
	src := &countingSource{Source: staticSource(t, nil)}
	for _, name := range []string{"one", "two", "three"} {
		require.NoError(t, src.Source.(*StaticSource).Set(name+".ns.svc.cluster.local:80", []endpoint.Endpoint{a}))
	}
	b, client := newClient(t, src, WithFallback(false), WithMaxAuthorities(2))
	for _, name := range []string{"one", "two", "three", "one"} {
		status, _, _ := fetch(t, client, "http://"+name+".ns.svc.cluster.local/")
		assert.Equal(t, 200, status, name)
		assert.LessOrEqual(t, b.table.len(), 2)
		assert.LessOrEqual(t, src.open.Load(), int64(2), "watches past the bound are stopped")
	}
	assert.Equal(t, int64(4), src.started.Load(), "the released authority is watched anew")
}

// An authority no request used for the idle timeout is released: its
// endpoint and split watches stop; the next request watches anew.
func TestIdleRelease(t *testing.T) {
	a := backend(t, "a")
	src := &countingSource{Source: staticSource(t, nil)}
	require.NoError(t, src.Source.(*StaticSource).Set(books+":80", []endpoint.Endpoint{a}))
	b, client := newClient(t, src, WithFallback(false), WithIdleTimeout(20*time.Millisecond))
	status, _, _ := fetch(t, client, "http://"+books+"/")
	assert.Equal(t, 200, status)
	assert.Equal(t, int64(1), src.open.Load())
	require.Eventually(t, func() bool { return src.open.Load() == 0 && b.table.len() == 0 }, 10*time.Second, 5*time.Millisecond)
	status, _, _ = fetch(t, client, "http://"+books+"/")
	assert.Equal(t, 200, status)
	assert.Equal(t, int64(2), src.started.Load())
}

// countingSource counts the watches of a Source: started in all, open now.
type countingSource struct {
	Source
	started, open atomic.Int64
}

func (c *countingSource) WatchEndpoints(ctx context.Context, authority string, f func(endpoint.Update)) (func(), error) {
	stop, err := c.Source.WatchEndpoints(ctx, authority, f)
	if err != nil {
		return nil, err
	}
	c.started.Add(1)
	c.open.Add(1)
	var once sync.Once
	return func() { once.Do(func() { c.open.Add(-1); stop() }) }, nil
}

// A request whose Host is not an authority goes to its own address.
func TestNotAnAuthority(t *testing.T) {
	var got string
	b := New(staticSource(t, nil), WithLogger(quietLogger))
	defer b.Close()
	rt := b.Transport(roundTrip(func(r *http.Request) (*http.Response, error) {
		got = r.URL.Host
		return &http.Response{StatusCode: 204, Body: http.NoBody, Request: r}, nil
	}))
	req, _ := http.NewRequest("GET", "http://bad_host!:99999/", nil)
	resp, err := rt.RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, 204, resp.StatusCode)
	assert.Equal(t, "bad_host!:99999", got)
}

// A closed Balancer does not wait for answers it will never get.
func TestClosed(t *testing.T) {
	b, client := newClient(t, silentSource{}, WithFallback(false), WithResolveTimeout(time.Hour))
	b.Close()
	status, _, h := fetch(t, client, "http://"+books+":7000/")
	assert.Equal(t, 503, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), ErrClosed.Error())
	b.Close()
}

// A closed Balancer no longer knows which authorities are mesh Services,
// so none of its requests falls back to its own address (plaintext, by
// the resolver's answer), even with fallback on: not a Service it was
// balancing, nor one it never saw. Each gets a 503 naming ErrClosed.
func TestClosedNeverFallsBack(t *testing.T) {
	var direct atomic.Int64
	own := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { direct.Add(1) }))
	watched := strings.TrimPrefix(own.URL, "http://")
	b, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{watched: {backend(t, "endpoint")}}), WithFallback(true))
	status, body, _ := fetch(t, client, "http://"+watched+"/")
	require.Equal(t, 200, status)
	require.True(t, strings.HasPrefix(body, "endpoint "), body)
	b.Close()
	other := strings.TrimPrefix(testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { direct.Add(1) })).URL, "http://")
	for _, host := range []string{watched, other} {
		status, _, h := fetch(t, client, "http://"+host+"/")
		assert.Equal(t, 503, status, host)
		assert.Contains(t, h.Get("l5d-proxy-error"), ErrClosed.Error(), host)
	}
	assert.Zero(t, direct.Load(), "requests sent to their own address after Close")
}

// fullSource refuses every watch, as a control-plane client at its bound.
type fullSource struct{}

var errTooManyWatches = errors.New("too many watched authorities")

func (fullSource) WatchEndpoints(context.Context, string, func(endpoint.Update)) (func(), error) {
	return nil, errTooManyWatches
}

// Requests for many authorities that cannot be watched log one line per
// interval, not one each.
func TestWatchFailuresRateLimited(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
	b := New(fullSource{}, WithLogger(log), WithFallback(false))
	defer b.Close()
	rt := b.Transport(nil)
	for i := range 50 {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://svc-%d.ns.svc.cluster.local/", i), nil)
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		assert.Equal(t, 503, resp.StatusCode)
		assert.Contains(t, resp.Header.Get("l5d-proxy-error"), "too many watched authorities")
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, strings.Count(buf.String(), "cannot watch endpoints"), buf.String())
}

// A watch the source refuses at its bound is not the source's word that
// the Service does not exist: the request gets a 503 and never goes to its
// own address (for a Service, outside the mesh, by the machine's
// resolver), fallback or not. The Balancer still falls back for an
// authority the source says does not exist.
func TestRefusedWatchNeverFallsBack(t *testing.T) {
	var direct atomic.Int64
	base := roundTrip(func(r *http.Request) (*http.Response, error) {
		direct.Add(1)
		return &http.Response{StatusCode: 204, Body: http.NoBody, Request: r}, nil
	})
	b := New(fullSource{}, WithLogger(quietLogger))
	defer b.Close()
	rt := b.Transport(base)
	for range 3 {
		req, _ := http.NewRequest("GET", "http://"+books+":7000/", nil)
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		assert.Equal(t, 503, resp.StatusCode)
		assert.Contains(t, resp.Header.Get("l5d-proxy-error"), "cannot watch "+books+":7000: too many watched authorities")
	}
	assert.Zero(t, direct.Load(), "no request left through the base transport")

	for _, tc := range []struct {
		name string
		src  Source
	}{
		{"does not exist", staticSource(t, nil)},
		{"cannot resolve", errSource{errors.New("InvalidArgument: not a name the control plane serves")}},
	} {
		before := direct.Load()
		nb := New(tc.src, WithLogger(quietLogger))
		req, _ := http.NewRequest("GET", "http://"+books+":7000/", nil)
		resp, err := nb.Transport(base).RoundTrip(req)
		require.NoError(t, err)
		assert.Equal(t, 204, resp.StatusCode, "the source's answer %q falls back", tc.name)
		assert.Equal(t, before+1, direct.Load(), tc.name)
		nb.Close()
	}
}

// errSource answers every watch with err, after WatchEndpoints returned,
// as a control plane that cannot resolve the authority does.
type errSource struct{ err error }

func (s errSource) WatchEndpoints(_ context.Context, _ string, update func(endpoint.Update)) (func(), error) {
	done := make(chan struct{})
	go func() { defer close(done); update(endpoint.Update{Err: s.err}) }()
	return func() { <-done }, nil
}

// boundedSource is a Source that watches at most max authorities at once
// and refuses more, as destination.Client does at its bound.
type boundedSource struct {
	src  Source
	max  int64
	open atomic.Int64
}

func (s *boundedSource) WatchEndpoints(ctx context.Context, authority string, update func(endpoint.Update)) (func(), error) {
	if s.open.Add(1) > s.max {
		s.open.Add(-1)
		return nil, errTooManyWatches
	}
	stop, err := s.src.WatchEndpoints(ctx, authority, update)
	if err != nil {
		s.open.Add(-1)
		return nil, err
	}
	var once sync.Once
	return func() { stop(); once.Do(func() { s.open.Add(-1) }) }, nil
}

// A request whose authority another request's lookup evicts before the
// first can hold it looks its authority up again: it does not watch for
// the released one, a watch beyond the table's bound that a source with
// the same bound refuses. Before, at a full table under a churn of new
// names, such a request got the source's refusal (3-17 requests of 50,000
// in examples/bench's watch_table past a full table).
func TestRequestEvictedBeforeItsHoldLooksUpAgain(t *testing.T) {
	ep := backend(t, "any")
	const a, b = "a.default.svc.cluster.local:7000", "b.default.svc.cluster.local:7000"
	src := &boundedSource{src: staticSource(t, map[string][]endpoint.Endpoint{a: {ep}, b: {ep}}), max: 1}
	bal, client := newClient(t, src, WithMaxAuthorities(1), WithFallback(false))
	var once sync.Once
	bal.table.afterLookup = func(host string) {
		if host != a {
			return
		}
		// Between a's lookup and its hold, a request for b evicts a's
		// entry and takes the source's one watch.
		once.Do(func() {
			status, _, _ := fetch(t, client, "http://"+b+"/")
			require.Equal(t, 200, status)
		})
	}
	status, body, h := fetch(t, client, "http://"+a+"/")
	assert.Equal(t, 200, status, "%s %s", body, h.Get("l5d-proxy-error"))
	assert.Equal(t, int64(1), src.open.Load(), "a's watch, b's released")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// fixedSplits is a SplitSource of fixed splits that counts its open
// watches.
type fixedSplits struct {
	m    map[string][]endpoint.WeightedDst
	open atomic.Int64
}

func (f *fixedSplits) WatchSplit(ctx context.Context, authority string, update func([]endpoint.WeightedDst)) (func(), error) {
	f.open.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		update(f.m[authority])
		<-ctx.Done()
	}()
	var once sync.Once
	return func() { cancel(); <-done; once.Do(func() { f.open.Add(-1) }) }, nil
}

// Any SplitSource splits traffic, not only profiles; its watches end with
// the Balancer. A nil SplitSource, even in an interface, means no split.
func TestSplitSource(t *testing.T) {
	src := staticSource(t, map[string][]endpoint.Endpoint{books + ":7000": {backend(t, "o")}, "v2.ns.svc.cluster.local:7000": {backend(t, "2")}})
	splits := &fixedSplits{m: map[string][]endpoint.WeightedDst{books + ":7000": {{Authority: "v2.ns.svc.cluster.local:7000", Weight: 1}}}}
	b, client := newClient(t, src, WithSplits(splits))
	require.Eventually(t, func() bool {
		_, body, _ := fetch(t, client, "http://"+books+":7000/")
		return strings.HasPrefix(body, "2 ")
	}, testutil.Timeout, 10*time.Millisecond)
	assert.EqualValues(t, 1, splits.open.Load())
	b.Close()
	assert.EqualValues(t, 0, splits.open.Load(), "Close stops the split watches")

	_, client = newClient(t, src, WithSplits((*fixedSplits)(nil)))
	_, body, _ := fetch(t, client, "http://"+books+":7000/")
	assert.True(t, strings.HasPrefix(body, "o "), body)
}
