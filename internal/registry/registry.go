// Package registry holds per-authority state for the layers that keep some:
// the profile router, the balancer and classify's metric targets.
//
// A [Registry] maps the authorities that requests name (a Host header, an
// l5d-dst-override value, a URL host) to one [Entry] each. It normalises a
// raw key once (host:port in lower case, the default port added when the
// key has none; see internal/authority) and caches raw key -> entry, so
// that a request for a known authority costs one lock-free map read and no
// allocation. Each entry holds one immutable snapshot of the user's state
// type S behind an atomic pointer: requests Load it once and keep it; the
// owner of the entry (a watch callback) builds a new snapshot and Stores it.
//
// The registry is bounded and forgets what is not used:
//
//   - Past [WithMaxEntries] entries, creating one evicts the least
//     recently used (approximated with the CLOCK algorithm: each lookup sets
//     a reference bit; eviction gives referenced entries a second chance).
//   - An entry unused for [WithIdleTimeout] is released.
//
// A request in flight holds its entry ([Entry.Hold] until [Entry.Unhold]):
// a held entry is in use, however long the request lasts, so the idle sweep
// never releases it (a long stream keeps its authority's state: the loads
// of its endpoints, their failure accrual); eviction past the bound passes
// over held entries while any other is left.
//
// Releasing an entry (eviction, idle, [Registry.Close]) calls the stop
// function its start function returned, exactly once, outside every lock of
// the registry; this is how a watch on a control plane ends and frees the
// client's watch cap. A released entry stays usable by the requests that
// hold it; the next lookup of its authority creates a new entry.
//
// Creating an entry calls two user functions, neither under the
// registry's lock, so that a start function doing I/O never stalls
// lookups of other authorities: newState builds the first snapshot (it must
// be cheap and must not block), start (optional) starts what feeds the
// entry, typically a watch whose callback calls [Entry.Store]. A lookup
// that races with creation gets the entry with its first snapshot before
// start returns. A start function that fails returns an error: the entry
// stays with its first snapshot, and the lookup after the retry delay
// ([WithRetry], growing while the failures go on) calls start again.
//
// Idle entries are released by a sweep every idle timeout / 4: on a
// goroutine of the registry's own when it has a start function (its entries
// hold watches that must stop even when no request comes; [Registry.Close]
// ends it), otherwise during the next lookup that misses the cache.
//
// A balancer adopts it as the router does: S is its endpoint picker
// snapshot, start opens the endpoint watch and Stores a new picker on each
// update, and Get(req.Host) on the request path finds the picker.
package registry

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/backoff"
	authpkg "github.com/inmesh/inmesh/internal/authority"
)

// Defaults of a [Registry].
const (
	// DefaultMaxEntries is the library's one default bound on the
	// authorities a stack keeps state and watches for (the router's, the
	// balancer's, the profile router's and the control-plane client's
	// watches refer to it). Each fully watched authority holds three
	// control-plane streams (profile, endpoints, policy), each with its
	// goroutines and buffers: about 75 KiB in a proxy and 35 KiB in the
	// control plane (measured by examples/faults TestWatchTableFits), so
	// that 2,000 keep a full table within about 170 MiB and 85 MiB; at
	// 10,000 it was about a gigabyte on each side.
	DefaultMaxEntries = 2000
	// DefaultIdle is the library's one default for how long a stack keeps
	// an authority no request used (the router's watches, the balancer's
	// endpoints and split, classify's metric targets): then it is released
	// and its watches stop, freeing the control-plane client's cap. A
	// Registry itself releases nothing unless [WithIdleTimeout] says so.
	DefaultIdle = time.Minute
	DefaultPort = "80"
)

// maxAliases bounds the raw keys cached per entry; other spellings of the
// same authority are normalised on every lookup.
const maxAliases = 4

