package balancer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// counted starts an endpoint that counts its requests and answers with the
// status fail returns (0: 200).
func counted(t *testing.T, hits *atomic.Int64, fail func(n int64) int) endpoint.Endpoint {
	return backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		if code := fail(n); code != 0 {
			w.WriteHeader(code)
			return
		}
		io.WriteString(w, "ok")
	}))
}

func ok(int64) int { return 0 }

// get sends n requests through c, conc at a time, and returns how many
// got each status.
func get(t *testing.T, c *http.Client, url string, n, conc int) map[int]int {
	t.Helper()
	var mu sync.Mutex
	out := map[int]int{}
	var wg sync.WaitGroup
	work := make(chan struct{}, n)
	for range n {
		work <- struct{}{}
	}
	close(work)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				resp, err := c.Get(url)
				code := -1
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				out[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

func stateOf(b *Balancer, authority string, e endpoint.Endpoint) EndpointState {
	for _, s := range b.Endpoints(authority) {
		if s.Addr == e.Addr.String() {
			return s
		}
	}
	return EndpointState{}
}

const svc = books + ":7000"
const svcURL = "http://" + svc + "/"

// Acceptance: of three endpoints, one failing every request trips after
// its consecutive failures; then under 1% of requests reach it; after its
// penalty exactly one probe goes out, even to twenty concurrent clients;
// each failed probe doubles the penalty up to the maximum, never past it;
// once it recovers, the next probe puts it back in rotation.
func TestAccrualTripsProbesAndRecovers(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var ha, hb, hc atomic.Int64
	var failing atomic.Bool
	failing.Store(true)
	a, b := counted(t, &ha, ok), counted(t, &hb, ok)
	c := counted(t, &hc, func(int64) int {
		if failing.Load() {
			return 500
		}
		return 0
	})
	bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {a, b, c}}), withClock(clock.read),
		WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 3,
			Backoff: Backoff{MinBackoff: time.Second, MaxBackoff: 4 * time.Second, JitterRatio: -1}}}))

	require.Eventually(t, func() bool {
		get(t, client, svcURL, 10, 1)
		return stateOf(bal, svc, c).State == "tripped"
	}, testutil.Timeout, time.Millisecond)
	assert.EqualValues(t, 3, hc.Load(), "it tripped at its third failure in a row")
	assert.Equal(t, time.Second, stateOf(bal, svc, c).Penalty)

	hc.Store(0)
	codes := get(t, client, svcURL, 500, 10)
	assert.Equal(t, 500, codes[200], "the others answer everything: %v", codes)
	assert.Less(t, hc.Load(), int64(5), "under 1%% reach the tripped endpoint")

	for _, want := range []time.Duration{2 * time.Second, 4 * time.Second, 4 * time.Second} {
		clock.now.Add(int64(stateOf(bal, svc, c).Penalty))
		assert.Equal(t, "probation", stateOf(bal, svc, c).State)
		hc.Store(0)
		get(t, client, svcURL, 200, 20)
		assert.EqualValues(t, 1, hc.Load(), "exactly one probe")
		st := stateOf(bal, svc, c)
		assert.Equal(t, "tripped", st.State)
		assert.Equal(t, want, st.Penalty, "the penalty doubles up to the maximum")
	}

	failing.Store(false)
	clock.now.Add(int64(4 * time.Second)) // one penalty
	hc.Store(0)
	get(t, client, svcURL, 300, 10)
	assert.Equal(t, "ready", stateOf(bal, svc, c).State)
	assert.Greater(t, hc.Load(), int64(30), "back in rotation: %d of 300", hc.Load())
}

// With jitter the penalty stays between the minimum and the maximum.
func TestPenaltyBounds(t *testing.T) {
	acc := newAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{}})
	require.NotNil(t, acc)
	assert.Equal(t, DefaultMaxFailures, acc.maxFailures)
	for n := range 100 {
		p := acc.penalty(n)
		assert.GreaterOrEqual(t, p, float64(DefaultMinPenalty))
		assert.LessOrEqual(t, p, float64(DefaultMaxPenalty))
	}
	assert.Greater(t, acc.penalty(0), float64(DefaultMinPenalty), "jittered by default")
	assert.Nil(t, newAccrual(&FailureAccrual{}), "no mode: no accrual")
}

