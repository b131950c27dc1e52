package balancer

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
)

// odStep is one interval of an outlier-detection case: the outcomes each
// endpoint answered (successes, failures), the time at which the interval
// ends, and which endpoints are ejected after it.
type odStep struct {
	outcomes [][2]int64
	at       time.Duration
	ejected  []bool
	mults    []int // the ejection counts after it, when given
	// idle is how many intervals without outcomes end after it (at at +
	// 1s, at + 2s, ...) before ejected and mults are read.
	idle int64
}

// The interval algorithm of gRFC A50. The first cases are grpc-go's
// xds/internal/balancer/outlierdetection/balancer_test.go
// (TestEjectUnejectSuccessRate, TestEjectFailureRate; their intervals are
// run by hand there, here by the test's clock); the others each pin one
// rule of A50 and of grpc-go's balancer.go (intervalTimerAlgorithm,
// successRateAlgorithm, failurePercentageAlgorithm).
func TestOutlierIntervalAlgorithm(t *testing.T) {
	fp := func(threshold, enforce, hosts, volume uint32) *OutlierDetection {
		return &OutlierDetection{Interval: time.Second, BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second,
			MaxEjectionPercent: 10, FailurePercentageEjection: &FailurePercentageEjection{Threshold: threshold,
				EnforcementPercentage: enforce, MinimumHosts: hosts, RequestVolume: volume}}
	}
	sr := func(factor, enforce, hosts, volume uint32) *OutlierDetection {
		return &OutlierDetection{Interval: time.Second, BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second,
			MaxEjectionPercent: 10, SuccessRateEjection: &SuccessRateEjection{StdevFactor: factor,
				EnforcementPercentage: enforce, MinimumHosts: hosts, RequestVolume: volume}}
	}
	five := [2]int64{5, 0}
	bad := [2]int64{0, 5}
	none := [2]int64{}
	withCap := func(o *OutlierDetection, pct uint32) *OutlierDetection { o.MaxEjectionPercent = pct; return o }
	withTimes := func(o *OutlierDetection, base, maxT time.Duration) *OutlierDetection {
		o.BaseEjectionTime, o.MaxEjectionTime = base, maxT
		return o
	}
	cases := []struct {
		name  string
		od    *OutlierDetection
		steps []odStep
	}{
		{
			// balancer_test.go TestEjectUnejectSuccessRate (configured with
			// failure-percentage ejection there).
			name: "grpc-go TestEjectUnejectSuccessRate",
			od:   fp(50, 100, 3, 3),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, five}, at: 1 * time.Second, ejected: []bool{false, false, false}},
				{outcomes: [][2]int64{five, five, bad}, at: 2 * time.Second, ejected: []bool{false, false, true}},
				{outcomes: [][2]int64{five, five, none}, at: 1000 * time.Second, ejected: []bool{false, false, false}},
			},
		},
		{
			// balancer_test.go TestEjectFailureRate (configured with
			// success-rate ejection there).
			name: "grpc-go TestEjectFailureRate",
			od:   sr(500, 100, 3, 3),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, five}, at: 1 * time.Second, ejected: []bool{false, false, false}},
				{outcomes: [][2]int64{five, five, bad}, at: 2 * time.Second, ejected: []bool{false, false, true}},
			},
		},
		{
			name: "fewer endpoints with the request volume than minimum_hosts: none ejected",
			od:   fp(50, 100, 3, 3),
			steps: []odStep{
				{outcomes: [][2]int64{five, {2, 0}, bad}, at: time.Second, ejected: []bool{false, false, false}},
			},
		},
		{
			name: "success rate: fewer than minimum_hosts with the volume: none ejected",
			od:   sr(500, 100, 3, 6),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: time.Second, ejected: []bool{false, false, false}},
			},
		},
		{
			name: "failure percentage equal to the threshold is not above it",
			od:   fp(50, 100, 3, 3),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, {5, 5}}, at: time.Second, ejected: []bool{false, false, false}},
			},
		},
		{
			name: "enforcement 0%: detected, never ejected (A50's failure-percentage default)",
			od:   fp(50, 0, 3, 3),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: time.Second, ejected: []bool{false, false, false}},
			},
		},
		{
			name: "the cap: 20% of five endpoints, two failing: one ejected",
			od:   withCap(fp(50, 100, 5, 3), 20),
			steps: []odStep{
				{outcomes: [][2]int64{bad, bad, five, five, five}, at: time.Second, ejected: []bool{true, false, false, false, false}},
			},
		},
		{
			name: "a cap of 0 ejects nothing",
			od:   withCap(fp(50, 100, 3, 3), 0),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: time.Second, ejected: []bool{false, false, false}},
			},
		},
		{
			name: "the cap counts endpoints ejected earlier",
			od:   withCap(fp(50, 100, 3, 3), 34),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: time.Second, ejected: []bool{false, false, true}},
				{outcomes: [][2]int64{five, bad, none}, at: 2 * time.Second, ejected: []bool{false, false, true}},
			},
		},
		{
			name: "both ejections finding one endpoint eject it once",
			od: &OutlierDetection{Interval: time.Second, BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second, MaxEjectionPercent: 100,
				SuccessRateEjection:       &SuccessRateEjection{StdevFactor: 500, EnforcementPercentage: 100, MinimumHosts: 3, RequestVolume: 3},
				FailurePercentageEjection: &FailurePercentageEjection{Threshold: 50, EnforcementPercentage: 100, MinimumHosts: 3, RequestVolume: 3}},
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: time.Second, ejected: []bool{false, false, true}, mults: []int{0, 0, 1}},
			},
		},
		{
			// The ejection time is base * count, the count going down by one
			// each interval in rotation: ejected at 1s for 10s (back at the
			// first check after 11s), ejected again at 12s for 20s.
			name: "the ejection time grows with each ejection",
			od:   withTimes(fp(50, 100, 3, 3), 10*time.Second, 300*time.Second),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: 1 * time.Second, ejected: []bool{false, false, true}, mults: []int{0, 0, 1}},
				{outcomes: [][2]int64{five, five, none}, at: 11 * time.Second, ejected: []bool{false, false, true}},
				{outcomes: [][2]int64{five, five, none}, at: 11*time.Second + 1, ejected: []bool{false, false, false}, mults: []int{0, 0, 1}},
				{outcomes: [][2]int64{five, five, bad}, at: 12 * time.Second, ejected: []bool{false, false, true}, mults: []int{0, 0, 2}},
				{outcomes: [][2]int64{five, five, none}, at: 31 * time.Second, ejected: []bool{false, false, true}},
				{outcomes: [][2]int64{five, five, none}, at: 32*time.Second + 1, ejected: []bool{false, false, false}, mults: []int{0, 0, 2}},
				{outcomes: [][2]int64{five, five, five}, at: 33 * time.Second, ejected: []bool{false, false, false}, mults: []int{0, 0, 1}},
				{outcomes: [][2]int64{five, five, five}, at: 34 * time.Second, ejected: []bool{false, false, false}, mults: []int{0, 0, 0}},
			},
		},
		{
			name: "the ejection time is at most max(base, max_ejection_time)",
			od:   withTimes(fp(50, 100, 3, 3), 10*time.Second, 15*time.Second),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: 1 * time.Second, ejected: []bool{false, false, true}},
				{outcomes: [][2]int64{five, five, none}, at: 11*time.Second + 1, ejected: []bool{false, false, false}},
				{outcomes: [][2]int64{five, five, bad}, at: 12 * time.Second, ejected: []bool{false, false, true}, mults: []int{0, 0, 2}},
				{outcomes: [][2]int64{five, five, none}, at: 27 * time.Second, ejected: []bool{false, false, true}},
				{outcomes: [][2]int64{five, five, none}, at: 27*time.Second + 1, ejected: []bool{false, false, false}},
			},
		},
		{
			// A50: "each interval the endpoint is not ejected" lowers its
			// multiplier; grpc-go's timer runs intervalTimerAlgorithm each
			// interval whether or not calls come (balancer.go: the
			// ejectionTimeMultiplier-- branch). Ejected at 1s for 10s: back
			// at the idle interval ending at 12s, then ten intervals in
			// rotation to 22s take its count from 1 to 0.
			name: "idle intervals bring an ejected endpoint back and take one each from its count",
			od:   withTimes(fp(50, 100, 3, 3), 10*time.Second, 300*time.Second),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: 1 * time.Second, ejected: []bool{false, false, true}, mults: []int{0, 0, 1}},
				{outcomes: [][2]int64{five, five, none}, at: 2 * time.Second, idle: 20, ejected: []bool{false, false, false}, mults: []int{0, 0, 0}},
			},
		},
		{
			// Ejected a second time at 13s for 20s: the idle intervals end
			// at 15s ... 34s, the last one past 33s brings it back, and its
			// count is lowered only by the intervals after that one.
			name: "an endpoint back at the last idle interval keeps its count",
			od:   withTimes(fp(50, 100, 3, 3), 10*time.Second, 300*time.Second),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: 1 * time.Second, ejected: []bool{false, false, true}},
				{outcomes: [][2]int64{five, five, none}, at: 12 * time.Second, ejected: []bool{false, false, false}, mults: []int{0, 0, 1}},
				{outcomes: [][2]int64{five, five, bad}, at: 13 * time.Second, ejected: []bool{false, false, true}, mults: []int{0, 0, 2}},
				{outcomes: [][2]int64{five, five, none}, at: 14 * time.Second, idle: 20, ejected: []bool{false, false, false}, mults: []int{0, 0, 2}},
				{outcomes: [][2]int64{five, five, none}, at: 35 * time.Second, ejected: []bool{false, false, false}, mults: []int{0, 0, 1}},
			},
		},
		{
			name: "back part-way through an idle spell, lowered by the intervals after",
			od:   withTimes(fp(50, 100, 3, 3), 10*time.Second, 300*time.Second),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: 1 * time.Second, ejected: []bool{false, false, true}},
				{outcomes: [][2]int64{five, five, none}, at: 12 * time.Second, ejected: []bool{false, false, false}, mults: []int{0, 0, 1}},
				{outcomes: [][2]int64{five, five, bad}, at: 13 * time.Second, ejected: []bool{false, false, true}, mults: []int{0, 0, 2}},
				{outcomes: [][2]int64{five, five, none}, at: 14 * time.Second, idle: 21, ejected: []bool{false, false, false}, mults: []int{0, 0, 1}},
			},
		},
		{
			name: "still ejected at the end of an idle spell: its count is kept",
			od:   withTimes(fp(50, 100, 3, 3), 10*time.Second, 300*time.Second),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: 1 * time.Second, idle: 9, ejected: []bool{false, false, true}, mults: []int{0, 0, 1}},
			},
		},
		{
			// A50's request_volume is "the minimum number of total
			// requests"; grpc-go's endpointsWithAtLeastRequestVolume keeps
			// every endpoint with rv >= request_volume, so with 0 an idle
			// endpoint counts toward minimum_hosts. Its failure percentage
			// is 0/0, NaN, above no threshold: it is not ejected.
			name: "request volume 0: an endpoint without requests counts toward minimum_hosts",
			od:   withCap(fp(50, 100, 3, 0), 100),
			steps: []odStep{
				{outcomes: [][2]int64{bad, five, none}, at: time.Second, ejected: []bool{true, false, false}},
			},
		},
		{
			name: "request volume 0, failure percentage: no requests anywhere, none ejected",
			od:   withCap(fp(0, 100, 3, 0), 100),
			steps: []odStep{
				{outcomes: [][2]int64{none, none, none}, at: time.Second, idle: 5, ejected: []bool{false, false, false}},
			},
		},
		{
			// Without the idle endpoint, the failing one is ejected (rates
			// 0, 1, 1: mean 0.67, required 0.43).
			name: "success rate, request volume 0: the outlier is ejected when every endpoint had requests",
			od:   withCap(sr(500, 100, 3, 0), 100),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad}, at: time.Second, ejected: []bool{false, false, true}},
			},
		},
		{
			// grpc-go's meanAndStdDev divides the idle endpoint's 0
			// successes by its 0 requests: the mean is NaN, no success
			// rate is below the required one, and none is ejected.
			name: "success rate, request volume 0: an endpoint without requests makes grpc-go's mean NaN, none ejected",
			od:   withCap(sr(500, 100, 3, 0), 100),
			steps: []odStep{
				{outcomes: [][2]int64{five, five, bad, none}, at: time.Second, ejected: []bool{false, false, false, false}},
			},
		},
		{
			// One of five endpoints failing 30%: success-rate ejection at
			// A50's 1.9 standard deviations barely separates it (the most a
			// single outlier among five can lie below the mean is 2), so the
			// acceptance uses 1 standard deviation, or failure percentage.
			name: "one of five failing 30%: found at 1000, and by a failure threshold of 10%",
			od:   withCap(sr(1000, 100, 5, 100), 20),
			steps: []odStep{
				{outcomes: [][2]int64{{100, 0}, {100, 0}, {100, 0}, {100, 0}, {70, 30}}, at: time.Second, ejected: []bool{false, false, false, false, true}},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.od.Validate())
			od, ok := outlierOf(tc.od)
			require.True(t, ok)
			n := len(tc.steps[0].outcomes)
			loads := make([]*load, n)
			for i := range loads {
				loads[i] = newLoad(0, 0)
			}
			for si, st := range tc.steps {
				for i, o := range st.outcomes {
					for range o[0] {
						loads[i].health.countLocked(false)
					}
					for range o[1] {
						loads[i].health.countLocked(true)
					}
				}
				od.sweep(loads, int64(st.at), nil)
				od.idle(loads, int64(st.at), st.idle, nil)
				for i, want := range st.ejected {
					require.Equal(t, want, loads[i].health.odEjected, "step %d, endpoint %d ejected", si, i)
				}
				for i, want := range st.mults {
					require.Equal(t, want, loads[i].health.odMult, "step %d, endpoint %d ejection count", si, i)
				}
			}
		})
	}
}