// Option configures a [Registry]. An option given a value it documents as
// ignored changes nothing.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	max         int
	idle        time.Duration
	defaultPort string
	retry       backoff.Policy
	now         func() time.Time
}

// DefaultRetry is the backoff between the attempts to start the watch of
// an entry whose start function failed: the entry stays, with its first
// snapshot, and lookups do not call start again until the delay has
// passed, so that a failure costs one attempt and one log line per delay,
// not one per request.
var DefaultRetry = backoff.Policy{Min: time.Second, Max: time.Minute, Jitter: 0.2}

// WithRetry sets the backoff between start attempts of a failed entry
// (default [DefaultRetry]); a policy without a positive Min changes
// nothing.
func WithRetry(p backoff.Policy) Option {
	return optionFunc(func(c *config) {
		if p.Min > 0 && p.Max >= p.Min {
			c.retry = p
		}
	})
}

// WithClock sets the clock of the retry delays (default time.Now), for
// tests; nil changes nothing.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) {
		if now != nil {
			c.now = now
		}
	})
}

// WithMaxEntries bounds the entries (default [DefaultMaxEntries]); n <= 0
// changes nothing.
func WithMaxEntries(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.max = n
		}
	})
}

// WithIdleTimeout releases entries unused for d (default: never); d <= 0
// changes nothing.
func WithIdleTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.idle = d
		}
	})
}

// WithDefaultPort sets the port of raw keys without one (default "80");
// "" changes nothing.
func WithDefaultPort(port string) Option {
	return optionFunc(func(c *config) {
		if port != "" {
			c.defaultPort = port
		}
	})
}

// Entry is one authority's state. Its methods are safe for concurrent use.
type Entry[S any] struct {
	// The fields are in an order that packs them into 96 bytes: a stack
	// keeps an entry in each of its registries for each of thousands of
	// authorities.
	authority string
	state     atomic.Pointer[S]
	// retry is set while start fails: when a lookup may call start again
	// (see [Registry.restart]), and how many attempts failed in a row.
	retry atomic.Pointer[retryState]
	holds atomic.Int32  // requests in flight that hold the entry
	flags atomic.Uint32 // refBit, deadBit, stopSetBit, stoppedBit

	// Guarded by the registry's mu.
	prev, next *Entry[S]
	// aliases are the raw keys cached for the entry besides its
	// authority, which the registry's index holds for every entry.
	aliases   []string
	idleSince time.Duration // since the registry's born, on its monotonic clock

	// stop is set once by setStop, before stopSetBit, and read by finish
	// when it sees that bit (see [Entry.setStop]).
	stop func()
}

// The bits of an entry's flags.
const (
	refBit     = 1 << iota // used since the last sweep or eviction pass
	deadBit                // released
	stopSetBit             // stop is set
	stoppedBit             // finished: stop was or is being called
)

// retryState is the state of an entry whose start failed; an entry's
// retry is replaced, never changed.
type retryState struct {
	at       int64 // Unix nanoseconds
	failures int32
}

// Authority returns the normalised authority (host:port) of the entry.
func (e *Entry[S]) Authority() string { return e.authority }

// Load returns the current snapshot.
func (e *Entry[S]) Load() *S { return e.state.Load() }

// Store replaces the snapshot. Storing into a released entry is harmless:
// only requests that still hold the entry see it.
func (e *Entry[S]) Store(s *S) { e.state.Store(s) }

// CompareAndSwap replaces the snapshot old with s, reporting whether it
// did.
func (e *Entry[S]) CompareAndSwap(old, s *S) bool { return e.state.CompareAndSwap(old, s) }

// Released reports whether the entry has been released.
func (e *Entry[S]) Released() bool { return e.dead() }

func (e *Entry[S]) dead() bool { return e.flags.Load()&deadBit != 0 }