// Acceptance: in unified mode an endpoint failing 30% of its requests is
// ejected; the healthy ones are not.
func TestUnifiedEjectsFlakyEndpoint(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var ha, hb, hc atomic.Int64
	a, b := counted(t, &ha, ok), counted(t, &hb, ok)
	c := counted(t, &hc, func(n int64) int {
		if n%10 < 3 {
			return 503
		}
		return 0
	})
	bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {a, b, c}}), withClock(clock.read),
		WithFailureAccrual(&FailureAccrual{Unified: &Unified{SuccessRateThreshold: 0.8, MinRequests: 5, MaxConsecutiveFailures: 100}}))
	get(t, client, svcURL, 300, 1)
	assert.Equal(t, "tripped", stateOf(bal, svc, c).State)
	assert.Equal(t, "ready", stateOf(bal, svc, a).State)
	assert.Equal(t, "ready", stateOf(bal, svc, b).State)
	assert.Less(t, hc.Load(), int64(30), "ejected early: %d of 300", hc.Load())
}

// Acceptance: the ejection floor keeps two of three endpoints in rotation
// even when all fail.
func TestEjectionFloor(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var h [3]atomic.Int64
	var eps []endpoint.Endpoint
	for i := range h {
		eps = append(eps, counted(t, &h[i], func(int64) int { return 500 }))
	}
	bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: eps}), withClock(clock.read),
		WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 2}, Ejection: Ejection{MinReadyEndpoints: 2}}))
	codes := get(t, client, svcURL, 200, 4)
	assert.Equal(t, 200, codes[500], "no request waits or fails fast: %v", codes)
	ready := 0
	for _, s := range bal.Endpoints(svc) {
		if s.State == "ready" {
			ready++
		}
	}
	assert.Equal(t, 2, ready, "%+v", bal.Endpoints(svc))
}

// Acceptance: with every endpoint tripped, a request past the queue's
// capacity is shed at once (LOAD_SHED), and a queued request is the probe
// once the endpoint's penalty ends. A request that waits the failfast
// timeout gets 504 FAIL_FAST and puts the queue in failfast: the next one
// is shed at once, until a request finds an endpoint again (the probe
// after the next penalty). The balancer families say so.
func TestFailFastAndLoadShed(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	m := testutil.NewMetrics(t)
	var hits atomic.Int64
	down := counted(t, &hits, func(int64) int { return 502 })
	// Requests stay queued between the test's steps (metric scrapes
	// among them, slow under the race detector on a loaded machine) for
	// no more than this; only one waits it out.
	const failfast = 2 * time.Second
	bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {down}}), withClock(clock.read),
		WithMeterProvider(m.Provider), WithQueue(2, failfast),
		WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 1}}))
	status, _, _ := fetch(t, client, svcURL)
	require.Equal(t, 502, status)
	require.Equal(t, "tripped", stateOf(bal, svc, down).State)

	labels := []string{`parent_kind="Service"`, `parent_name="books"`, `parent_namespace="default"`, `parent_port="7000"`, `backend_name="books"`}
	assert.Equal(t, "0", m.Value(t, "outbound_http_balancer_endpoints", append(labels, `endpoint_state="ready"`)...))
	assert.Equal(t, "1", m.Value(t, "outbound_http_balancer_endpoints", append(labels, `endpoint_state="pending"`)...))
	assert.Equal(t, "1", m.Value(t, "outbound_http_balancer_p2c_endpoints", labels...))
	// The update's counter follows its snapshot, which the first request
	// may already have used.
	require.Eventually(t, func() bool {
		return m.Value(t, "outbound_http_balancer_p2c_updates_total", append(labels, `op="Reset"`)...) == "1"
	}, testutil.Timeout, time.Millisecond)

	// Two requests fill the queue; the third is shed at once.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "GET", svcURL, nil)
			resp, err := bal.Transport(nil).RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	a := bal.table.find(svc)
	require.Eventually(t, func() bool { return a.def.queued.Load() == 2 }, testutil.Timeout, time.Millisecond)
	assert.Equal(t, "2", m.Value(t, "outbound_http_balancer_queue_length", labels...))
	req, _ := http.NewRequest("GET", svcURL, nil)
	resp, err := bal.Transport(nil).RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 503, resp.StatusCode)
	assert.ErrorIs(t, ResponseError(resp), ErrLoadShed)
	assert.Contains(t, resp.Header.Get("l5d-proxy-error"), "queue")
	cancel()
	wg.Wait()

	// After its penalty the endpoint is probed; a queued request is the
	// probe (and trips it again).
	hits.Store(0)
	done := sendAsync(bal)
	require.Eventually(t, func() bool { return a.def.queued.Load() == 1 }, testutil.Timeout, time.Millisecond)
	clock.now.Add(int64(DefaultMaxPenalty))
	resp = <-done
	require.NotNil(t, resp)
	resp.Body.Close()
	assert.Equal(t, 502, resp.StatusCode, "the queued request went to the endpoint on probation")
	assert.EqualValues(t, 1, hits.Load())
	require.Equal(t, "tripped", stateOf(bal, svc, down).State)
	assert.Empty(t, m.Value(t, "outbound_http_balancer_queue_gate_shut_total", labels...), "no failfast yet")

	start := time.Now()
	resp, err = client.Get(svcURL)
	require.NoError(t, err)
	resp.Body.Close()
	assert.GreaterOrEqual(t, time.Since(start), failfast, "it waited the failfast timeout")
	assert.Equal(t, 504, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("l5d-proxy-error"), "fail-fast")
	assert.Equal(t, "1", m.Value(t, "outbound_http_balancer_queue_gate_shut_total", labels...))
	assert.Equal(t, "1", m.Value(t, "outbound_http_balancer_queue_gate_timeout_total", labels...))

	// In failfast the next request is shed at once, recognisably on the
	// RoundTripper's response.
	start = time.Now()
	req, _ = http.NewRequest("GET", svcURL, nil)
	resp, err = bal.Transport(nil).RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Less(t, time.Since(start), failfast/2)
	assert.ErrorIs(t, ResponseError(resp), ErrLoadShed)
	assert.Contains(t, resp.Header.Get("l5d-proxy-error"), "failing fast")
	assert.Equal(t, "1", m.Value(t, "outbound_http_balancer_queue_gate_timeout_total", labels...))

	// After the next penalty the probe finds the endpoint: the queue
	// leaves failfast, and the gate opens.
	clock.now.Add(int64(DefaultMaxPenalty))
	status, _, _ = fetch(t, client, svcURL)
	assert.Equal(t, 502, status, "the request went to the endpoint on probation")
	assert.EqualValues(t, 2, hits.Load())
	assert.False(t, a.def.failfast.Load())
	assert.Equal(t, "1", m.Value(t, "outbound_http_balancer_queue_gate_open_total", labels...))
	assert.NotEmpty(t, m.Value(t, "outbound_http_balancer_queue_latency_seconds_count", labels...))
	assert.Equal(t, "0", m.Value(t, "outbound_http_balancer_queue_length", labels...))
}