// Validation as grpc-go's ParseConfig (balancer_test.go TestParseConfig):
// negative durations and percentages over 100 are refused, naming the
// field; zero values are kept as zeros ("lb-config-every-field-set-zero-value").
func TestOutlierValidate(t *testing.T) {
	cases := []struct {
		name    string
		od      OutlierDetection
		wantErr string
	}{
		{name: "defaults", od: DefaultOutlierDetection()},
		{name: "every field zero", od: OutlierDetection{SuccessRateEjection: &SuccessRateEjection{}, FailurePercentageEjection: &FailurePercentageEjection{}}},
		{name: "interval-is-negative", od: OutlierDetection{Interval: -10 * time.Second}, wantErr: "outlier_detection.interval = -10s; must be >= 0"},
		{name: "base-ejection-time-is-negative", od: OutlierDetection{BaseEjectionTime: -10 * time.Second}, wantErr: "outlier_detection.base_ejection_time = -10s; must be >= 0"},
		{name: "max-ejection-time-is-negative", od: OutlierDetection{MaxEjectionTime: -10 * time.Second}, wantErr: "outlier_detection.max_ejection_time = -10s; must be >= 0"},
		{name: "max-ejection-percent-is-greater-than-100", od: OutlierDetection{MaxEjectionPercent: 150}, wantErr: "outlier_detection.max_ejection_percent = 150; must be <= 100"},
		{name: "enforcement-percentage-success-rate-is-greater-than-100", od: OutlierDetection{SuccessRateEjection: &SuccessRateEjection{EnforcementPercentage: 150}},
			wantErr: "outlier_detection.success_rate_ejection.enforcement_percentage = 150; must be <= 100"},
		{name: "failure-percentage-threshold-is-greater-than-100", od: OutlierDetection{FailurePercentageEjection: &FailurePercentageEjection{Threshold: 150}},
			wantErr: "outlier_detection.failure_percentage_ejection.threshold = 150; must be <= 100"},
		{name: "enforcement-percentage-failure-percentage-ejection-is-greater-than-100", od: OutlierDetection{FailurePercentageEjection: &FailurePercentageEjection{EnforcementPercentage: 150}},
			wantErr: "outlier_detection.failure_percentage_ejection.enforcement_percentage = 150; must be <= 100"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.od.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tc.wantErr)
		})
	}
	// A50's defaults, as grpc-go's TestParseConfig expects them.
	d := DefaultOutlierDetection()
	require.Equal(t, OutlierDetection{Interval: 10 * time.Second, BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second, MaxEjectionPercent: 10}, d)
	require.Equal(t, SuccessRateEjection{StdevFactor: 1900, EnforcementPercentage: 100, MinimumHosts: 5, RequestVolume: 100}, *DefaultSuccessRateEjection())
	require.Equal(t, FailurePercentageEjection{Threshold: 85, EnforcementPercentage: 0, MinimumHosts: 5, RequestVolume: 50}, *DefaultFailurePercentageEjection())
	_, ok := outlierOf(&d)
	require.False(t, ok, "no ejection set: a no-op configuration")
}

