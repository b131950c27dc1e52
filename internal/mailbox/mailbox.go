// Package mailbox delivers the latest of a stream of values to one callback:
// a slow callback never holds up the sender, and values it had no time for
// are replaced by newer ones. A delivery goroutine runs only while a value
// waits, so an idle mailbox costs a few words, not a goroutine stack: a
// process watching thousands of authorities holds thousands of mailboxes.
package mailbox

import (
	"context"
	"sync"
)

// Mailbox is one callback's delivery queue of length one. It is safe for
// concurrent use.
type Mailbox[T any] struct {
	deliver func(T)
	onExit  func()
	wg      *sync.WaitGroup
	// stops unregister the context hooks.
	stopParent, stopCtx func() bool
	done                chan struct{} // closed once ended and idle

	mu      sync.Mutex
	pending T
	fresh   bool // pending has not been delivered yet
	running bool // a delivery goroutine is on its way
	ended   bool
}

// Start runs deliver for each value offered, in order, never concurrently,
// until parent or ctx is done or Stop is called; then, once deliver has
// returned for the last time, it calls onExit (if not nil) exactly once. wg,
// if not nil, counts the mailbox until then.
func Start[T any](parent, ctx context.Context, wg *sync.WaitGroup, deliver func(T), onExit func()) *Mailbox[T] {
	m := &Mailbox[T]{deliver: deliver, onExit: onExit, wg: wg, done: make(chan struct{})}
	if wg != nil {
		wg.Add(1)
	}
	// A context that never ends (Done is nil) needs no hook: each costs
	// an allocation and a place among its context's children, and a
	// process holds a mailbox per watcher of each of thousands of names.
	if parent.Done() != nil {
		m.stopParent = context.AfterFunc(parent, m.end)
	}
	if ctx.Done() != nil {
		m.stopCtx = context.AfterFunc(ctx, m.end)
	}
	return m
}

// Offer replaces the value waiting for delivery with v. After the mailbox
// ended it does nothing.
func (m *Mailbox[T]) Offer(v T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ended {
		return
	}
	m.pending, m.fresh = v, true
	if !m.running {
		m.running = true
		go m.run()
	}
}

// Stop ends the mailbox and waits until deliver has returned for the last
// time and onExit has run. It is safe to call more than once, but not from
// deliver.
func (m *Mailbox[T]) Stop() {
	m.end()
	<-m.done
}

// run delivers until nothing waits, or the mailbox ended.
func (m *Mailbox[T]) run() {
	var zero T
	for {
		m.mu.Lock()
		if m.ended || !m.fresh {
			m.running = false
			ended := m.ended
			m.mu.Unlock()
			if ended {
				m.finish()
			}
			return
		}
		v := m.pending
		m.pending, m.fresh = zero, false
		m.mu.Unlock()
		m.deliver(v)
	}
}

// end marks the mailbox ended; a delivery under way finishes it, or else
// end does.
func (m *Mailbox[T]) end() {
	m.mu.Lock()
	if m.ended {
		m.mu.Unlock()
		return
	}
	m.ended = true
	var zero T
	m.pending, m.fresh = zero, false
	running := m.running
	m.mu.Unlock()
	if !running {
		m.finish()
	}
}

func (m *Mailbox[T]) finish() {
	if m.stopParent != nil {
		m.stopParent()
	}
	if m.stopCtx != nil {
		m.stopCtx()
	}
	if m.onExit != nil {
		m.onExit()
	}
	close(m.done)
	if m.wg != nil {
		m.wg.Done()
	}
}
