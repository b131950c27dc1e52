package profiles

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A Budget runs as tower's TpsBudget, which linkerd2-proxy builds from a
// profile's retry budget (linkerd/service-profiles/src/proto.rs
// convert_retry_budget: TpsBudget::new(ttl, min_retries, retry_ratio)).
// Its reserve, MinRetriesPerSecond·TTL, can be withdrawn all at once
// (tower/src/retry/budget/tps_budget.rs: reserve = min_per_sec × ttl ×
// withdraw_amount, and a withdrawal succeeds while deposits and reserve
// cover it). The rows named tps_* are tower's tests of tps_budget.rs.
func TestBudgetAsTowerTpsBudget(t *testing.T) {
	type step struct {
		advance  time.Duration
		deposits int
		// withdraw counts the withdrawals, each expected to be granted
		// while granted is true; then one that is refused when refused is
		// true.
		withdraw int
		refused  bool
	}
	tests := []struct {
		name   string
		budget RetryBudget
		steps  []step
	}{
		{"tower tps_empty", RetryBudget{TTL: time.Second, MinRetriesPerSecond: 0, RetryRatio: 1}, []step{{refused: true}}},
		{"tower tps_leaky", RetryBudget{TTL: time.Second, MinRetriesPerSecond: 0, RetryRatio: 1}, []step{
			{deposits: 1}, {advance: 3 * time.Second, refused: true},
		}},
		{"tower tps_slots", RetryBudget{TTL: time.Second, MinRetriesPerSecond: 0, RetryRatio: 0.5}, []step{
			{deposits: 2},
			{advance: 901 * time.Millisecond, withdraw: 1}, // 900ms later, the deposits still count
			{advance: 2001 * time.Millisecond, deposits: 1},
			{advance: 301 * time.Millisecond, deposits: 1},
			{advance: 801 * time.Millisecond, deposits: 1},
			{withdraw: 1}, // the first deposit expired; the second and third make one retry
		}},
		{"tower tps_reserve", RetryBudget{TTL: time.Second, MinRetriesPerSecond: 5, RetryRatio: 1}, []step{{withdraw: 5, refused: true}}},
		{"Linkerd's default budget: 100 retries at once", DefaultRetryBudget(), []step{{withdraw: 100, refused: true}}},
		{"the reserve on top of the deposits", RetryBudget{TTL: 10 * time.Second, MinRetriesPerSecond: 10, RetryRatio: 0.2}, []step{
			{deposits: 50, withdraw: 110, refused: true},
		}},
		{"a reserve over two seconds", RetryBudget{TTL: 2 * time.Second, MinRetriesPerSecond: 3, RetryRatio: 0}, []step{{withdraw: 6, refused: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &fakeClock{time.Unix(1000, 0)}
			b := newBudget(tt.budget, clock.now)
			for i, s := range tt.steps {
				clock.t = clock.t.Add(s.advance)
				for range s.deposits {
					b.Deposit()
				}
				granted := 0
				for range s.withdraw {
					if b.Withdraw() {
						granted++
					}
				}
				assert.Equal(t, s.withdraw, granted, "step %d: withdrawals granted", i)
				if s.refused {
					assert.False(t, b.Withdraw(), "step %d: one more is refused", i)
				}
			}
		})
	}
}

// The minimum is a reserve per window: all of it at once, and then no
// more until those retries leave the window; never more than
// MinRetriesPerSecond·TTL in a window of TTL.
func TestBudgetReservePerWindow(t *testing.T) {
	clock := &fakeClock{time.Unix(1000, 0)}
	b := newBudget(RetryBudget{RetryRatio: 0, MinRetriesPerSecond: 10, TTL: 10 * time.Second}, clock.now)
	take := func() int {
		n := 0
		for b.Withdraw() {
			n++
		}
		return n
	}
	granted := []int{take()}
	for range 30 {
		clock.t = clock.t.Add(500 * time.Millisecond)
		granted = append(granted, take())
	}
	for i := 0; i+20 <= len(granted); i++ {
		sum := 0
		for _, g := range granted[i : i+20] {
			sum += g
		}
		assert.LessOrEqual(t, sum, 100, "window of 10s starting at step %d", i)
	}
	assert.Equal(t, 100, granted[0], "the whole reserve at once")
	for i, g := range granted[1:21] {
		assert.Zero(t, g, "step %d: the reserve is spent for the window", i+1)
	}
	assert.Equal(t, 100, granted[21], "the window passed: the whole reserve again")
}