// The Pool (meshgrpc's balancing) ejects an endpoint failing 30% of its
// requests among five, on a clock the test moves: after the interval the
// outlier gets nothing until its ejection time has passed, and never more
// than the cap is ejected. So whichever way meshgrpc picks: Pick, or
// PickExcluding for the attempts of a hedged call (every call of a hedged
// route), whose picks run the intervals' checks as Pick's do.
func TestPoolOutlierEjection(t *testing.T) {
	for _, tc := range []struct {
		name string
		pick func(p *Pool) (Pick, bool)
	}{
		{name: "Pick", pick: (*Pool).Pick},
		// meshgrpc picks every attempt of a hedged call so: the first
		// joins the call's tried set, the hedge excludes it.
		{name: "PickExcluding, a hedged call's first attempt", pick: func(p *Pool) (Pick, bool) { return p.PickExcluding(new(Tried), false) }},
		{name: "PickExcluding, a hedge", pick: func(p *Pool) (Pick, bool) { return p.PickExcluding(new(Tried), true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock fakeClock
			clock.now.Store(1)
			od := DefaultOutlierDetection()
			od.Interval, od.MaxEjectionPercent = time.Second, 20
			od.FailurePercentageEjection = &FailurePercentageEjection{Threshold: 10, EnforcementPercentage: 100, MinimumHosts: 5, RequestVolume: 50}
			p := NewPool(nil, withClock(clock.read), WithOutlierDetection(&od))
			var eps []endpoint.Endpoint
			for i := range 5 {
				eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", i+1))})
			}
			bad := eps[4].Addr
			p.Update(eps)
			rng := rand.New(rand.NewPCG(1, 2))
			run := func(n int) (failed, toBad int) {
				for range n {
					k, ok := tc.pick(p)
					require.True(t, ok)
					code := 0
					if k.Endpoint().Addr == bad {
						toBad++
						if rng.IntN(100) < 30 {
							code, failed = 14, failed+1
						}
					}
					k.Done(Result{GRPCStatus: code})
				}
				return failed, toBad
			}
			run(10) // the first pick starts the interval
			_, toBad := run(1000)
			require.Positive(t, toBad)
			clock.now.Add(int64(time.Second))
			failed, toBad := run(5000)
			require.Zero(t, toBad, "the outlier was picked while ejected")
			require.Zero(t, failed)
			ejected := 0
			for _, e := range p.g.state.Load().eps {
				if e.load.health.odEjected {
					ejected++
					require.Equal(t, bad, e.Addr)
				}
			}
			require.Equal(t, 1, ejected)
			// Past the base ejection time (30 s), the next interval's check
			// brings it back.
			clock.now.Add(int64(31 * time.Second))
			run(1)
			_, toBad = run(2000)
			require.Positive(t, toBad, "the outlier did not come back after its ejection time")
		})
	}
}

// The HTTP balancer ejects the outlier too, and shows it: its endpoint
// state is "ejected" until its ejection ends, and
// outbound_http_balancer_endpoints counts it pending.
func TestBalancerOutlierEjection(t *testing.T) {
	var clock fakeClock
	clock.now.Store(1)
	var eps []endpoint.Endpoint
	for i := range 4 {
		eps = append(eps, backend(t, fmt.Sprintf("ok%d", i)))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	eps = append(eps, backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if rng.IntN(100) < 30 {
			http.Error(w, "flaky", http.StatusInternalServerError)
			return
		}
		w.Write([]byte("flaky"))
	})))
	src := staticSource(t, map[string][]endpoint.Endpoint{books + ":80": eps})
	od := DefaultOutlierDetection()
	od.Interval, od.MaxEjectionPercent = time.Second, 20
	od.SuccessRateEjection = &SuccessRateEjection{StdevFactor: 1000, EnforcementPercentage: 100, MinimumHosts: 5, RequestVolume: 20}
	m := testutil.NewMetrics(t)
	b, client := newClient(t, src, withClock(clock.read), WithOutlierDetection(&od), WithMeterProvider(m.Provider))
	get := func() (string, int) {
		resp, err := client.Get("http://" + books + "/")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		return string(body), resp.StatusCode
	}
	for range 400 {
		get()
	}
	clock.now.Add(int64(time.Second))
	for range 300 {
		body, code := get()
		require.Equal(t, http.StatusOK, code)
		require.True(t, strings.HasPrefix(body, "ok"), "the outlier answered while ejected: %q", body)
	}
	var states []string
	for _, st := range b.Endpoints(books + ":80") {
		states = append(states, st.State)
		if st.State == stateEjected {
			require.NotNil(t, st.Until)
			require.Equal(t, 1, st.Ejections)
		}
	}
	require.ElementsMatch(t, []string{"ready", "ready", "ready", "ready", "ejected"}, states)
	require.Equal(t, "1", m.Value(t, "outbound_http_balancer_endpoints", `endpoint_state="pending"`))
	require.Equal(t, "4", m.Value(t, "outbound_http_balancer_endpoints", `endpoint_state="ready"`))
}

