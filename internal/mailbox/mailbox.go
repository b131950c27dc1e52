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
	owner   Owner[T] // nil: none
	wg      *sync.WaitGroup
	mu      sync.Mutex
	// The hooks of its contexts, which finish takes it off (nil: a
	// context that never ends). Pointers, not closures: one allocation
	// less per context for each of thousands of mailboxes.
	parentHook, ctxHook *hook
	pending             T
	fresh               bool // pending has not been delivered yet
	running             bool // a delivery goroutine is on its way
	ended               bool
	finished            bool          // ended and idle: the owner was told
	done                chan struct{} // made by a Stop that waits; closed once finished
}

// Start runs deliver for each value offered, in order, never concurrently,
// until parent or ctx is done or Stop is called; then, once deliver has
// returned for the last time, it calls onExit (if not nil) exactly once. wg,
// if not nil, counts the mailbox until then.
func Start[T any](parent, ctx context.Context, wg *sync.WaitGroup, deliver func(T), onExit func()) *Mailbox[T] {
	var owner Owner[T]
	if onExit != nil {
		owner = exitFunc[T](onExit)
	}
	return StartOwned(parent, ctx, wg, deliver, owner)
}

// Owner is told which of its mailboxes finished: see [StartOwned].
type Owner[T any] interface {
	// MailboxFinished is called once for m, once deliver has returned
	// for the last time; m's Stop waits for it.
	MailboxFinished(m *Mailbox[T])
}

// exitFunc is the Owner of a mailbox started with an onExit function.
type exitFunc[T any] func()

func (f exitFunc[T]) MailboxFinished(*Mailbox[T]) { f() }

// StartOwned is [Start] with owner's MailboxFinished (if owner is not nil)
// in place of onExit: an owner of many mailboxes learns which one finished
// without a closure for each.
func StartOwned[T any](parent, ctx context.Context, wg *sync.WaitGroup, deliver func(T), owner Owner[T]) *Mailbox[T] {
	m := &Mailbox[T]{deliver: deliver, owner: owner, wg: wg}
	if wg != nil {
		wg.Add(1)
	}
	// A context that never ends (Done is nil) needs no hook, and the
	// mailboxes of one context share one (see hook): a process holds a
	// mailbox per watcher of each of thousands of names, nearly all on a
	// few contexts.
	// Under mu: a context already done ends m at once, on another
	// goroutine, and its finish reads the unhooks.
	m.mu.Lock()
	defer m.mu.Unlock()
	if parent.Done() != nil {
		m.parentHook = hookOn(parent, m)
	}
	if ctx.Done() != nil {
		m.ctxHook = hookOn(ctx, m)
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
// time and onExit (or its owner's MailboxFinished) has run. It is safe to
// call more than once, but not from deliver.
func (m *Mailbox[T]) Stop() {
	m.end()
	m.mu.Lock()
	if m.finished {
		m.mu.Unlock()
		return
	}
	if m.done == nil {
		m.done = make(chan struct{})
	}
	done := m.done
	m.mu.Unlock()
	<-done
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
	m.mu.Lock()
	parentHook, ctxHook := m.parentHook, m.ctxHook
	m.mu.Unlock()
	if parentHook != nil {
		parentHook.remove(m)
	}
	if ctxHook != nil {
		ctxHook.remove(m)
	}
	if m.owner != nil {
		m.owner.MailboxFinished(m)
	}
	m.mu.Lock()
	m.finished = true
	done := m.done
	m.mu.Unlock()
	if done != nil {
		close(done)
	}
	if m.wg != nil {
		m.wg.Done()
	}
}

// ender is a mailbox of any type, as its contexts' hooks hold it.
type ender interface{ end() }

// hook ends the mailboxes of the contexts with one Done channel when it
// closes: one context.AfterFunc (an allocation and a place among the
// context's children) for all of them, instead of one each.
type hook struct {
	done  <-chan struct{}
	stop  func() bool
	boxes map[ender]struct{}
}

// hooks are the hooks by Done channel.
var hooks struct {
	mu sync.Mutex
	m  map[<-chan struct{}]*hook
}

// hookOn ends e when ctx is done, and returns the hook, whose remove takes
// it off again.
func hookOn(ctx context.Context, e ender) *hook {
	done := ctx.Done()
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	h := hooks.m[done]
	if h == nil {
		if hooks.m == nil {
			hooks.m = make(map[<-chan struct{}]*hook)
		}
		h = &hook{done: done, boxes: make(map[ender]struct{})}
		hooks.m[done] = h
		h.stop = context.AfterFunc(ctx, func() { h.fire(done) })
	}
	h.boxes[e] = struct{}{}
	return h
}

// fire ends the hook's mailboxes once its context is done.
func (h *hook) fire(done <-chan struct{}) {
	hooks.mu.Lock()
	if hooks.m[done] == h {
		delete(hooks.m, done)
	}
	boxes := h.boxes
	h.boxes = nil
	hooks.mu.Unlock()
	// Each on its own goroutine, as with a hook each: an onExit may wait
	// for another mailbox of the context.
	for e := range boxes {
		go e.end()
	}
}

// remove takes e off the hook, and the hook off its context when it
// was the last.
func (h *hook) remove(e ender) {
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	if h.boxes == nil { // fired
		return
	}
	delete(h.boxes, e)
	if len(h.boxes) == 0 && hooks.m[h.done] == h {
		delete(hooks.m, h.done)
		h.stop()
	}
}
