// Package mirror holds the mechanics that the router's and meshgrpc's
// request mirrors share: the backoff of a mirror whose copies get no
// answer.
package mirror

import (
	"sync/atomic"
	"time"
)

// The backoff of a mirror that gives no response (a dead mirror): a
// refused connection per copy would cost the primary's process a dial for
// nothing.
const (
	BackoffMin = 100 * time.Millisecond
	BackoffMax = 10 * time.Second
)

// Backoff backs off a mirror whose copies get no response: after a
// failure no copy is sent for a while, from [BackoffMin] doubling to
// [BackoffMax] while copies keep failing so; an answer ends it. Its zero
// value is a mirror that is not backed off. It is safe for concurrent use.
type Backoff struct {
	downUntil atomic.Int64 // unix nanoseconds
	backoff   atomic.Int64
}

// Down reports whether the mirror was ever backed off and not answered
// since (cheap: callers read the clock only then).
func (b *Backoff) Down() bool { return b.downUntil.Load() != 0 }

// Available reports whether a copy may go now.
func (b *Backoff) Available(now time.Time) bool { return now.UnixNano() >= b.downUntil.Load() }

// Failed backs the mirror off after a copy that got no response.
func (b *Backoff) Failed(now time.Time) {
	d := time.Duration(b.backoff.Load())
	d = min(max(2*d, BackoffMin), BackoffMax)
	b.backoff.Store(int64(d))
	b.downUntil.Store(now.Add(d).UnixNano())
}

// Answered ends the backoff.
func (b *Backoff) Answered() {
	if b.backoff.Load() != 0 {
		b.backoff.Store(0)
		b.downUntil.Store(0)
	}
}