// Idle intervals run all the same: an endpoint ejected twice (its
// ejection count 2), back in rotation, then idle for a thousand intervals
// has its count back to 0 (A50; grpc-go's timer runs each of them), so
// that its next ejection counts 1 and lasts the base ejection time. Through
// the HTTP balancer to real endpoints, on the balancer's clock.
func TestOutlierCountDecaysWhileIdle(t *testing.T) {
	var clock fakeClock
	clock.now.Store(1)
	eps := []endpoint.Endpoint{everyOtherFails(t, "A"), backend(t, "B"), backend(t, "C")}
	src := staticSource(t, map[string][]endpoint.Endpoint{svc: eps})
	od := DefaultOutlierDetection()
	od.Interval, od.BaseEjectionTime, od.MaxEjectionTime, od.MaxEjectionPercent = time.Second, 10*time.Second, 300*time.Second, 34
	od.FailurePercentageEjection = &FailurePercentageEjection{Threshold: 40, EnforcementPercentage: 100, MinimumHosts: 3, RequestVolume: 4}
	b, client := newClient(t, src, withClock(clock.read), WithOutlierDetection(&od), WithPeakEWMA(0, time.Nanosecond))
	get := func(n int) {
		for range n {
			fetch(t, client, svcURL)
		}
	}
	a := func() EndpointState { return stateOf(b, svc, eps[0]) }
	advance := func(d time.Duration) { clock.now.Add(int64(d)) }

	get(60) // the first request starts the interval; A fails half of its requests
	advance(time.Second)
	get(1)
	require.Equal(t, "ejected", a().State)
	require.Equal(t, 1, a().Ejections)
	advance(11 * time.Second)
	get(60) // the check brings A back; A fails half of its requests again
	require.Equal(t, "ready", a().State)
	advance(time.Second)
	get(1)
	require.Equal(t, "ejected", a().State)
	require.Equal(t, 2, a().Ejections)
	advance(21 * time.Second)
	get(1)
	require.Equal(t, "ready", a().State)
	require.Equal(t, 2, a().Ejections, "back at the last interval's end: no interval in rotation yet")

	advance(1000 * time.Second) // a thousand intervals without a request
	get(60)
	require.Equal(t, 0, a().Ejections, "a thousand intervals in rotation take its count to 0")
	advance(time.Second)
	get(1)
	require.Equal(t, "ejected", a().State)
	require.Equal(t, 1, a().Ejections)
	require.NotNil(t, a().Until)
	require.WithinDuration(t, time.Now().Add(10*time.Second), *a().Until, time.Second, "ejected for the base ejection time")
}

