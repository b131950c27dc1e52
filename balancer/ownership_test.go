package balancer

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// streamer starts an endpoint that answers /fail with 500 and /stream with
// a first chunk at once and the rest when release is closed.
func streamer(t *testing.T, release <-chan struct{}) endpoint.Endpoint {
	return backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "last\n")
	}))
}

// A request in flight keeps its authority: a stream that lasts across
// idle sweeps keeps the endpoints' state (the tripped endpoint stays
// tripped) and the endpoint watch, though its first chunk took it out of
// its endpoint's load; once it ends, the authority idles out as any other.
func TestStreamKeepsAuthorityAcrossIdleSweeps(t *testing.T) {
	release := make(chan struct{})
	var once bool
	t.Cleanup(func() {
		if !once {
			close(release)
		}
	})
	x, y := streamer(t, release), streamer(t, release)
	src := &countingSource{Source: staticSource(t, map[string][]endpoint.Endpoint{svc: {x, y}})}
	b, client := newClient(t, src, WithIdleTimeout(time.Hour),
		WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 1,
			Backoff: Backoff{MinBackoff: time.Hour, JitterRatio: -1}}}))

	status, _, _ := fetch(t, client, svcURL+"fail")
	require.Equal(t, 500, status)
	tripped, ready := x, y
	if stateOf(b, svc, x).State != "tripped" {
		tripped, ready = y, x
	}
	require.Equal(t, "tripped", stateOf(b, svc, tripped).State)

	resp, err := client.Get(svcURL + "stream")
	require.NoError(t, err)
	defer resp.Body.Close()
	buf := make([]byte, len("first\n"))
	_, err = io.ReadFull(resp.Body, buf)
	require.NoError(t, err)
	require.EqualValues(t, 0, stateOf(b, svc, ready).Pending, "a stream that has begun is no load")

	// Idle sweeps by hand, two idle timeouts apart, while the stream runs.
	now := time.Now()
	for i := 1; i <= 3; i++ {
		b.table.reg.Sweep(now.Add(time.Duration(2*i) * time.Hour))
	}
	assert.Equal(t, 1, b.table.len(), "the authority is kept")
	assert.EqualValues(t, 1, src.open.Load(), "its watch stays open")
	st := stateOf(b, svc, tripped)
	assert.Equal(t, "tripped", st.State, "its failure accrual is kept")
	assert.Equal(t, time.Hour, st.Penalty)

	status, _, _ = fetch(t, client, svcURL+"fail")
	assert.Equal(t, 500, status)
	assert.EqualValues(t, 1, src.started.Load(), "no second watch")

	once = true
	close(release)
	rest, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "last\n", string(rest))
	assert.EqualValues(t, 0, stateOf(b, svc, ready).Pending)

	// Idle now: the next sweeps release it.
	b.table.reg.Sweep(now.Add(8 * time.Hour))
	b.table.reg.Sweep(now.Add(10 * time.Hour))
	assert.Equal(t, 0, b.table.len())
	assert.EqualValues(t, 0, src.open.Load())
}

// Constructors refuse what would only fail later, on a request: a nil
// Source or a Balancer not made by New panic at once with a message that
// names the mistake (programmer errors); an endpoint without an address
// is an error naming the field, and the last good set stays.
func TestConstructorsRejectBadInput(t *testing.T) {
	for name, src := range map[string]Source{
		"nil interface":    nil,
		"nil StaticSource": (*StaticSource)(nil),
	} {
		t.Run(name, func(t *testing.T) {
			assert.PanicsWithValue(t, "balancer: New: nil Source", func() { New(src) })
		})
	}
	assert.PanicsWithValue(t, "balancer: Transport of a Balancer not made by New", func() { (*Balancer)(nil).Transport(nil) })
	assert.PanicsWithValue(t, "balancer: Transport of a Balancer not made by New", func() { new(Balancer).Transport(nil) })
	assert.NotPanics(t, func() { (*Balancer)(nil).Close() }, "Close is safe on a nil Balancer")
	assert.NotPanics(t, func() { new(Balancer).Close() }, "and on one not made by New")

	good := backend(t, "good")
	src, err := NewStaticSource(map[string][]endpoint.Endpoint{svc: {good}})
	require.NoError(t, err)
	for name, eps := range map[string][]endpoint.Endpoint{
		"zero address": {good, {}},
		"zero port":    {{Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 0)}},
	} {
		t.Run(name, func(t *testing.T) {
			err := src.Set(svc, eps)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "Addr")
			assert.Contains(t, err.Error(), svc)
			_, err = NewStaticSource(map[string][]endpoint.Endpoint{svc: eps})
			assert.ErrorContains(t, err, "Addr")
		})
	}
	_, client := newClient(t, src, WithFallback(false))
	status, body, _ := fetch(t, client, svcURL)
	assert.Equal(t, 200, status, "the last good set stays")
	assert.Contains(t, body, "good")
}

