package profiles

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// budgetSlots is how many slices a budget's TTL window is cut into. A
// deposit counts for the slices it falls in and the budgetSlots-1 after
// (at most TTL), a withdrawal for budgetSlots more (at least TTL): the
// expiry errs on the side of fewer retries, so that every window of TTL,
// aligned on the slices or not, stays within the budget.
const budgetSlots = 20

// budgetRing is the number of slices a Budget remembers: withdrawals live
// one slice longer than deposits.
const budgetRing = budgetSlots + 1

// Budget is the running state of a [RetryBudget], in the manner of
// Finagle's and tower's retry budgets: every original request deposits
// RetryRatio retries that expire after TTL; on top of those,
// MinRetriesPerSecond retries a second are allowed without deposits. In
// every window of TTL the retries stay within RetryRatio per original
// request of the window plus MinRetriesPerSecond·TTL. As in tower's
// TpsBudget, which Linkerd's proxy runs (its reserve is
// MinRetriesPerSecond·TTL, all of it withdrawable at once), the whole
// minimum of a window can be taken at once: with Linkerd's default budget
// (0.2, 10 a second, 10s) a burst of 100 failures is retried.
//
// A Budget is safe for concurrent use.
type Budget struct {
	params RetryBudget
	slot   time.Duration
	ratio  float64
	// reserve is MinRetriesPerSecond·TTL, the retries allowed in a window
	// without deposits, all of it there at once, as in tower.
	reserve float64
	now     func() time.Time
	origin  time.Time

	mu  sync.Mutex
	cur int64 // the current slice, counted from origin
	// deposits counts the original requests per slice; w the retries,
	// from the first one on (most budgets never pay for a retry).
	deposits [budgetRing]int64
	w        *withdrawals
	// live sums: deposits of the last budgetSlots slices, withdrawals of
	// the last budgetRing slices.
	depositSum, paidSum, minimumSum int64
}

// withdrawals are the retries a Budget paid for, per slice: by deposits
// (paid) and by the minimum.
type withdrawals struct {
	paid, minimum [budgetRing]int64
}

// NewBudget returns the running state of b, which must be valid (see
// [RetryBudget.Validate]).
func NewBudget(b RetryBudget) *Budget {
	return newBudget(b, time.Now)
}

func newBudget(b RetryBudget, now func() time.Time) *Budget {
	// The ratio comes as a float32: read it as its shortest decimal, so
	// that 0.7 per request gives 7 retries for 10 requests, not 6.99.
	ratio, _ := strconv.ParseFloat(strconv.FormatFloat(float64(b.RetryRatio), 'g', -1, 32), 64)
	reserve := float64(b.MinRetriesPerSecond) * b.TTL.Seconds()
	return &Budget{
		params:  b,
		slot:    max(b.TTL/budgetSlots, 1),
		ratio:   ratio,
		reserve: reserve,
		now:     now,
		origin:  now(),
	}
}

// advance moves to the slice of now, expiring what ended; b.mu is held.
func (b *Budget) advance(now time.Time) {
	idx := int64(now.Sub(b.origin) / b.slot)
	if idx <= b.cur {
		return
	}
	if idx-b.cur >= budgetRing {
		b.deposits = [budgetRing]int64{}
		if b.w != nil {
			*b.w = withdrawals{}
		}
		b.depositSum, b.paidSum, b.minimumSum = 0, 0, 0
		b.cur = idx
		return
	}
	for k := b.cur + 1; k <= idx; k++ {
		if old := k - budgetSlots; old >= 0 {
			b.depositSum -= b.deposits[old%budgetRing]
			b.deposits[old%budgetRing] = 0
		}
		if b.w != nil {
			i := k % budgetRing
			b.paidSum -= b.w.paid[i]
			b.minimumSum -= b.w.minimum[i]
			b.w.paid[i], b.w.minimum[i] = 0, 0
		}
	}
	b.cur = idx
}

// Deposit records an answer that is not retried, as Linkerd's proxy deposits
// for each (linkerd/app/outbound/src/http/retry.rs, RetryPolicy::retry).
func (b *Budget) Deposit() {
	now := b.now()
	b.mu.Lock()
	b.advance(now)
	b.deposits[b.cur%budgetRing]++
	b.depositSum++
	b.mu.Unlock()
}