// Once a request has failed fast, the queue is in failfast: later requests
// are shed at once (LOAD_SHED) until an endpoint is in rotation again,
// which ends it. The steps of linkerd2-proxy's consecutive_failures_accrue
// (linkerd/app/outbound/src/http/logical/tests/failure_accrual.rs), as its
// queue's worker enters and leaves failfast (linkerd/proxy/balance/queue:
// worker.rs, the failfast test of tests.rs). The breaker's backoff runs on
// the fake clock; the failfast timeout on the real one.
func TestFailfastShedsUntilReady(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var status atomic.Int64
	e := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(status.Load())) }))
	const failfast, minBackoff = time.Second, 10 * time.Second
	bal := New(staticSource(t, map[string][]endpoint.Endpoint{svc: {e}}), WithLogger(quietLogger), withClock(clock.read),
		WithQueue(10, failfast), WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 3,
			Backoff: Backoff{MinBackoff: minBackoff, MaxBackoff: 6 * minBackoff, JitterRatio: -1}}}))
	t.Cleanup(bal.Close)
	rt := bal.Transport(nil)
	for _, step := range []struct {
		name    string
		advance time.Duration // the fake clock, before the request
		serve   int           // the endpoint's status
		want    int
		wantErr error // ResponseError
		waits   bool  // the failfast timeout; else answered well within it
	}{
		{name: "good request", serve: 200, want: 200},
		{name: "bad request 1/3", serve: 500, want: 500},
		{name: "bad request 2/3", serve: 500, want: 500},
		{name: "bad request 3/3", serve: 500, want: 500},
		{name: "request while in failfast", serve: 500, want: 504, wantErr: ErrFailFast, waits: true},
		{name: "request while in loadshed", serve: 500, want: 503, wantErr: ErrLoadShed},
		{name: "another request while in loadshed", serve: 500, want: 503, wantErr: ErrLoadShed},
		{name: "bad request while in probation", advance: minBackoff, serve: 500, want: 500},
		{name: "request while the breaker is open again", serve: 500, want: 504, wantErr: ErrFailFast, waits: true},
		{name: "good request while in probation", advance: 2 * minBackoff, serve: 200, want: 200},
		{name: "final good request", serve: 200, want: 200},
	} {
		clock.now.Add(int64(step.advance))
		status.Store(int64(step.serve))
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
		req, err := http.NewRequestWithContext(ctx, "GET", svcURL, nil)
		require.NoError(t, err)
		start := time.Now()
		resp, err := rt.RoundTrip(req)
		took := time.Since(start)
		require.NoError(t, err, step.name)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		assert.Equal(t, step.want, resp.StatusCode, "%s: %s", step.name, resp.Header.Get("l5d-proxy-error"))
		assert.Equal(t, step.wantErr, ResponseError(resp), "%s: %s", step.name, resp.Header.Get("l5d-proxy-error"))
		if step.waits {
			assert.GreaterOrEqual(t, took, failfast, step.name)
		} else {
			assert.Less(t, took, failfast/2, step.name)
		}
	}
}