// probed starts an endpoint that answers 500 while failing is set; else
// the first request after hold is set waits for release (the probe in
// flight) and every answer is 200. arrived is closed when that request
// arrives.
type probed struct {
	hits     atomic.Int64
	failing  atomic.Bool
	hold     atomic.Bool
	arrived  chan struct{}
	release  chan struct{}
	released sync.Once
}

func newProbed(t *testing.T) (*probed, endpoint.Endpoint) {
	p := &probed{arrived: make(chan struct{}), release: make(chan struct{})}
	p.failing.Store(true)
	t.Cleanup(p.unblock)
	return p, backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.hits.Add(1)
		if p.failing.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		if p.hold.CompareAndSwap(true, false) {
			close(p.arrived)
			<-p.release
		}
		io.WriteString(w, "ok")
	}))
}

func (p *probed) unblock() { p.released.Do(func() { close(p.release) }) }

// getWith sends n requests for svc with the backend configuration bc, one
// at a time, and returns their statuses.
func getWith(t *testing.T, rt http.RoundTripper, bc *BackendConfig, n int) map[int]int {
	t.Helper()
	out := map[int]int{}
	for range n {
		req, err := http.NewRequestWithContext(WithBackendConfig(context.Background(), bc), "GET", svcURL, nil)
		require.NoError(t, err)
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out[resp.StatusCode]++
	}
	return out
}

func consecutive(maxFailures uint32) *BackendConfig {
	return &BackendConfig{FailureAccrual: &FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: maxFailures,
		Backoff: Backoff{MinBackoff: time.Second, MaxBackoff: time.Minute, JitterRatio: -1}}}}
}

