package balancer

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
)

// floorOutlierSetup: three real endpoints. A fails every other request
// (never two in a row, so accrual's 2 consecutive failures never trip it,
// but its 50% failures are above outlier detection's 40% threshold); B
// fails every request once failB is set; C always answers. Failure
// accrual trips after 2 consecutive failures with an ejection floor of 2
// ready endpoints; failure-percentage outlier detection ejects at most one
// of the three.
func floorOutlierSetup(t *testing.T) (b *Balancer, get func() int, clock *fakeClock, failB *atomic.Bool, src *StaticSource, eps []endpoint.Endpoint) {
	clock = new(fakeClock)
	clock.now.Store(1)
	failB = new(atomic.Bool)
	epA := everyOtherFails(t, "A")
	epB := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if failB.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Write([]byte("B"))
	}))
	epC := backend(t, "C")
	eps = []endpoint.Endpoint{epA, epB, epC}
	src = staticSource(t, map[string][]endpoint.Endpoint{svc: eps})
	od := DefaultOutlierDetection()
	od.Interval, od.BaseEjectionTime, od.MaxEjectionPercent = time.Second, time.Second, 34
	od.FailurePercentageEjection = &FailurePercentageEjection{Threshold: 40, EnforcementPercentage: 100, MinimumHosts: 3, RequestVolume: 4}
	fa := &FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 2,
		Backoff: Backoff{MinBackoff: time.Hour, MaxBackoff: time.Hour, JitterRatio: -1}},
		Ejection: Ejection{MinReadyEndpoints: 2}}
	b, client := newClient(t, src, withClock(clock.read), WithOutlierDetection(&od), WithFailureAccrual(fa))
	get = func() int {
		code, _, _ := fetch(t, client, svcURL)
		return code
	}
	return b, get, clock, failB, src, eps
}

// everyOtherFails is an endpoint answering name to one request, 500 to
// the next: never two failures in a row, half of its requests failed.
func everyOtherFails(t *testing.T, name string) endpoint.Endpoint {
	var n atomic.Int64
	return backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1)%2 == 0 {
			http.Error(w, "flaky", http.StatusInternalServerError)
			return
		}
		w.Write([]byte(name))
	}))
}

func floorStates(b *Balancer, eps []endpoint.Endpoint) string {
	var out string
	for i, e := range eps {
		out += fmt.Sprintf("%c=%s ", 'A'+i, stateOf(b, svc, e).State)
	}
	return out
}

// The ejection floor ("an endpoint does not trip while fewer than
// MinReadyEndpoints others would stay ready") counts an endpoint outlier
// detection ejected as out of rotation: with A ejected, B failing every
// request does not trip, C alone would be left.
func TestEjectionFloorCountsOutlierEjected(t *testing.T) {
	b, get, clock, failB, _, eps := floorOutlierSetup(t)
	for range 60 {
		get()
	}
	clock.now.Add(int64(time.Second))
	get() // the interval's check: A is ejected
	require.Equal(t, "ejected", stateOf(b, svc, eps[0]).State, floorStates(b, eps))
	failB.Store(true)
	for range 100 {
		get()
	}
	inRotation := 0
	for _, e := range eps {
		if stateOf(b, svc, e).State == "ready" {
			inRotation++
		}
	}
	require.Equal(t, 2, inRotation, "the ejection floor of 2 ready endpoints: %s", floorStates(b, eps))
}

// An endpoint outlier detection brings back counts for the floor again,
// also when the endpoint set was published while it was out (the count
// is then taken without it): with A, B and C in rotation, B failing
// every request trips, two others staying ready.
func TestEjectionFloorCountsUnejected(t *testing.T) {
	b, get, clock, failB, src, eps := floorOutlierSetup(t)
	for range 60 {
		get()
	}
	clock.now.Add(int64(time.Second))
	get()
	require.Equal(t, "ejected", stateOf(b, svc, eps[0]).State, floorStates(b, eps))
	before := lookup(b, svc).def.state.Load()
	require.NoError(t, src.Set(svc, append([]endpoint.Endpoint(nil), eps...))) // an update while A is ejected
	for deadline := time.Now().Add(testutil.Timeout); lookup(b, svc).def.state.Load() == before; runtime.Gosched() {
		require.True(t, time.Now().Before(deadline), "the update never arrived")
	}
	// Past A's ejection (1 s), the next interval's check brings it back.
	clock.now.Add(int64(2 * time.Second))
	get()
	require.Equal(t, "ready", stateOf(b, svc, eps[0]).State, floorStates(b, eps))
	failB.Store(true)
	for range 100 {
		get()
	}
	require.Equal(t, "tripped", stateOf(b, svc, eps[1]).State,
		"B failed every request with A and C in rotation, yet the floor kept it in: %s", floorStates(b, eps))
}

// The floor's count of endpoints in rotation follows every change of
// either mechanism: after each step of a random run of picks, outcomes,
// updates and interval checks (failure accrual tripping and restoring,
// outlier detection ejecting and bringing back), it equals the endpoints
// neither tripped nor ejected.
func TestPoolReadyCountFollowsEjections(t *testing.T) {
	var clock fakeClock
	clock.now.Store(1)
	od := DefaultOutlierDetection()
	od.Interval, od.BaseEjectionTime, od.MaxEjectionTime, od.MaxEjectionPercent = time.Second, 2*time.Second, 10*time.Second, 50
	od.FailurePercentageEjection = &FailurePercentageEjection{Threshold: 30, EnforcementPercentage: 100, MinimumHosts: 3, RequestVolume: 2}
	fa := &FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 2,
		Backoff: Backoff{MinBackoff: 500 * time.Millisecond, MaxBackoff: 3 * time.Second, JitterRatio: -1}},
		Ejection: Ejection{MinReadyEndpoints: 2}}
	p := NewPool(nil, withClock(clock.read), WithOutlierDetection(&od), WithFailureAccrual(fa))
	var eps []endpoint.Endpoint
	for i := range 5 {
		eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", i+1))})
	}
	p.Update(eps)
	rng := rand.New(rand.NewPCG(7, 8))
	failing := map[netip.AddrPort]int{eps[0].Addr: 60, eps[1].Addr: 40, eps[2].Addr: 10} // percent
	ejections, trips := 0, 0
	for step := range 20000 {
		switch r := rng.IntN(100); {
		case r < 2:
			clock.now.Add(int64(time.Duration(rng.IntN(4000)) * time.Millisecond))
		case r < 3:
			p.Update(eps[:3+rng.IntN(3)]) // some left out for a while, then back
		default:
			k, ok := p.Pick()
			if !ok {
				continue
			}
			code := 0
			if rng.IntN(100) < failing[k.Endpoint().Addr] {
				code = 14
			}
			k.Done(Result{GRPCStatus: code})
		}
		s := p.g.state.Load()
		for _, e := range s.eps {
			h := e.load.health
			if h.odEjected {
				ejections++
			}
			if h.tripped {
				trips++
			}
		}
		p.g.mu.Lock()
		ready := p.g.ready
		p.g.mu.Unlock()
		require.Equal(t, s.countReady(), ready, "step %d", step)
	}
	require.Positive(t, ejections, "outlier detection ejected")
	require.Positive(t, trips, "failure accrual tripped")
}