// An authority with no endpoints is a pool with nothing ready, as in
// linkerd2-proxy's balancer, which an empty Reset or a DoesNotExist leaves
// with no endpoints (linkerd/proxy/balance/queue worker.rs): a request
// waits in the queue, and endpoints that arrive meanwhile serve it (the
// integration test outbound_balancer_waits_for_ready_endpoint,
// linkerd/app/integration/src/tests/discovery.rs). Without fallback, a
// service that does not exist is such a pool too.
func TestEmptySetQueues(t *testing.T) {
	for _, tc := range []struct {
		name  string
		empty func(t *testing.T, src *StaticSource, bal *Balancer, client *http.Client)
		opts  []Option
	}{
		{name: "empty from the start", empty: func(t *testing.T, src *StaticSource, _ *Balancer, _ *http.Client) {
			require.NoError(t, src.Set(svc, nil))
		}},
		{name: "emptied by an update", empty: func(t *testing.T, src *StaticSource, bal *Balancer, client *http.Client) {
			status, _, _ := fetch(t, client, svcURL)
			require.Equal(t, 200, status)
			require.NoError(t, src.Set(svc, nil))
			require.Eventually(t, func() bool { return len(bal.Endpoints(svc)) == 0 }, testutil.Timeout, time.Millisecond)
		}},
		{name: "does not exist, without fallback", opts: []Option{WithFallback(false)},
			empty: func(t *testing.T, src *StaticSource, _ *Balancer, _ *http.Client) { src.Delete(svc) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := staticSource(t, map[string][]endpoint.Endpoint{svc: {backend(t, "old")}})
			// The client's timeout (testutil.Timeout) ends the request
			// long before it could fail fast.
			bal, client := newClient(t, src, append([]Option{WithQueue(10, time.Hour)}, tc.opts...)...)
			tc.empty(t, src, bal, client)
			type answer struct {
				status int
				body   string
				err    error
			}
			done := make(chan answer, 1)
			go func() {
				resp, err := client.Get(svcURL)
				if err != nil {
					done <- answer{err: err}
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				done <- answer{status: resp.StatusCode, body: string(b) + resp.Header.Get("l5d-proxy-error")}
			}()
			require.Eventually(t, func() bool {
				a := bal.table.find(svc)
				return len(done) > 0 || a != nil && a.def.queued.Load() == 1
			}, testutil.Timeout, time.Millisecond)
			require.Zero(t, len(done), "answered before any endpoint arrived")
			require.NoError(t, src.Set(svc, []endpoint.Endpoint{backend(t, "new")}))
			got := <-done
			require.NoError(t, got.err)
			assert.Equal(t, 200, got.status, got.body)
			assert.Contains(t, got.body, "new ")
		})
	}

	// Nothing arrives: the request fails fast after the failfast timeout,
	// the next is shed at once, and endpoints end the failfast.
	for _, tc := range []struct {
		name   string
		eps    map[string][]endpoint.Endpoint
		reason string // in l5d-proxy-error
	}{
		{"empty set", map[string][]endpoint.Endpoint{svc: nil}, "no endpoints for " + svc},
		{"does not exist, without fallback", nil, "unknown service " + svc},
	} {
		t.Run("nothing arrives: "+tc.name, func(t *testing.T) {
			const failfast = time.Second
			src := staticSource(t, tc.eps)
			bal := New(src, WithLogger(quietLogger), WithQueue(10, failfast), WithFallback(false))
			t.Cleanup(bal.Close)
			send := func() (*http.Response, time.Duration) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, "GET", svcURL, nil)
				require.NoError(t, err)
				start := time.Now()
				resp, err := bal.Transport(nil).RoundTrip(req)
				require.NoError(t, err)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp, time.Since(start)
			}
			resp, took := send()
			assert.Equal(t, 504, resp.StatusCode)
			assert.Equal(t, ErrFailFast, ResponseError(resp), resp.Header.Get("l5d-proxy-error"))
			assert.Contains(t, resp.Header.Get("l5d-proxy-error"), tc.reason)
			assert.GreaterOrEqual(t, took, failfast)

			resp, took = send()
			assert.Equal(t, ErrLoadShed, ResponseError(resp), resp.Header.Get("l5d-proxy-error"))
			assert.Contains(t, resp.Header.Get("l5d-proxy-error"), tc.reason)
			assert.Less(t, took, failfast/2)

			require.NoError(t, src.Set(svc, []endpoint.Endpoint{backend(t, "new")}))
			require.Eventually(t, func() bool { return len(bal.Endpoints(svc)) == 1 }, testutil.Timeout, time.Millisecond)
			resp, _ = send()
			assert.Equal(t, 200, resp.StatusCode, resp.Header.Get("l5d-proxy-error"))
			resp, _ = send()
			assert.Equal(t, 200, resp.StatusCode, resp.Header.Get("l5d-proxy-error"))
		})
	}

	// The wait for the first answer counts toward the failfast timeout, as
	// linkerd2-proxy's queue counts discovery: an empty set that comes
	// after the timeout fails the request fast at once.
	t.Run("first answer after the failfast timeout", func(t *testing.T) {
		const failfast = time.Second
		src := heldSource{make(chan func(endpoint.Update), 1)}
		bal := New(src, WithLogger(quietLogger), WithQueue(10, failfast), WithResolveTimeout(time.Hour))
		t.Cleanup(bal.Close)
		done := sendAsync(bal)
		update := <-src.watched
		<-time.After(failfast + failfast/5) // the failfast timeout passes, no answer yet
		answered := time.Now()
		update(endpoint.Update{Set: &endpoint.Set{Exists: true}})
		resp := <-done
		require.NotNil(t, resp)
		resp.Body.Close()
		assert.Equal(t, ErrFailFast, ResponseError(resp), resp.Header.Get("l5d-proxy-error"))
		assert.Less(t, time.Since(answered), failfast/2, "failed fast once the answer came")
	})
}

