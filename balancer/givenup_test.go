package balancer

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/balancer/endpoint"
)

// An endpoint that turns so slow that its callers give up on it (their
// deadline passes before its response head) looks slow to P2C: each
// request given up is a sample of the time it waited, as Linkerd's load
// biaser records the elapsed time of a request dropped in flight
// (linkerd/load-biaser/src/lib.rs, test_cancellation_records_measurement),
// so its estimate is at least the deadline and the next requests go to
// the endpoint that answers. Without the sample its estimate would stay
// at the fast RTT it had (decaying), and P2C would keep sending it
// requests that time out. A given-up request is no failure.
func TestGivenUpRequestsMakeEndpointSlow(t *testing.T) {
	// Long enough that a request to the endpoint that answers is not
	// given up on a loaded machine; the time constant is long beside
	// it, so that an estimate read a second late has barely decayed.
	const deadline = 500 * time.Millisecond
	const tau = 10 * time.Second
	for _, over := range []string{overHTTP1, overHTTP2} {
		t.Run(over, func(t *testing.T) {
			var stall atomic.Bool
			var stalled atomic.Int64 // requests the stalled endpoint held
			slow := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if stall.Load() {
					stalled.Add(1)
					<-r.Context().Done() // its caller gives up first
					return
				}
				io.WriteString(w, "slow")
			}))
			fast := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, "fast")
			}))
			slow.H2, fast.H2 = over == overHTTP2, over == overHTTP2
			// A default RTT below any real one: the first answers set
			// each endpoint's estimate.
			bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {slow, fast}}),
				WithPeakEWMA(time.Microsecond, tau))
			// send sends one request its caller gives up after deadline:
			// the endpoint that answered, or "" for none.
			send := func() string {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, svcURL, nil)
				require.NoError(t, err)
				resp, err := client.Do(req)
				if err != nil {
					require.ErrorIs(t, err, context.DeadlineExceeded)
					return ""
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				return string(b)
			}

			// Both endpoints answer fast until each has answered.
			got := map[string]int{}
			for got["slow"] == 0 || got["fast"] == 0 {
				require.Less(t, got["slow"]+got["fast"], 1000, "an endpoint got no request")
				got[send()]++
			}
			require.Less(t, stateOf(bal, svc, slow).LoadSeconds, deadline.Seconds(), "a fast RTT before it stalls")

			// Requests go to both while their estimates are alike, until
			// one reaches the stalled endpoint and is given up.
			stall.Store(true)
			var last time.Time // when the request given up was sent
			for sent := 0; stalled.Load() == 0; sent++ {
				require.Less(t, sent, 100_000, "no request went to the stalled endpoint")
				last = time.Now()
				send()
			}
			st := stateOf(bal, svc, slow)
			// The balancer's clock starts a little after the caller's
			// deadline was set (a few milliseconds of slack), and the
			// estimate has decayed since the sample, which is no older
			// than the request's send.
			decay := math.Exp(-time.Since(last).Seconds() / tau.Seconds())
			assert.GreaterOrEqual(t, st.LoadSeconds, (deadline-5*time.Millisecond).Seconds()*decay,
				"the stalled endpoint's estimate after a request given up (%.2f of it left after the decay)", decay)
			assert.Zero(t, st.ConsecutiveFailures, "a request given up is no failure")
			assert.Equal(t, "ready", st.State)

			const n = 100
			got = map[string]int{}
			for range n {
				got[send()]++
			}
			assert.Greater(t, got["fast"], n*9/10, "requests to the endpoint that answers, of %d (given up: %d)", n, got[""])
		})
	}
}

// A Pool records the time of a call its caller gave up before its
// response (Result.Canceled) as a sample of the endpoint's load, as
// linkerd2-proxy's load biaser does (linkerd/load-biaser/src/lib.rs,
// test_cancellation_records_measurement: a request in flight for 3 s and
// dropped raises the estimate), and counts it in no failure accrual; a
// pick the transport gave up unsent (Result.Unsent) is no sample.
func TestPoolGivenUpCallIsSample(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Result
		want float64 // the estimate in seconds after the call
	}{
		{"test_cancellation_records_measurement", Result{GRPCStatus: -1, Canceled: true}, 3},
		{"a pick given up unsent", Result{GRPCStatus: -1, Unsent: true}, 0.001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock fakeClock
			clock.now.Store(1)
			p := NewPool(nil, withClock(clock.read), WithPeakEWMA(time.Millisecond, time.Hour),
				WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 1}}))
			addr := netip.MustParseAddrPort("127.0.0.1:1")
			p.Update([]endpoint.Endpoint{{Addr: addr}})
			k, ok := p.Pick()
			require.True(t, ok)
			clock.now.Add(int64(3 * time.Second))
			l := p.loads[addr]
			l.mu.Lock()
			before := l.estimateLocked(clock.read(), p.decay) / 1e9
			l.mu.Unlock()
			k.Done(tc.r)
			assert.Zero(t, l.pending.Load(), "in flight after Done")
			l.mu.Lock()
			after := l.estimateLocked(clock.read(), p.decay) / 1e9
			l.mu.Unlock()
			assert.InDelta(t, tc.want, after, 1e-4)
			if tc.r.Canceled {
				assert.Greater(t, after, before, "the elapsed wait raises the estimate")
			}
			_, ok = p.Pick()
			assert.True(t, ok, "not tripped: a given-up call is no failure")
		})
	}
}
