package balancer

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/balancer/endpoint"
)

// A Pool shares the Balancer's rules: weights decide the share between
// endpoints of equal load, and an endpoint failing in a row is tripped and
// gets nothing for its penalty. The load estimates read a clock that does
// not move, so that a pause of the test's goroutine (a loaded machine)
// cannot make one endpoint look slower and take its share.
func TestPoolWeightsAndAccrual(t *testing.T) {
	var clock fakeClock
	a := netip.MustParseAddrPort("127.0.0.1:1")
	b := netip.MustParseAddrPort("127.0.0.1:2")
	p := NewPool(nil, withClock(clock.read), WithFailureAccrual(&FailureAccrual{
		ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 3, Backoff: Backoff{MinBackoff: time.Hour}}}))
	_, ok := p.Pick()
	require.False(t, ok, "a pool without endpoints picks none")
	p.Update([]endpoint.Endpoint{{Addr: a, Weight: 3}, {Addr: b, Weight: 1}})
	n := map[netip.AddrPort]int{}
	const total = 10000
	for range total {
		k, ok := p.Pick()
		require.True(t, ok)
		n[k.Endpoint().Addr]++
		k.Done(Result{GRPCStatus: 0})
	}
	require.InDelta(t, 0.75, float64(n[a])/total, 0.05)

	for range 3 {
		for {
			k, _ := p.Pick()
			if k.Endpoint().Addr == b {
				k.Done(Result{GRPCStatus: 14})
				break
			}
			k.Done(Result{GRPCStatus: 0})
		}
	}
	for range 1000 {
		k, ok := p.Pick()
		require.True(t, ok)
		require.Equal(t, a, k.Endpoint().Addr, "the tripped endpoint was picked")
		k.Done(Result{GRPCStatus: 0})
	}
	// The state is kept while an endpoint is left out of an update.
	p.Update([]endpoint.Endpoint{{Addr: a}})
	p.Update([]endpoint.Endpoint{{Addr: a}, {Addr: b}})
	for range 100 {
		k, _ := p.Pick()
		require.Equal(t, a, k.Endpoint().Addr)
		k.Done(Result{GRPCStatus: 0})
	}
}

// A forward pool's picks carry labels that record no authority, as the
// Balancer labels a WithForward request; a pool's keep the authority the
// caller records them under. Both carry the endpoint's own labels.
func TestForwardPoolLabelsHaveNoAuthority(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:1")
	for _, tc := range []struct {
		name    string
		pool    *Pool
		unnamed bool
	}{
		{"a pool", NewPool(nil), false},
		{"a forward pool", NewForwardPool(nil), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.pool.Update([]endpoint.Endpoint{{Addr: a, Labels: map[string]string{"pod": "books-0"}}})
			k, ok := tc.pool.Pick()
			require.True(t, ok)
			defer k.Done(Result{GRPCStatus: 0})
			require.Equal(t, tc.unnamed, k.Labels().Unnamed())
			require.Contains(t, k.Labels().Key(), "books-0")
		})
	}
}

// A Pool's pick leaves its endpoint's load at FirstData, which takes the
// RTT sample, as Linkerd's balancer counts a request until the first data
// frame of its response (hyper-balance/src/lib.rs, PendingUntilFirstData):
// the stream that follows, however long, is neither load nor part of the
// sample, and Done takes no second sample. A pick without FirstData (a
// unary call, whose one message comes with its end) is counted until Done.
func TestPoolFirstData(t *testing.T) {
	var clock fakeClock
	clock.now.Store(1)
	p := NewPool(nil, withClock(clock.read), WithPeakEWMA(time.Millisecond, 10*time.Second))
	addr := netip.MustParseAddrPort("127.0.0.1:1")
	p.Update([]endpoint.Endpoint{{Addr: addr}})
	l := p.loads[addr]
	estimate := func() float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.estimateLocked(clock.read(), p.decay)
	}

	k, ok := p.Pick()
	require.True(t, ok)
	require.EqualValues(t, 1, l.pending.Load())
	clock.now.Add(int64(300 * time.Millisecond))
	k = k.FirstData()
	require.Zero(t, l.pending.Load(), "out of the load at its first data")
	require.InDelta(t, float64(300*time.Millisecond), estimate(), 1, "the time to the first data, a peak")
	k = k.FirstData()
	require.Zero(t, l.pending.Load(), "a second FirstData does nothing")
	clock.now.Add(int64(5 * time.Second))
	before := estimate()
	k.Done(Result{GRPCStatus: 0})
	require.Zero(t, l.pending.Load())
	require.Equal(t, before, estimate(), "the stream's end takes no second sample")

	k, ok = p.Pick()
	require.True(t, ok)
	clock.now.Add(int64(2 * time.Second))
	require.EqualValues(t, 1, l.pending.Load())
	k.Done(Result{GRPCStatus: 0})
	require.Zero(t, l.pending.Load())
	require.InDelta(t, float64(2*time.Second), estimate(), 1, "without FirstData, the time to Done")
}
