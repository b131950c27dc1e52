// Package mailbox delivers the latest of a stream of values to one callback
// on a goroutine of its own: a slow callback never holds up the sender, and
// values it had no time for are replaced by newer ones.
package mailbox

import (
	"context"
	"sync"
)

// Mailbox is one callback's delivery goroutine. It is safe for concurrent
// use.
type Mailbox[T any] struct {
	deliver func(T)
	ctx     context.Context
	cancel  context.CancelFunc
	notify  chan struct{}
	done    chan struct{}
	stopCtx func() bool

	mu      sync.Mutex
	pending T
	fresh   bool // pending has not been delivered yet
}

// Start runs deliver for each value offered, in order, never concurrently,
// until parent or ctx is done or Stop is called; then it calls onExit (if
// not nil) on the delivery goroutine and ends. wg, if not nil, counts the
// goroutine.
func Start[T any](parent, ctx context.Context, wg *sync.WaitGroup, deliver func(T), onExit func()) *Mailbox[T] {
	mctx, cancel := context.WithCancel(parent)
	m := &Mailbox[T]{deliver: deliver, ctx: mctx, cancel: cancel, notify: make(chan struct{}, 1), done: make(chan struct{})}
	m.stopCtx = context.AfterFunc(ctx, cancel)
	if wg != nil {
		wg.Add(1)
	}
	go m.run(wg, onExit)
	return m
}

// Offer replaces the value waiting for delivery with v.
func (m *Mailbox[T]) Offer(v T) {
	m.mu.Lock()
	m.pending, m.fresh = v, true
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// Stop ends the mailbox and waits until deliver has returned for the last
// time. It is safe to call more than once, but not from deliver.
func (m *Mailbox[T]) Stop() {
	m.stopCtx()
	m.cancel()
	<-m.done
}

func (m *Mailbox[T]) run(wg *sync.WaitGroup, onExit func()) {
	defer func() {
		if onExit != nil {
			onExit()
		}
		close(m.done)
		if wg != nil {
			wg.Done()
		}
	}()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-m.notify:
		}
		if m.ctx.Err() != nil {
			return
		}
		m.mu.Lock()
		v, fresh := m.pending, m.fresh
		m.fresh = false
		m.mu.Unlock()
		if fresh { // a wake-up for a value already delivered is dropped
			m.deliver(v)
		}
	}
}