// An endpoint's failure accrual belongs to one backend configuration. Its
// probe is answered under the configuration that sent it, whatever
// configuration other requests for the authority carried meanwhile: the
// endpoint leaves probation and gets traffic again (it used to stay on
// probation for good, its probe never given back, and got no request).
func TestProbationSurvivesConfigurationChange(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var goodHits atomic.Int64
	good := counted(t, &goodHits, ok)
	bad, badEp := newProbed(t)
	bal := New(staticSource(t, map[string][]endpoint.Endpoint{svc: {good, badEp}}), WithLogger(quietLogger), withClock(clock.read))
	t.Cleanup(bal.Close)
	h1 := &http.Transport{}
	t.Cleanup(h1.CloseIdleConnections)
	rt := bal.Transport(h1)
	x, y := consecutive(1), &BackendConfig{QueueCapacity: 7} // y: no accrual

	for bad.hits.Load() == 0 {
		getWith(t, rt, x, 1)
	}
	require.Equal(t, "tripped", stateOf(bal, svc, badEp).State)

	// After its penalty, the probe goes out under x and is held there.
	bad.failing.Store(false)
	bad.hold.Store(true)
	clock.now.Add(int64(time.Second))
	probeDone := make(chan map[int]int, 1)
	go func() {
		codes := map[int]int{}
		for bad.hits.Load() == 1 {
			req, _ := http.NewRequestWithContext(WithBackendConfig(context.Background(), x), "GET", svcURL, nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				codes[-1]++
				break
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[resp.StatusCode]++
		}
		probeDone <- codes
	}()
	<-bad.arrived
	// Meanwhile requests come with another configuration.
	codes := getWith(t, rt, y, 20)
	assert.Equal(t, 20, codes[200], "%v", codes)
	bad.unblock()
	probeCodes := <-probeDone
	assert.Equal(t, 0, probeCodes[500]+probeCodes[-1], "%v", probeCodes)

	bad.hits.Store(0)
	codes = getWith(t, rt, x, 200)
	assert.Equal(t, 200, codes[200], "%v", codes)
	t.Logf("back in rotation: %d of 200 requests", bad.hits.Load())
	assert.Greater(t, bad.hits.Load(), int64(20), "the probe succeeded: back in rotation under x")
}

// Each configuration keeps its own accrual for the same endpoints: an
// endpoint tripped under one backend's failure accrual is in rotation for
// a backend whose accrual did not trip it, and requests under the other
// never count toward its failures.
func TestAccrualPerConfiguration(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var goodHits atomic.Int64
	good := counted(t, &goodHits, ok)
	bad, badEp := newProbed(t)
	bal := New(staticSource(t, map[string][]endpoint.Endpoint{svc: {good, badEp}}), WithLogger(quietLogger), withClock(clock.read))
	t.Cleanup(bal.Close)
	h1 := &http.Transport{}
	t.Cleanup(h1.CloseIdleConnections)
	rt := bal.Transport(h1)
	strict, lenient := consecutive(1), consecutive(1000)

	for bad.hits.Load() == 0 {
		getWith(t, rt, strict, 1)
	}
	bad.hits.Store(0)
	codes := getWith(t, rt, lenient, 200)
	assert.Greater(t, bad.hits.Load(), int64(20), "in rotation under the lenient backend: %v", codes)
	bad.hits.Store(0)
	codes = getWith(t, rt, strict, 200)
	assert.Equal(t, 200, codes[200], "tripped under the strict backend: %v", codes)
	assert.Zero(t, bad.hits.Load())
}

// Configurations equal in every field share their state: a policy update
// that brings an equal BackendConfig (a new value) keeps the endpoint
// tripped. An authority keeps at most MaxConfigurations of them, and
// finding a recent one allocates nothing.
func TestEqualConfigurationsShareState(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var goodHits atomic.Int64
	good := counted(t, &goodHits, ok)
	bad, badEp := newProbed(t)
	bal := New(staticSource(t, map[string][]endpoint.Endpoint{svc: {good, badEp}}), WithLogger(quietLogger), withClock(clock.read))
	t.Cleanup(bal.Close)
	h1 := &http.Transport{}
	t.Cleanup(h1.CloseIdleConnections)
	rt := bal.Transport(h1)

	x := consecutive(1)
	for bad.hits.Load() == 0 {
		getWith(t, rt, x, 1)
	}
	bad.hits.Store(0)
	codes := getWith(t, rt, consecutive(1), 100)
	assert.Equal(t, 100, codes[200], "%v", codes)
	assert.Zero(t, bad.hits.Load(), "an equal configuration finds the endpoint tripped")

	a := lookup(bal, svc)
	for i := range 3 * MaxConfigurations {
		getWith(t, rt, &BackendConfig{QueueCapacity: 1 + i}, 1)
	}
	a.mu.Lock()
	n := len(a.groups)
	a.mu.Unlock()
	assert.Equal(t, MaxConfigurations, n)

	y := &BackendConfig{QueueCapacity: 3}
	getWith(t, rt, y, 1)
	assert.Zero(t, testing.AllocsPerRun(100, func() { bal.group(a, y, clock.read()) }))
}

// A NaN in a failure accrual takes its default, so that a configuration
// is equal to itself (one group, not a new one per request).
func TestNaNAccrualIsDefault(t *testing.T) {
	nan := math.NaN()
	a := newAccrual(&FailureAccrual{Unified: &Unified{SuccessRateThreshold: nan, Backoff: Backoff{JitterRatio: nan}}})
	require.NotNil(t, a)
	assert.Equal(t, DefaultSuccessRate, a.threshold)
	assert.Equal(t, DefaultJitterRatio, a.jitter)
	b := New(staticSource(t, nil), WithLogger(quietLogger))
	defer b.Close()
	c := &BackendConfig{FailureAccrual: &FailureAccrual{Unified: &Unified{SuccessRateThreshold: nan}}}
	assert.Equal(t, b.keyOf(c), b.keyOf(c))
}

// ReadyWith and EndpointsWith answer for one configuration, whatever the
// authority's latest request carried: a first-available distribution asks
// about the backend it is about to choose.
func TestReadyWithConfiguration(t *testing.T) {
	bad, badEp := newProbed(t)
	bal := New(staticSource(t, map[string][]endpoint.Endpoint{svc: {badEp}}), WithLogger(quietLogger))
	t.Cleanup(bal.Close)
	h1 := &http.Transport{}
	t.Cleanup(h1.CloseIdleConnections)
	rt := bal.Transport(h1)
	strictFor := func() *BackendConfig {
		c := consecutive(1)
		c.FailureAccrual.ConsecutiveFailures.Backoff.MinBackoff = time.Hour
		return c
	}
	strict, lenient := strictFor(), consecutive(1000)

	assert.True(t, bal.ReadyWith(svc, strict), "an authority not seen yet is ready")
	getWith(t, rt, strict, 1)
	require.EqualValues(t, 1, bad.hits.Load())
	getWith(t, rt, lenient, 3)
	assert.True(t, bal.Ready(svc), "ready under the latest request's configuration")
	assert.False(t, bal.ReadyWith(svc, strict), "tripped under its own")
	assert.True(t, bal.ReadyWith(svc, lenient))
	assert.True(t, bal.ReadyWith(svc, nil), "the balancer's options: no accrual")
	assert.True(t, bal.ReadyWith(svc, consecutive(2)), "a configuration not used yet starts ready")
	assert.Equal(t, "tripped", bal.EndpointsWith(svc, strictFor())[0].State, "an equal configuration")
	assert.Equal(t, 3, bal.EndpointsWith(svc, lenient)[0].ConsecutiveFailures)
	assert.Equal(t, "ready", bal.EndpointsWith(svc, consecutive(2))[0].State)
}