// Withdraw takes a retry token and reports whether there was one.
func (b *Budget) Withdraw() bool {
	_, ok := b.Take()
	return ok
}

// Withdrawal is a retry token [Budget.Take] took, for [Budget.Refund].
type Withdrawal struct {
	slice   int64 // the slice it was counted in
	minimum bool  // paid by the minimum, not by deposits
}

// Take is [Budget.Withdraw], returning the token it took so that a retry
// that is not sent after all (a hedge with no other endpoint to go to)
// can give it back.
func (b *Budget) Take() (Withdrawal, bool) {
	const epsilon = 1e-9
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	if b.w == nil {
		b.w = &withdrawals{}
	}
	i := b.cur % budgetRing
	if b.ratio*float64(b.depositSum)-float64(b.paidSum) >= 1-epsilon {
		b.w.paid[i]++
		b.paidSum++
		return Withdrawal{slice: b.cur}, true
	}
	// The deposits are spent: draw on the minimum, within the window.
	if b.reserve-float64(b.minimumSum) < 1-epsilon {
		return Withdrawal{}, false
	}
	b.w.minimum[i]++
	b.minimumSum++
	return Withdrawal{slice: b.cur, minimum: true}, true
}

// Refund gives back w, taken by [Budget.Take] for a retry that was never
// sent: the budget is as it would be without it. A token whose slice has
// expired is forgotten already; refunding it changes nothing. Each token
// must be refunded at most once.
func (b *Budget) Refund(w Withdrawal) {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	if b.w == nil || w.slice > b.cur || b.cur-w.slice >= budgetRing {
		return
	}
	i := w.slice % budgetRing
	if w.minimum {
		if b.w.minimum[i] > 0 {
			b.w.minimum[i]--
			b.minimumSum--
		}
		return
	}
	if b.w.paid[i] > 0 {
		b.w.paid[i]--
		b.paidSum--
	}
}

// BudgetState is what a [Budget] holds at one moment, for introspection.
type BudgetState struct {
	RetryBudget
	// Deposits counts the answers deposited over the current window; Withdrawals the
	// retries taken over it, paid by deposits or by the minimum.
	Deposits, Withdrawals int64
}

// MarshalJSON writes the state with the field names of the rest of a route
// explanation and the window as a duration ("10s"), as a ServiceProfile
// writes it: {"retryRatio":0.2,"minRetriesPerSecond":10,"ttl":"10s",
// "deposits":N,"withdrawals":M}.
func (s BudgetState) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		RetryRatio          float32 `json:"retryRatio"`
		MinRetriesPerSecond uint32  `json:"minRetriesPerSecond"`
		TTL                 string  `json:"ttl"`
		Deposits            int64   `json:"deposits"`
		Withdrawals         int64   `json:"withdrawals"`
	}{s.RetryRatio, s.MinRetriesPerSecond, s.TTL.String(), s.Deposits, s.Withdrawals})
}

// UnmarshalJSON reads what MarshalJSON writes, so that a Go client of a
// route explanation (/routes) can decode it.
func (s *BudgetState) UnmarshalJSON(b []byte) error {
	var w struct {
		RetryRatio          float32 `json:"retryRatio"`
		MinRetriesPerSecond uint32  `json:"minRetriesPerSecond"`
		TTL                 string  `json:"ttl"`
		Deposits            int64   `json:"deposits"`
		Withdrawals         int64   `json:"withdrawals"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	var ttl time.Duration
	if w.TTL != "" {
		var err error
		if ttl, err = time.ParseDuration(w.TTL); err != nil {
			return fmt.Errorf("profiles: budget ttl %q: %w", w.TTL, err)
		}
	}
	*s = BudgetState{RetryBudget: RetryBudget{RetryRatio: w.RetryRatio, MinRetriesPerSecond: w.MinRetriesPerSecond, TTL: ttl},
		Deposits: w.Deposits, Withdrawals: w.Withdrawals}
	return nil
}

// State returns the budget's parameters and counts.
func (b *Budget) State() BudgetState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BudgetState{RetryBudget: b.params, Deposits: b.depositSum, Withdrawals: b.paidSum + b.minimumSum}
}