// Hold marks the entry in use until a matching [Entry.Unhold]: the idle
// sweep does not release a held entry, and eviction takes one only when
// every entry is held. A request holds its entry for as long as it is in
// flight. A nil *Entry does nothing.
func (e *Entry[S]) Hold() {
	if e != nil {
		e.holds.Add(1)
	}
}

// Unhold ends one [Entry.Hold]; the entry counts as used now, so that its
// idle time starts when its last request ends.
func (e *Entry[S]) Unhold() {
	if e != nil {
		e.holds.Add(-1)
		e.touch()
	}
}

func (e *Entry[S]) held() bool { return e.holds.Load() > 0 }

func (e *Entry[S]) touch() {
	if e.flags.Load()&refBit == 0 {
		e.flags.Or(refBit)
	}
}

// unref clears the entry's reference bit and reports whether it was set.
func (e *Entry[S]) unref() bool { return e.flags.And(^uint32(refBit))&refBit != 0 }

// setStop records the stop function start returned; when the entry was
// released meanwhile it is called at once. It is called at most once.
// Whichever of setStop and finish sets its bit second calls stop.
func (e *Entry[S]) setStop(stop func()) {
	if stop == nil {
		return
	}
	e.stop = stop
	if e.flags.Or(stopSetBit)&stoppedBit != 0 {
		e.stop = nil
		stop()
	}
}

// finish calls the stop function once, if there is one.
func (e *Entry[S]) finish() {
	old := e.flags.Or(stoppedBit)
	if old&stoppedBit != 0 || old&stopSetBit == 0 {
		return
	}
	stop := e.stop
	e.stop = nil
	stop()
}

// Registry is a bounded, idle-released map from authorities to entries.
// It is safe for concurrent use.
type Registry[S any] struct {
	cfg      config
	newState func(authority string) *S
	start    func(*Entry[S]) (stop func(), err error)

	// keys maps each entry's authority and the raw keys cached for it
	// (its aliases) to the entry; read without a lock, changed under mu.
	keys *index[S]

	mu        sync.Mutex
	n         int       // entries
	head      *Entry[S] // the list in CLOCK order, oldest first
	tail      *Entry[S]
	lastSweep time.Time
	born      time.Time // what entries' idleSince counts from
	closed    bool

	quit chan struct{}
	done chan struct{}
}

