package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/inmesh/inmesh/profiles"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// retryBudget: requests at a steady rate on a retryable route, every other
// one to a path whose upstream always fails and the others answered, while
// the same profile is delivered again twice a second (as after a
// control-plane reconnect). An answer that is not retried deposits into
// the budget and a failure it refuses deposits nothing, as in Linkerd's
// proxy (linkerd/app/outbound/src/http/retry.rs), so for every window of
// one TTL, at any start, the retries sent are compared with what the
// budget allows in it: ratio x answered requests + min per second x TTL.
// The figure of a round is its worst window.
func retryBudget(o options) (*result, error) {
	budget := profiles.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, TTL: time.Second}
	const authority = "books.default.svc.cluster.local:7000"
	router, redeliver := budgetRouter(authority, budget)
	defer router.Close()
	var mu sync.Mutex
	var attempts []time.Duration // of the failing requests
	var epoch time.Time
	fail := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		code := http.StatusOK
		if r.URL.Path != "/ok" {
			code = http.StatusServiceUnavailable
			mu.Lock()
			attempts = append(attempts, time.Since(epoch))
			mu.Unlock()
		}
		return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	})
	rt := router.Transport(fail)
	req := func(path string) *http.Request { return get("http://"+authority+path, "") }
	if err := waitRoutes(router, authority, func() { _ = do(rt, req("/ok")) }); err != nil {
		return nil, err
	}
	const rate = 200 // requests per second
	dur := time.Duration(o.scale(3, 2)) * time.Second
	measure := func() (figures, error) {
		mu.Lock()
		attempts = attempts[:0]
		epoch = time.Now()
		mu.Unlock()
		var sent, answered []time.Duration // failing requests, answered ones
		nextRedeliver := 500 * time.Millisecond
		for i := 0; ; i++ {
			at := time.Duration(i) * time.Second / rate
			if at >= dur {
				break
			}
			time.Sleep(time.Until(epoch.Add(at)))
			if at >= nextRedeliver {
				redeliver()
				nextRedeliver += 500 * time.Millisecond
			}
			path := "/"
			if i%2 == 1 {
				path = "/ok"
				answered = append(answered, time.Since(epoch))
			} else {
				sent = append(sent, time.Since(epoch))
			}
			if err := do(rt, req(path)); err != nil {
				return figures{}, err
			}
		}
		mu.Lock()
		defer mu.Unlock()
		worst := 0.0
		for start := time.Duration(0); start+budget.TTL <= dur; start += 10 * time.Millisecond {
			in := func(ts []time.Duration) int {
				c := 0
				for _, t := range ts {
					if t >= start && t < start+budget.TTL {
						c++
					}
				}
				return c
			}
			retries := in(attempts) - in(sent)
			allowed := float64(budget.RetryRatio)*float64(in(answered)) + float64(budget.MinRetriesPerSecond)*budget.TTL.Seconds()
			worst = max(worst, float64(retries)/allowed)
		}
		return figures{Requests: float64(len(sent) + len(answered)), NsPerOp: worst}, nil
	}
	rs, err := interleave(o.roundsAtMost(3), variant{"budget", measure})
	if err != nil {
		return nil, err
	}
	r := &result{
		ratio:     rs.ratio("", within(0.95, 1.05), func(f []figures) float64 { return f[0].NsPerOp }),
		Candidate: &figures{Requests: rs.median(0).Requests},
	}
	r.Note = fmt.Sprintf("ratio = retries in the worst 1 s window / the budget's allowance (ratio 0.2, 10/s, TTL 1 s), %d req/s, half of them to a path that always fails, same profile re-delivered every 500 ms", rate)
	return r, nil
}
