package profileroute

import (
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// failing is an upstream that fails every attempt but those of a request
// whose query is "ok", and records when each attempt of each logical
// request was sent.
type failing struct{ attempts []time.Time }

func (f *failing) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	f.attempts = append(f.attempts, time.Now())
	if req.URL.RawQuery == "ok" {
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	}
	return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

// budgetRun sends two requests every interval for total, one answered
// (whose answer deposits into the budget) and one whose every attempt
// fails, delivering the same profile again every redeliver (0: never), and
// returns the times of the answered requests, of the failing requests'
// first attempts and of their retries.
func budgetRun(t *testing.T, b profiles.RetryBudget, interval, total, redeliver time.Duration) (answered, requests, retries []time.Time) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		p := profileWith(&b, retryRoute("/fail"))
		src := profiles.NewStaticSource(map[string]*profiles.Profile{testAuthority: p})
		router := NewRouter(src, WithLogger(quietLogger))
		defer router.Close()
		up := &failing{}
		client := &http.Client{Transport: router.Transport(up)}
		do := func(path string) {
			req, err := http.NewRequest("GET", "http://127.0.0.1:1"+path, nil)
			require.NoError(t, err)
			req.Host = testAuthority
			resp, err := client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
		}
		// The first request starts the watch on a path of no retryable
		// route: the profile may already be in force when it is routed (the
		// source answers on a goroutine of its own, which can win the race
		// with the request), and a request of /fail would then make the
		// budget and spend its reserve before the run, uncounted.
		do("/warm-up")
		synctest.Wait()
		require.Len(t, router.Table(testAuthority).Routes(), 2)
		require.Len(t, up.attempts, 1, "the warm-up request is never retried")
		up.attempts = nil
		time.Sleep(interval/3 + 13*time.Millisecond) // off the budget's slice boundaries

		start := time.Now()
		nextDelivery := start.Add(redeliver)
		for now := start; now.Sub(start) < total; now = time.Now() {
			if redeliver > 0 && !now.Before(nextDelivery) {
				src.Set(testAuthority, profileWith(&b, retryRoute("/fail")))
				synctest.Wait()
				nextDelivery = nextDelivery.Add(redeliver)
			}
			do("/fail?ok")
			answered = append(answered, up.attempts[len(up.attempts)-1])
			before := len(up.attempts)
			do("/fail")
			requests = append(requests, up.attempts[before])
			retries = append(retries, up.attempts[before+1:]...)
			time.Sleep(interval)
		}
	})
	return answered, requests, retries
}

// worstWindow returns the largest ratio, over every window of b.TTL whose
// start is a multiple of step within the run, of the retries in the window
// to what the budget allows in it: RetryRatio per answer not retried (the
// answered requests; a failure the budget refused deposits nothing) plus
// MinRetriesPerSecond·TTL.
func worstWindow(b profiles.RetryBudget, answered, requests, retries []time.Time, step time.Duration) (worst float64, at time.Duration) {
	count := func(ts []time.Time, from, to time.Time) int {
		n := 0
		for _, x := range ts {
			if !x.Before(from) && x.Before(to) {
				n++
			}
		}
		return n
	}
	origin := requests[0]
	end := requests[len(requests)-1]
	for a := origin.Add(-b.TTL); a.Before(end); a = a.Add(step) {
		allowed := float64(b.RetryRatio)*float64(count(answered, a, a.Add(b.TTL))) + float64(b.MinRetriesPerSecond)*b.TTL.Seconds()
		if r := float64(count(retries, a, a.Add(b.TTL))) / allowed; r > worst {
			worst, at = r, a.Sub(origin)
		}
	}
	return worst, at
}

// The probe: the same profile delivered every second, half the
// requests failing every attempt, must not refill the budget; no window of
// the TTL, aligned or not, sees more retries than the budget allows (5%
// slack).
func TestBudgetSurvivesRedelivery(t *testing.T) {
	cases := []struct {
		name      string
		budget    profiles.RetryBudget
		interval  time.Duration
		total     time.Duration
		redeliver time.Duration
	}{
		{"default budget, 20 rps, redelivered every second", profiles.DefaultRetryBudget(), 50 * time.Millisecond, 30 * time.Second, time.Second},
		{"minimum only, 10 rps, redelivered every second", profiles.RetryBudget{RetryRatio: 0, MinRetriesPerSecond: 1, TTL: 10 * time.Second}, 100 * time.Millisecond, 30 * time.Second, time.Second},
		{"ratio dominates, 100 rps, never redelivered", profiles.RetryBudget{RetryRatio: 0.5, MinRetriesPerSecond: 1, TTL: 10 * time.Second}, 10 * time.Millisecond, 30 * time.Second, 0},
		{"minimum only, 10 rps, never redelivered", profiles.RetryBudget{RetryRatio: 0, MinRetriesPerSecond: 2, TTL: 10 * time.Second}, 100 * time.Millisecond, 30 * time.Second, 0},
		{"unaligned 3s ttl, 7 rps, redelivered every 700ms", profiles.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 5, TTL: 3 * time.Second}, 143 * time.Millisecond, 15 * time.Second, 700 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			answered, requests, retries := budgetRun(t, tc.budget, tc.interval, tc.total, tc.redeliver)
			worst, at := worstWindow(tc.budget, answered, requests, retries, 10*time.Millisecond)
			t.Logf("%d requests, %d retries; worst window ratio %.3f starting at %v", len(requests), len(retries), worst, at)
			assert.LessOrEqual(t, worst, 1.05, "a window starting at %v saw more retries than the budget allows", at)
			assert.Greater(t, len(retries), 0)
			// The budget is used, not starved: back-to-back windows see at
			// least 80% of what they allow.
			allowed := 0.0
			for a := requests[0]; a.Before(requests[len(requests)-1]); a = a.Add(tc.budget.TTL) {
				n := 0
				for _, r := range answered {
					if !r.Before(a) && r.Before(a.Add(tc.budget.TTL)) {
						n++
					}
				}
				allowed += float64(tc.budget.RetryRatio)*float64(n) + float64(tc.budget.MinRetriesPerSecond)*tc.budget.TTL.Seconds()
			}
			assert.GreaterOrEqual(t, float64(len(retries)), 0.8*allowed, "retries granted of those allowed")
		})
	}
}
