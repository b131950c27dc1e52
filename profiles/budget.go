package profiles

import (
	"sync"
	"time"
)

// budgetSlots is how many slices a budget's TTL window is cut into;
// deposits expire a slice at a time.
const budgetSlots = 10

// Budget is the running state of a [RetryBudget], in the manner of
// Finagle's and tower's retry budgets: every original request deposits one
// token, every retry withdraws 1/RetryRatio tokens' worth, deposits expire
// after TTL, and MinRetriesPerSecond·TTL retries are allowed in each window
// even without deposits. A Budget is safe for concurrent use.
type Budget struct {
	mu       sync.Mutex
	slot     time.Duration
	reserve  float64 // retries always allowed per window
	ratio    float64
	slots    [budgetSlots]float64 // deposits·ratio minus withdrawals, per slice
	current  int
	sliceEnd time.Time
	now      func() time.Time
}

// NewBudget returns the running state of b, which must be valid (see
// [RetryBudget.Validate]).
func NewBudget(b RetryBudget) *Budget {
	return newBudget(b, time.Now)
}

func newBudget(b RetryBudget, now func() time.Time) *Budget {
	return &Budget{
		slot:     b.TTL / budgetSlots,
		reserve:  float64(b.MinRetriesPerSecond) * b.TTL.Seconds(),
		ratio:    float64(b.RetryRatio),
		now:      now,
		sliceEnd: now().Add(b.TTL / budgetSlots),
	}
}

// advance expires the slices that ended; b.mu is held.
func (b *Budget) advance() {
	now := b.now()
	for i := 0; !now.Before(b.sliceEnd); i++ {
		if i >= budgetSlots {
			// A whole window went by: everything expired.
			b.slots = [budgetSlots]float64{}
			b.sliceEnd = now.Add(b.slot)
			return
		}
		b.current = (b.current + 1) % budgetSlots
		b.slots[b.current] = 0
		b.sliceEnd = b.sliceEnd.Add(b.slot)
	}
}

// Deposit records an original request.
func (b *Budget) Deposit() {
	b.mu.Lock()
	b.advance()
	b.slots[b.current] += b.ratio
	b.mu.Unlock()
}

// Withdraw takes a retry token and reports whether there was one.
func (b *Budget) Withdraw() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	balance := b.reserve
	for _, s := range b.slots {
		balance += s
	}
	if balance < 1 {
		return false
	}
	b.slots[b.current]--
	return true
}