// heldSource hands the test each watch's update function.
type heldSource struct{ watched chan func(endpoint.Update) }

func (s heldSource) WatchEndpoints(_ context.Context, _ string, update func(endpoint.Update)) (func(), error) {
	s.watched <- update
	return func() {}, nil
}

// The load penalty of a response, as linkerd2-proxy's load biaser records
// it: the cases of the tests in linkerd/load-biaser/src/lib.rs named in
// each row. The hint of a 429 or 503 sets the penalty when it is longer
// than the base penalty (5 s), capped at the maximum (300 s); a shorter
// one counts as the base, so it never bounds the penalty; penalties do
// not add up; and the penalty decays with the load's time constant.
func TestRetryAfterPenalty(t *testing.T) {
	type answer struct {
		status              int
		retryAfter, grpcSts string
	}
	limited := func(retryAfter string) answer { return answer{status: 429, retryAfter: retryAfter} }
	for _, tc := range []struct {
		name    string
		answers []answer
		later   time.Duration // clock advance before the load is read
		want    float64       // penalty in seconds, within 0.1 s
	}{
		{"test_429_injects_penalty", []answer{limited("")}, 0, 5},
		{"test_small_retry_after_floored_at_base_penalty", []answer{limited("1")}, 0, 5},
		{"test_429_with_retry_after_records_hint", []answer{limited("30")}, 0, 30},
		{"test_429_with_retry_after_capped_at_max", []answer{limited("600")}, 0, 300},
		{"test_503_with_retry_after_records_hint", []answer{{status: 503, retryAfter: "30"}}, 0, 30},
		{"test_sequential_failures_maintain_load", []answer{limited(""), limited("")}, 0, 5},
		{"test_penalty_decays_over_time", []answer{limited("")}, 10 * time.Second, 5 * math.Exp(-1)},
		{"test_grpc_server_errors_record_effective_rtt (RESOURCE_EXHAUSTED)", []answer{{status: 200, grpcSts: "8"}}, 0, 5},
		{"test_200_does_not_inject_penalty", []answer{{status: 200}}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{}
			clock.now.Store(1)
			var n atomic.Int64
			a := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				k := int(n.Add(1)) - 1
				if k >= len(tc.answers) {
					io.WriteString(w, "a")
					return
				}
				ans := tc.answers[k]
				if ans.retryAfter != "" {
					w.Header().Set("Retry-After", ans.retryAfter)
				}
				if ans.grpcSts != "" {
					w.Header().Set("Content-Type", "application/grpc")
					w.Header().Set("Grpc-Status", ans.grpcSts)
				}
				w.WriteHeader(ans.status)
			}))
			bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {a}}), withClock(clock.read),
				WithPenaltyPeakEWMA(&PenaltyPeakEWMA{DefaultRTT: time.Millisecond, Decay: 10 * time.Second}))
			// One endpoint: every request goes to it, penalized or not.
			for i := range tc.answers {
				code, _, _ := fetch(t, client, svcURL)
				require.Equal(t, tc.answers[i].status, code, "answer %d", i)
			}
			clock.now.Add(int64(tc.later))
			st := stateOf(bal, svc, a)
			assert.Equal(t, "ready", st.State, "a penalty takes nobody out of rotation")
			assert.InDelta(t, tc.want+0.001*math.Exp(-tc.later.Seconds()/10), st.LoadSeconds, 0.1)
		})
	}
}