// The closed form of idle intervals (balancer.idle) gives what running
// each of them gives (sweep, with no outcome), whatever the endpoints'
// ejections and counts, their ends before, inside or after the spell.
func TestOutlierIdleMatchesEachInterval(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := range 500 {
		o := &OutlierDetection{Interval: time.Duration(1+rng.IntN(5)) * time.Second, BaseEjectionTime: time.Duration(rng.IntN(20)) * time.Second,
			MaxEjectionTime: time.Duration(rng.IntN(60)) * time.Second, MaxEjectionPercent: 100,
			FailurePercentageEjection: &FailurePercentageEjection{Threshold: 0, EnforcementPercentage: 100, MinimumHosts: 0, RequestVolume: 0},
			SuccessRateEjection:       &SuccessRateEjection{StdevFactor: 0, EnforcementPercentage: 100, MinimumHosts: 0, RequestVolume: 0}}
		od, ok := outlierOf(o)
		require.True(t, ok)
		from := int64(100 * time.Second)
		n := int64(rng.IntN(40))
		closed, each := make([]*load, 4), make([]*load, 4)
		for i := range closed {
			h := health{odMult: rng.IntN(6)}
			if h.odMult > 0 && rng.IntN(2) == 0 {
				// Ejected at or before from, and still out at from.
				h.odEjected, h.odAt = true, from-int64(rng.IntN(int(o.BaseEjectionTime/time.Second)+1))*int64(time.Second)
				if from > od.ejectionEnd(h.odAt, h.odMult) {
					h.odAt = from
				}
			}
			closed[i], each[i] = newLoad(0, 0), newLoad(0, 0)
			closed[i].health, each[i].health = h, h
		}
		backClosed := od.idle(closed, from, n, nil)
		backEach := false
		for j := int64(1); j <= n; j++ {
			backEach = od.sweep(each, from+j*od.interval, nil) || backEach
		}
		require.Equal(t, backEach, backClosed, "round %d: an endpoint came back", round)
		for i := range closed {
			require.Equal(t, each[i].health, closed[i].health, "round %d, endpoint %d, %d intervals of %v", round, i, n, o.Interval)
		}
	}
}

