package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
)

// outlierBench: five loopback endpoints, the first of which fails 30% of
// the requests it serves (sequence number mod 10 < 3 answers 500). The
// same serial requests through a balancer without outlier detection and
// through one with failure-percentage ejection (gRFC A50: above 10%,
// enforced always, 5 endpoints of at least 10 requests, max ejection 20%,
// ejected for 60 s). The headline is the success rate with ejection,
// counting every request started after the first detection interval
// (measured from the first answer; goal at least 0.99); the rate without
// ejection (about 0.94) is beside it.
func outlierBench(o options) (*result, error) {
	var eps []endpoint.Endpoint
	for i := range 5 {
		var seq atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if i == 0 && (seq.Add(1)-1)%10 < 3 {
				http.Error(w, "failing", http.StatusInternalServerError)
				return
			}
			_, _ = w.Write([]byte("ok"))
		}))
		defer srv.Close()
		eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://")), Weight: endpoint.DefaultWeight})
	}
	const backend = "backend.bench:80"
	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{backend: eps})
	if err != nil {
		return nil, err
	}
	interval := time.Duration(o.scale(1000, 500)) * time.Millisecond
	od := balancer.DefaultOutlierDetection()
	od.Interval, od.BaseEjectionTime, od.MaxEjectionPercent = interval, time.Minute, 20
	od.FailurePercentageEjection = &balancer.FailurePercentageEjection{Threshold: 10, EnforcementPercentage: 100, MinimumHosts: 5, RequestVolume: 10}
	n := o.scale(5000, 1000)

	// run sends requests one after the other through a fresh balancer
	// until n have started after the first interval (all of them, for a
	// balancer without detection); it returns the successes among those
	// counted, the requests of the first interval and their successes.
	run := func(opts ...balancer.Option) (ok, warm, warmOK int, el time.Duration, ejected int, err error) {
		bal := balancer.New(src, opts...)
		defer bal.Close()
		tr := h1Transport()
		defer tr.CloseIdleConnections()
		rt := bal.Transport(tr)
		send := func() (bool, error) {
			resp, err := rt.RoundTrip(get("http://"+backend+"/", ""))
			if err != nil {
				return false, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode == 200, nil
		}
		first, err := send()
		if err != nil {
			return 0, 0, 0, 0, 0, err
		}
		t0 := time.Now()
		end := t0
		if len(opts) > 0 {
			end = t0.Add(interval)
			warm = 1
			if first {
				warmOK = 1
			}
		}
		for counted := 0; counted < n; {
			if time.Since(t0) > 60*time.Second {
				return 0, 0, 0, 0, 0, errors.New("outlier: requests too slow (60 s)")
			}
			began := time.Now()
			res, err := send()
			if err != nil {
				return 0, 0, 0, 0, 0, err
			}
			if began.Before(end) {
				warm++
				if res {
					warmOK++
				}
				continue
			}
			counted++
			if res {
				ok++
			}
		}
		el = time.Since(end)
		for _, e := range bal.Endpoints(backend) {
			if e.State == "ejected" {
				ejected++
			}
		}
		return ok, warm, warmOK, el, ejected, nil
	}
	plainOK, _, _, plainEl, _, err := run()
	if err != nil {
		return nil, err
	}
	ok, warm, warmOK, el, ejected, err := run(balancer.WithOutlierDetection(&od))
	if err != nil {
		return nil, err
	}
	if ejected > 1 {
		return nil, fmt.Errorf("outlier: %d endpoints ejected, above the cap of 1", ejected)
	}
	rate, plainRate := float64(ok)/float64(n), float64(plainOK)/float64(n)
	r := &result{
		ratio:     ratio{Ratio: rate, Goal: atLeast(0.99), Spread: spread{rate, rate}},
		Unit:      "success rate",
		Candidate: &figures{Requests: float64(n), RPS: float64(n) / el.Seconds()},
		Baseline:  &figures{Requests: float64(n), RPS: float64(n) / plainEl.Seconds()},
		Extra:     []ratio{{Name: "success rate without ejection", Ratio: plainRate, Goal: atMost(0.97), Spread: spread{plainRate, plainRate}}},
		Rounds:    1,
	}
	r.Note = fmt.Sprintf("ratio = success rate with failure-percentage ejection (above 10%%, interval %v, max 20%% ejected) over all %d serial requests started after the first interval; "+
		"in the first interval %d of %d succeeded; 5 endpoints, one failing 30%%; ejected at the end: %d", interval, n, warmOK, warm, ejected)
	return r, nil
}