// New returns a registry whose entries start with newState(authority) as
// their snapshot, after which start (nil: none) is called for each new
// entry. Neither is called with a lock of the registry held. A registry
// with a start function runs a goroutine when it has an idle timeout, and
// must be closed.
func New[S any](newState func(authority string) *S, start func(*Entry[S]) (stop func(), err error), opts ...Option) *Registry[S] {
	cfg := config{max: DefaultMaxEntries, defaultPort: DefaultPort, retry: DefaultRetry, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	r := &Registry[S]{cfg: cfg, newState: newState, start: start,
		keys: newIndex[S](), lastSweep: time.Now()}
	r.born = r.lastSweep
	if start != nil && cfg.idle > 0 {
		r.quit, r.done = make(chan struct{}), make(chan struct{})
		go r.janitor()
	}
	return r
}

// Get returns the entry of a raw key (a Host header: host, host:port,
// [v6]:port), creating it on first use. It returns nil when the key is not
// a valid authority or the registry is closed. A lookup of a cached key
// allocates nothing and takes no lock.
func (r *Registry[S]) Get(raw string) *Entry[S] {
	if e := r.keys.load(raw); e != nil {
		if !e.dead() {
			e.touch()
			if rs := e.retry.Load(); rs != nil && r.cfg.now().UnixNano() >= rs.at {
				r.restart(e)
			}
			return e
		}
	}
	return r.get(raw, true)
}

// restart calls start again for an entry whose start failed, once its
// retry delay has passed; concurrent lookups leave it to the first.
func (r *Registry[S]) restart(e *Entry[S]) {
	now := r.cfg.now()
	r.mu.Lock()
	rs := e.retry.Load()
	if r.closed || e.dead() || rs == nil || now.UnixNano() < rs.at {
		r.mu.Unlock()
		return
	}
	// Claim the attempt: lookups meanwhile wait for the next delay.
	e.retry.Store(&retryState{at: now.Add(r.cfg.retry.Delay(int(rs.failures))).UnixNano(), failures: rs.failures})
	r.mu.Unlock()
	stop, err := r.start(e)
	r.started(e, stop, err)
}

// started records the outcome of a start attempt of e.
func (r *Registry[S]) started(e *Entry[S], stop func(), err error) {
	r.mu.Lock()
	if err != nil {
		var failures int32 = 1
		if rs := e.retry.Load(); rs != nil {
			failures = rs.failures + 1
		}
		e.retry.Store(&retryState{at: r.cfg.now().Add(r.cfg.retry.Delay(int(failures) - 1)).UnixNano(), failures: failures})
		r.mu.Unlock()
		return
	}
	e.retry.Store(nil)
	r.mu.Unlock()
	e.setStop(stop)
}

// Cached returns the entry a raw key was cached for, or nil: it neither
// normalises nor creates, and never allocates.
func (r *Registry[S]) Cached(raw string) *Entry[S] {
	if e := r.keys.load(raw); e != nil {
		if !e.dead() {
			e.touch()
			return e
		}
	}
	return nil
}

// Lookup returns the entry of a raw key if there is one, creating none.
func (r *Registry[S]) Lookup(raw string) *Entry[S] {
	if e := r.keys.load(raw); e != nil {
		if !e.dead() {
			return e
		}
	}
	return r.get(raw, false)
}

// Normalize returns the authority of a raw key as the registry keys it.
func (r *Registry[S]) Normalize(raw string) (string, error) {
	if _, _, err := net.SplitHostPort(raw); err != nil {
		raw = net.JoinHostPort(strings.Trim(raw, "[]"), r.cfg.defaultPort)
	}
	n, err := authpkg.Normalize(raw)
	if err == nil && n == raw {
		// The key is its own authority: one string for both, the key
		// being cached anyway.
		return raw, nil
	}
	return n, err
}

// Len returns the number of entries.
func (r *Registry[S]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// Close releases every entry (calling their stop functions) and ends the
// registry's goroutine. Get then returns nil. Close is idempotent.
func (r *Registry[S]) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	var released []*Entry[S]
	for e := r.head; e != nil; e = e.next {
		released = append(released, e)
	}
	for _, e := range released {
		r.removeLocked(e)
	}
	r.mu.Unlock()
	if r.quit != nil {
		close(r.quit)
		<-r.done
	}
	for _, e := range released {
		e.finish()
	}
}

// get is the slow path of Get and Lookup.
func (r *Registry[S]) get(raw string, create bool) *Entry[S] {
	if raw == "" {
		return nil
	}
	authority, err := r.Normalize(raw)
	if err != nil {
		return nil
	}
	var released []*Entry[S]
	defer func() {
		for _, e := range released {
			e.finish()
		}
	}()
	r.mu.Lock()
	if r.start == nil {
		released = r.sweepLocked(time.Now(), false)
	}
	if e := r.aliasLocked(raw, authority, create); e != nil || !create || r.closed {
		r.mu.Unlock()
		return e
	}
	r.mu.Unlock()

	state := r.newState(authority)

	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	if e := r.aliasLocked(raw, authority, true); e != nil {
		r.mu.Unlock()
		return e
	}
	for r.n >= r.cfg.max {
		released = append(released, r.evictLocked())
	}
	e := &Entry[S]{authority: authority, idleSince: time.Since(r.born)}
	e.state.Store(state)
	r.keys.store(authority, e)
	r.n++
	r.pushLocked(e)
	r.addAliasLocked(e, raw)
	r.mu.Unlock()

	// The evicted entries are released before the new one starts: their
	// stop functions free the watches that its start may need, on a
	// client whose watch bound is this registry's. Started the other way
	// round, a full table's next entry found the client's bound taken by
	// the entry it replaced.
	for _, old := range released {
		old.finish()
	}
	released = nil
	if r.start != nil {
		// A failed start leaves the entry with its first snapshot; the
		// next attempt waits for the retry delay (see restart).
		stop, err := r.start(e)
		r.started(e, stop, err)
	}
	return e
}

// aliasLocked returns the entry of authority, caching raw for it; nil when
// there is none.
func (r *Registry[S]) aliasLocked(raw, authority string, touch bool) *Entry[S] {
	e := r.keys.load(authority)
	if e == nil || e.dead() {
		return nil
	}
	if touch {
		e.touch()
	}
	r.addAliasLocked(e, raw)
	return e
}

func (r *Registry[S]) addAliasLocked(e *Entry[S], raw string) {
	if raw == e.authority || len(e.aliases) >= maxAliases {
		return
	}
	for _, a := range e.aliases {
		if a == raw {
			return
		}
	}
	e.aliases = append(e.aliases, raw)
	r.keys.store(raw, e)
}

// evictLocked removes the least recently used entry (CLOCK: referenced
// entries move to the back with their bit cleared; held entries move to
// the back too, until two rounds found none other) and returns it.
func (r *Registry[S]) evictLocked() *Entry[S] {
	for n := 2 * r.n; ; n-- {
		e := r.head
		if second := e.unref() || e.held(); second && e.next != nil && n > 0 {
			r.unlinkLocked(e)
			r.pushLocked(e)
			continue
		}
		r.removeLocked(e)
		return e
	}
}

// sweepLocked releases the entries unused for the idle timeout, at most
// once per quarter of it unless force; it returns them, to be finished
// outside the lock.
func (r *Registry[S]) sweepLocked(now time.Time, force bool) []*Entry[S] {
	idle := r.cfg.idle
	if idle <= 0 || !force && now.Sub(r.lastSweep) < idle/4 {
		return nil
	}
	r.lastSweep = now
	var released []*Entry[S]
	for e := r.head; e != nil; {
		next := e.next
		switch {
		case e.unref() || e.held():
			e.idleSince = now.Sub(r.born)
		case now.Sub(r.born)-e.idleSince >= idle:
			r.removeLocked(e)
			released = append(released, e)
		}
		e = next
	}
	return released
}

// Sweep releases the entries unused for the idle timeout as of now, as
// the periodic sweep does (an entry used since the previous sweep, or
// held, starts its idle time at now). Tests call it with a clock of their
// own; the registry sweeps by itself.
func (r *Registry[S]) Sweep(now time.Time) {
	r.mu.Lock()
	released := r.sweepLocked(now, true)
	r.mu.Unlock()
	for _, e := range released {
		e.finish()
	}
}

func (r *Registry[S]) janitor() {
	defer close(r.done)
	t := time.NewTicker(max(r.cfg.idle/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-r.quit:
			return
		case now := <-t.C:
			r.Sweep(now)
		}
	}
}

func (r *Registry[S]) removeLocked(e *Entry[S]) {
	e.flags.Or(deadBit)
	r.n--
	r.keys.compareAndDelete(e.authority, e)
	for _, a := range e.aliases {
		r.keys.compareAndDelete(a, e)
	}
	r.unlinkLocked(e)
}

func (r *Registry[S]) pushLocked(e *Entry[S]) {
	e.prev, e.next = r.tail, nil
	if r.tail != nil {
		r.tail.next = e
	} else {
		r.head = e
	}
	r.tail = e
}

func (r *Registry[S]) unlinkLocked(e *Entry[S]) {
	if e.prev != nil {
		e.prev.next = e.next
	} else if r.head == e {
		r.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else if r.tail == e {
		r.tail = e.prev
	}
	e.prev, e.next = nil, nil
}