// The case against Linkerd's semantics: an endpoint that answers
// 429 with Retry-After: 2 gets no requests during the hint, nor right after
// it (the 5 s penalty outlasts a shorter hint), and its share back once the
// penalty has decayed below its peer's load (a 1 ms peer: ~85 s at a 10 s
// decay). An endpoint that keeps answering 429 with a Retry-After is still
// picked when it is the only one: the 429 reaches the caller, not a
// fail-fast 504.
func TestRetryAfterShareBack(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var ha, hb atomic.Int64
	var limited atomic.Bool
	limited.Store(true)
	a := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ha.Add(1)
		if limited.Swap(false) {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		io.WriteString(w, "a")
	}))
	// The peer answers in 1 ms of the test's clock.
	b := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hb.Add(1)
		clock.now.Add(int64(time.Millisecond))
		io.WriteString(w, "b")
	}))
	_, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {a, b}}), withClock(clock.read),
		WithPenaltyPeakEWMA(&PenaltyPeakEWMA{}))
	require.Eventually(t, func() bool { get(t, client, svcURL, 1, 1); return !limited.Load() }, testutil.Timeout, time.Millisecond)
	at := clock.read()
	ha.Store(0)
	get(t, client, svcURL, 100, 4)
	assert.Zero(t, ha.Load(), "requests to the endpoint inside its Retry-After")
	clock.now.Store(at + int64(2100*time.Millisecond))
	get(t, client, svcURL, 100, 4)
	assert.Zero(t, ha.Load(), "requests to the endpoint right after its Retry-After (its 5 s penalty is still in force)")
	clock.now.Store(at + int64(100*time.Second))
	assert.Equal(t, map[int]int{200: 200}, get(t, client, svcURL, 200, 4))
	assert.Greater(t, ha.Load(), int64(20), "the endpoint's share once its penalty decayed: %d of 200", ha.Load())

	var hc atomic.Int64
	c := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hc.Add(1)
		w.Header().Set("Retry-After", "60")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	_, only := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {c}}), withClock(clock.read),
		WithPenaltyPeakEWMA(&PenaltyPeakEWMA{}))
	assert.Equal(t, map[int]int{429: 3}, get(t, only, svcURL, 3, 1), "the only endpoint, penalized, still answers")
	assert.Equal(t, int64(3), hc.Load())
}

// A 429 without Retry-After raises the endpoint's load: it is avoided by
// the picks while its penalty lasts, without leaving rotation.
func TestLoadPenalty(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var hb atomic.Int64
	var once atomic.Bool
	a := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !once.Swap(true) {
			w.Header().Set("Grpc-Status", "8")
			w.Header().Set("Content-Type", "application/grpc")
			w.WriteHeader(200)
			return
		}
		io.WriteString(w, "a")
	}))
	b := counted(t, &hb, ok)
	bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {a, b}}), withClock(clock.read),
		WithPenaltyPeakEWMA(&PenaltyPeakEWMA{}))
	require.Eventually(t, func() bool { get(t, client, svcURL, 1, 1); return once.Load() }, testutil.Timeout, time.Millisecond)
	st := stateOf(bal, svc, a)
	assert.Equal(t, "ready", st.State)
	assert.Greater(t, st.LoadSeconds, 4.0, "RESOURCE_EXHAUSTED adds the 5 s penalty")
}

func TestRetryAfterParse(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	assert.Equal(t, int64(2*time.Second), retryAfter("2", now))
	assert.Equal(t, int64(90*time.Second), retryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now))
	for _, bad := range []string{"", "-1", "0", "soon", now.Add(-time.Hour).Format(http.TimeFormat)} {
		assert.Zero(t, retryAfter(bad, now), bad)
	}
	assert.False(t, errors.Is(ResponseError(&http.Response{Body: http.NoBody}), ErrFailFast))
}

