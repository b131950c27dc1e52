package profiles

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestBudget(t *testing.T) {
	t.Run("ratio", func(t *testing.T) {
		clock := &fakeClock{time.Unix(1000, 0)}
		b := newBudget(RetryBudget{RetryRatio: 0.1, MinRetriesPerSecond: 0, TTL: 10 * time.Second}, clock.now)
		for range 100 {
			b.Deposit()
		}
		granted := 0
		for range 20 {
			if b.Withdraw() {
				granted++
			}
		}
		assert.Equal(t, 10, granted, "one retry per ten requests")
	})
	t.Run("minimum per second without deposits", func(t *testing.T) {
		clock := &fakeClock{time.Unix(1000, 0)}
		b := newBudget(RetryBudget{RetryRatio: 0.1, MinRetriesPerSecond: 1, TTL: time.Second}, clock.now)
		assert.True(t, b.Withdraw())
		b.Deposit()
		assert.False(t, b.Withdraw(), "0.1 left")
		clock.t = clock.t.Add(1100 * time.Millisecond)
		assert.True(t, b.Withdraw(), "a new window allows the minimum again")
	})
	t.Run("deposits expire after ttl", func(t *testing.T) {
		clock := &fakeClock{time.Unix(1000, 0)}
		b := newBudget(RetryBudget{RetryRatio: 1, TTL: 2 * time.Second}, clock.now)
		for range 5 {
			b.Deposit()
		}
		clock.t = clock.t.Add(1500 * time.Millisecond)
		assert.True(t, b.Withdraw(), "still inside the window")
		clock.t = clock.t.Add(time.Second)
		assert.False(t, b.Withdraw(), "expired")
	})
}

// A refunded withdrawal (a hedge that was never sent) leaves the budget as
// if it had not been taken, whether deposits or the minimum paid for it;
// one whose window has passed is forgotten already, and its refund gives
// nothing back.
func TestBudgetRefund(t *testing.T) {
	t.Run("paid by deposits", func(t *testing.T) {
		clock := &fakeClock{time.Unix(1000, 0)}
		b := newBudget(RetryBudget{RetryRatio: 0.5, MinRetriesPerSecond: 0, TTL: 10 * time.Second}, clock.now)
		b.Deposit()
		b.Deposit()
		w, ok := b.Take()
		require.True(t, ok)
		assert.False(t, b.Withdraw(), "two requests earn one retry")
		clock.t = clock.t.Add(3 * time.Second) // a later slice of the window
		b.Refund(w)
		assert.Equal(t, int64(0), b.State().Withdrawals)
		assert.True(t, b.Withdraw(), "the refunded retry is there again")
		assert.False(t, b.Withdraw())
	})
	t.Run("paid by the minimum", func(t *testing.T) {
		clock := &fakeClock{time.Unix(1000, 0)}
		// A minimum of 1 a second over 1 s: one retry at once.
		b := newBudget(RetryBudget{RetryRatio: 0, MinRetriesPerSecond: 1, TTL: time.Second}, clock.now)
		w, ok := b.Take()
		require.True(t, ok)
		assert.False(t, b.Withdraw(), "the minimum is spent")
		b.Refund(w)
		assert.Equal(t, int64(0), b.State().Withdrawals)
		assert.True(t, b.Withdraw(), "the refunded retry is there again")
	})
	t.Run("after its window", func(t *testing.T) {
		clock := &fakeClock{time.Unix(1000, 0)}
		b := newBudget(RetryBudget{RetryRatio: 0.5, MinRetriesPerSecond: 0, TTL: 2 * time.Second}, clock.now)
		b.Deposit()
		b.Deposit()
		w, ok := b.Take()
		require.True(t, ok)
		// 21 slices of 100ms on: the deposits and the withdrawal expired,
		// and the new withdrawal is counted in the ring's slot the old one
		// was.
		clock.t = clock.t.Add(2100 * time.Millisecond)
		b.Deposit()
		b.Deposit()
		_, ok = b.Take()
		require.True(t, ok)
		b.Refund(w)
		assert.Equal(t, int64(1), b.State().Withdrawals, "the expired withdrawal's refund gives nothing back")
		assert.False(t, b.Withdraw())
	})
}

// BenchmarkBudget deposits and withdraws from two goroutines.
func BenchmarkBudget(b *testing.B) {
	budget := NewBudget(DefaultRetryBudget())
	b.ReportAllocs()
	b.SetParallelism(1) // GOMAXPROCS goroutines: 2 on this machine
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			budget.Deposit()
			budget.Withdraw()
		}
	})
}

func TestBudgetConcurrent(t *testing.T) {
	b := NewBudget(RetryBudget{RetryRatio: 0.5, TTL: time.Minute})
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				b.Deposit()
				if b.Withdraw() {
					mu.Lock()
					granted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, granted, 2000, "never more than ratio × deposits")
	assert.GreaterOrEqual(t, granted, 1999)
}

// A budget's state reads in a route explanation as the rest of it does:
// lower-camel names, the window as a duration.
func TestBudgetStateJSON(t *testing.T) {
	b, err := json.Marshal(BudgetState{RetryBudget: DefaultRetryBudget(), Deposits: 3, Withdrawals: 1})
	require.NoError(t, err)
	assert.JSONEq(t, `{"retryRatio":0.2,"minRetriesPerSecond":10,"ttl":"10s","deposits":3,"withdrawals":1}`, string(b))
}

// A budget's state, as a route explanation writes it, reads back the same:
// Go clients of /routes decode it.
func TestBudgetStateJSONRoundTrip(t *testing.T) {
	in := BudgetState{RetryBudget: RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, TTL: 10 * time.Second}, Deposits: 7, Withdrawals: 2}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"retryRatio":0.2,"minRetriesPerSecond":10,"ttl":"10s","deposits":7,"withdrawals":2}`; string(b) != want {
		t.Fatalf("marshalled %s, want %s", b, want)
	}
	var out BudgetState
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out != in {
		t.Fatalf("read back %+v, want %+v", out, in)
	}
	if err := json.Unmarshal([]byte(`{"ttl":"ten"}`), &out); err == nil {
		t.Fatal("a malformed ttl was accepted")
	}
}

// A budget that only counts requests (a profile whose routes never retry,
// the common case, held for each of thousands of names) keeps no
// withdrawal rings; its first retry makes them, and the window then
// expires withdrawals as before.
func TestBudgetMakesWithdrawalsOnFirstRetry(t *testing.T) {
	clock := &fakeClock{time.Unix(1000, 0)}
	b := newBudget(RetryBudget{RetryRatio: 0.5, TTL: 10 * time.Second}, clock.now)
	for range 4 {
		b.Deposit()
		clock.t = clock.t.Add(time.Second)
	}
	assert.Nil(t, b.w)
	assert.Equal(t, BudgetState{RetryBudget: b.params, Deposits: 4}, b.State())
	assert.True(t, b.Withdraw())
	assert.True(t, b.Withdraw())
	assert.False(t, b.Withdraw(), "0.5 per request of 4")
	require.NotNil(t, b.w)
	assert.Equal(t, int64(2), b.State().Withdrawals)
	// A window later, with nothing deposited: all expired.
	clock.t = clock.t.Add(11 * time.Second)
	assert.False(t, b.Withdraw())
	assert.Equal(t, BudgetState{RetryBudget: b.params}, b.State())
	// Far later (past the ring): a fresh window.
	clock.t = clock.t.Add(time.Hour)
	b.Deposit()
	b.Deposit()
	assert.True(t, b.Withdraw())
	assert.False(t, b.Withdraw())
}