// With a request volume of 0, an endpoint that got no request in the
// interval counts toward the minimum hosts (grpc-go keeps every endpoint
// with at least the volume): of three endpoints, one failing, one
// answering and one whose requests were all cancelled (no outcome), the
// failing one is ejected.
func TestPoolOutlierRequestVolumeZero(t *testing.T) {
	var clock fakeClock
	clock.now.Store(1)
	od := DefaultOutlierDetection()
	od.Interval, od.MaxEjectionPercent = time.Second, 100
	od.FailurePercentageEjection = &FailurePercentageEjection{Threshold: 50, EnforcementPercentage: 100, MinimumHosts: 3, RequestVolume: 0}
	p := NewPool(nil, withClock(clock.read), WithOutlierDetection(&od))
	var eps []endpoint.Endpoint
	for i := range 3 {
		eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", i+1))})
	}
	p.Update(eps)
	run := func(n int) {
		for range n {
			k, ok := p.Pick()
			require.True(t, ok)
			switch k.Endpoint().Addr {
			case eps[0].Addr:
				k.Done(Result{GRPCStatus: 14})
			case eps[1].Addr:
				k.Done(Result{GRPCStatus: 0})
			default:
				k.Done(Result{GRPCStatus: -1, Canceled: true})
			}
		}
	}
	run(100)
	clock.now.Add(int64(time.Second))
	run(1)
	var states []bool
	for _, e := range p.g.state.Load().eps {
		states = append(states, e.load.health.odEjected)
	}
	require.Equal(t, []bool{true, false, false}, states, "ejected: the failing endpoint, among three hosts with the volume of 0")
}