// The admin handler serves each endpoint's state as JSON; it watches
// nothing new.
func TestEndpointsHandler(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var hits atomic.Int64
	down := counted(t, &hits, func(int64) int { return 500 })
	up := backend(t, "up")
	bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {down, up}}), withClock(clock.read),
		WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 1, Backoff: Backoff{JitterRatio: -1}}}))
	require.Eventually(t, func() bool { get(t, client, svcURL, 1, 1); return hits.Load() > 0 }, testutil.Timeout, time.Millisecond)
	admin := testutil.NewServer(t, bal.EndpointsHandler())

	resp, err := http.Get(admin.URL + "/endpoints?authority=" + svc)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var states []map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&states))
	require.Len(t, states, 2)
	byAddr := map[string]map[string]any{}
	for _, s := range states {
		byAddr[s["addr"].(string)] = s
	}
	assert.Equal(t, "tripped", byAddr[down.Addr.String()]["state"])
	assert.EqualValues(t, time.Second, byAddr[down.Addr.String()]["penalty_ns"])
	assert.NotEmpty(t, byAddr[down.Addr.String()]["until"])
	assert.Equal(t, "ready", byAddr[up.Addr.String()]["state"])

	for q, want := range map[string]int{"": 400, "?authority=%5B": 400, "?authority=other.ns.svc.cluster.local:80": 404} {
		resp, err := http.Get(admin.URL + "/endpoints" + q)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, q)
	}
	assert.Equal(t, 1, bal.table.len(), "no watch for an authority asked about")
}

// A gRPC call answered UNAVAILABLE in the trailers and a connection that
// fails both count as failures; gRPC NOT_FOUND does not.
func TestAccrualFailureKinds(t *testing.T) {
	grpcEndpoint := func(code string) endpoint.Endpoint {
		return backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Trailer", "Grpc-Status")
			w.WriteHeader(200)
			w.Write([]byte{0, 0, 0, 0, 0})
			w.Header().Set("Grpc-Status", code)
		}))
	}
	for _, tc := range []struct {
		name  string
		ep    endpoint.Endpoint
		trips bool
	}{
		{"unavailable in trailers", grpcEndpoint("14"), true},
		{"not found in trailers", grpcEndpoint("5"), false},
		{"connection closed", refusing(t), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{}
			clock.now.Store(1)
			bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {tc.ep}}), withClock(clock.read), WithQueue(0, 50*time.Millisecond),
				WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 3}}))
			for range 3 {
				req, err := http.NewRequest(http.MethodPost, svcURL, nil)
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/grpc") // a gRPC call
				if resp, err := client.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			want := "ready"
			if tc.trips {
				want = "tripped"
			}
			assert.Equal(t, want, stateOf(bal, svc, tc.ep).State)
		})
	}
}

// Authorities that are not a Service's name all carry the fixed default
// labels: they share one label set rather than keeping a copy each, so a
// flood of such Hosts costs no labels per Host. A Service's authority has
// labels of its own.
func TestDefaultLabelsShared(t *testing.T) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	b := New(staticSource(t, nil), WithMeterProvider(mp))
	defer b.Close()
	first := b.metrics.of(newAuthority("127.0.0.1:1", b.def))
	for i := range 100 {
		am := b.metrics.of(newAuthority(fmt.Sprintf("127.0.%d.%d:80", i/256, i%256), b.def))
		assert.Same(t, first.authLabels, am.authLabels)
	}
	books := b.metrics.of(newAuthority("books.default.svc.cluster.local:7000", b.def))
	assert.NotSame(t, first.authLabels, books.authLabels)
	name, _ := books.set.Value("parent_name")
	assert.Equal(t, "books", name.AsString())
	unknown, _ := first.set.Value("parent_name")
	assert.Equal(t, "unknown", unknown.AsString())
}

// The Services the balancer's families label are bounded for the life of
// the Balancer, not by the authorities it holds at once: a Service evicted
// to make room keeps its series and its labels when it comes back, and
// Services past the bound are counted in one overflow series. Before the
// bound, a proxy that saw ever new Service names kept a label set, and
// each family's series of it, for every name (the heap of examples/bench's
// watch_table grew from 39.5 to 83.5 MiB over 50,000 new names at a full
// table of 2,000).
func TestServiceLabelsBoundedForLife(t *testing.T) {
	m := testutil.NewMetrics(t)
	ep := backend(t, "any")
	names := []string{"a", "b", "c", "d", "e"}
	sets := map[string][]endpoint.Endpoint{}
	for _, n := range names {
		sets[n+".default.svc.cluster.local:7000"] = []endpoint.Endpoint{ep}
	}
	_, client := newClient(t, staticSource(t, sets), WithMeterProvider(m.Provider), WithMaxAuthorities(2))
	for _, n := range append(names, "a", "b") {
		status, _, _ := fetch(t, client, "http://"+n+".default.svc.cluster.local:7000/")
		require.Equal(t, 200, status)
	}
	const family = "outbound_http_balancer_queue_requests_total"
	for _, n := range []string{"a", "b"} {
		assert.Equal(t, "2", m.Value(t, family, `parent_name="`+n+`"`, `backend_name="`+n+`"`), "a Service labelled before the bound keeps its series after its eviction")
	}
	for _, n := range []string{"c", "d", "e"} {
		assert.Empty(t, m.Lines(t, family, `parent_name="`+n+`"`), "a Service past the bound has no series of its own")
	}
	assert.Equal(t, "3", m.Value(t, family, `parent_kind="Service"`, `parent_name="other"`, `parent_namespace=""`, `backend_name="other"`))
	assert.Len(t, m.Lines(t, family), 3, "two Services and other")
	assert.Empty(t, m.Lines(t, "outbound_http_balancer_p2c_updates_total", `parent_name="e"`))
}

