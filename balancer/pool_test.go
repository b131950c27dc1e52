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