// The gauges of the authorities that share a label set (Services past the
// bound, under "other") are their sum, observed once: a gauge keeps only
// the last value observed for a set, so each authority's own figure would
// leave one arbitrary authority's.
func TestSharedLabelGaugesAreSummed(t *testing.T) {
	m := testutil.NewMetrics(t)
	one := backend(t, "one")
	svc := func(n string) string { return n + ".default.svc.cluster.local:7000" }
	sets := map[string][]endpoint.Endpoint{
		svc("a"): {one}, svc("b"): {one}, svc("c"): {one},
		svc("d"): {backend(t, "d1"), backend(t, "d2"), backend(t, "d3")},
		svc("e"): {one},
	}
	_, client := newClient(t, staticSource(t, sets), WithMeterProvider(m.Provider), WithMaxAuthorities(3))
	// a, b and c are labelled for life; d and e come past the bound and,
	// with c, are the three authorities the Balancer holds now.
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		status, _, _ := fetch(t, client, "http://"+svc(n)+"/")
		require.Equal(t, 200, status)
	}
	other := []string{`parent_name="other"`, `parent_namespace=""`}
	assert.Equal(t, "4", m.Value(t, "outbound_http_balancer_p2c_endpoints", other...), "d's three endpoints and e's one")
	assert.Equal(t, "4", m.Value(t, "outbound_http_balancer_endpoints", append(other, `endpoint_state="ready"`)...))
	assert.Equal(t, "1", m.Value(t, "outbound_http_balancer_p2c_endpoints", `parent_name="c"`))
}

// sendAsync sends a GET to svcURL through bal and gives its response, or
// nil on an error, on the channel it returns.
func sendAsync(bal *Balancer) <-chan *http.Response {
	done := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest("GET", svcURL, nil)
		resp, err := bal.Transport(nil).RoundTrip(req)
		if err != nil {
			resp = nil
		}
		done <- resp
	}()
	return done
}

// The gauges report the authorities the Balancer holds, each once with its
// own figures, through evictions that take authorities from any place in
// the list of those held: an evicted one is no longer reported, and one
// that comes back is reported again.
func TestGaugesFollowHeldAuthoritiesThroughEviction(t *testing.T) {
	m := testutil.NewMetrics(t)
	svc := func(n string) string { return n + ".default.svc.cluster.local:7000" }
	sizes := map[string]int{"a": 1, "b": 2, "c": 3, "d": 4}
	sets := map[string][]endpoint.Endpoint{}
	for n, size := range sizes {
		for i := range size {
			sets[svc(n)] = append(sets[svc(n)], backend(t, fmt.Sprintf("%s%d", n, i)))
		}
	}
	bal, client := newClient(t, staticSource(t, sets), WithMeterProvider(m.Provider), WithMaxAuthorities(3))
	const family = "outbound_http_balancer_p2c_endpoints"
	seen := map[string]bool{}
	for step, n := range []string{"a", "b", "c", "d", "a", "b", "d", "c", "a"} {
		seen[n] = true
		status, _, _ := fetch(t, client, "http://"+svc(n)+"/")
		require.Equal(t, 200, status)
		held := 0
		// d is past the bound of labelled Services: it is counted as "other".
		for _, name := range []string{"a", "b", "c", "d"} {
			label := name
			if name == "d" {
				label = "other"
			}
			got := m.Value(t, family, `parent_name="`+label+`"`)
			if bal.table.find(svc(name)) == nil {
				assert.Empty(t, got, "step %d: %s is not held", step, name)
				continue
			}
			held++
			assert.Equal(t, strconv.Itoa(sizes[name]), got, "step %d: %s", step, name)
		}
		assert.Equal(t, min(len(seen), 3), held, "step %d", step)
		assert.Len(t, m.Lines(t, family), held, "step %d", step)
	}
}
