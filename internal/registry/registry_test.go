package registry

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type state struct{ authority string }

func newState(a string) *state { return &state{authority: a} }

// counter counts starts and stops per authority.
type counter struct {
	mu     sync.Mutex
	starts map[string]int
	stops  map[string]int
	err    error
}

func newCounter() *counter { return &counter{starts: map[string]int{}, stops: map[string]int{}} }

func (c *counter) start(e *Entry[state]) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starts[e.Authority()]++
	if c.err != nil {
		return nil, c.err
	}
	return func() {
		c.mu.Lock()
		c.stops[e.Authority()]++
		c.mu.Unlock()
	}, nil
}

func (c *counter) get(m map[string]int, a string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m[a]
}

func TestNormalizeOnce(t *testing.T) {
	r := New(newState, nil, WithDefaultPort("8080"))
	tests := []struct{ raw, want string }{
		{"Books", "books:8080"},
		{"books:8080", "books:8080"},
		{"BOOKS.:8080", "books:8080"},
		{"10.0.0.1", "10.0.0.1:8080"},
		{"[::1]", "[::1]:8080"},
		{"[::1]:90", "[::1]:90"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			e := r.Get(tt.raw)
			require.NotNil(t, e)
			assert.Equal(t, tt.want, e.Authority())
			assert.Equal(t, tt.want, e.Load().authority, "first snapshot built for the normalised authority")
		})
	}
	assert.Same(t, r.Get("books"), r.Get("Books:8080"))
	assert.Equal(t, 4, r.Len())
	for _, bad := range []string{"", "bad host", "a:0", "a:99999", "a/b:80", "\r\n"} {
		assert.Nil(t, r.Get(bad), "%q", bad)
	}
	assert.Equal(t, 4, r.Len())
	assert.Nil(t, r.Lookup("other:1"), "Lookup creates nothing")
	assert.Same(t, r.Get("books"), r.Lookup("BOOKS"))
}

func TestEvictsLeastRecentlyUsed(t *testing.T) {
	c := newCounter()
	r := New(newState, c.start, WithMaxEntries(3))
	defer r.Close()
	a, b := r.Get("a"), r.Get("b")
	r.Get("c")
	require.Same(t, a, r.Get("a")) // a is used again; b is not
	r.Get("d")
	assert.True(t, b.Released())
	assert.False(t, a.Released())
	assert.Equal(t, 1, c.get(c.stops, "b:80"), "eviction stops the entry")
	assert.Nil(t, r.Lookup("b"))
	for _, k := range []string{"a", "c", "d"} {
		assert.NotNil(t, r.Lookup(k), k)
	}
	assert.Equal(t, 3, r.Len())
	// b comes back as a new entry, with a new start.
	assert.NotSame(t, b, r.Get("b"))
	assert.Equal(t, 2, c.get(c.starts, "b:80"))
}

// A full registry releases the entry it evicts before it starts the new
// one, so that a start which takes a slot of a bound the size of the
// registry's (a control-plane client's watches) finds the slot free.
// Started first, the new entry's watch was refused by a client at its
// bound while the evicted entry still held its own.
func TestEvictedEntryStopsBeforeTheNewOneStarts(t *testing.T) {
	var open, most atomic.Int64
	start := func(*Entry[state]) (func(), error) {
		n := open.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		return func() { open.Add(-1) }, nil
	}
	r := New(newState, start, WithMaxEntries(2))
	defer r.Close()
	for i := range 10 {
		r.Get(fmt.Sprintf("svc-%d", i))
	}
	assert.Equal(t, int64(2), most.Load(), "never more started entries than the bound")
	assert.Equal(t, int64(2), open.Load())
}

func TestIdleReleaseStopsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCounter()
		r := New(newState, c.start, WithIdleTimeout(time.Second))
		defer r.Close()
		busy, idle := r.Get("busy"), r.Get("idle")
		for range 20 {
			time.Sleep(100 * time.Millisecond)
			r.Get("busy")
		}
		assert.True(t, idle.Released())
		assert.False(t, busy.Released(), "used within the idle timeout")
		assert.Equal(t, 1, c.get(c.stops, "idle:80"))
		assert.Equal(t, 0, c.get(c.stops, "busy:80"))
		time.Sleep(10 * time.Second)
		assert.True(t, busy.Released())
		assert.Equal(t, 1, c.get(c.stops, "idle:80"), "stopped exactly once")
		assert.Equal(t, 1, c.get(c.stops, "busy:80"))
		assert.Equal(t, 0, r.Len())
		r.Close()
		assert.Equal(t, 1, c.get(c.stops, "busy:80"), "Close does not stop released entries again")
	})
}

// An entry held by a request in flight is in use for as long as it is
// held: the idle sweep does not release it, however many idle timeouts the
// request lasts; once the last hold ends, the entry idles out as any other.
func TestHeldEntryOutlivesIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCounter()
		r := New(newState, c.start, WithIdleTimeout(time.Second))
		defer r.Close()
		long, short := r.Get("long"), r.Get("short")
		long.Hold()
		long.Hold()
		time.Sleep(10 * time.Second)
		assert.True(t, short.Released())
		assert.False(t, long.Released(), "held across ten idle timeouts")
		assert.Equal(t, 0, c.get(c.stops, "long:80"))
		long.Unhold()
		time.Sleep(10 * time.Second)
		assert.False(t, long.Released(), "still held once")
		long.Unhold()
		time.Sleep(time.Second / 2)
		assert.False(t, long.Released(), "its idle time starts when the last hold ends")
		time.Sleep(2 * time.Second)
		assert.True(t, long.Released())
		assert.Equal(t, 1, c.get(c.stops, "long:80"))
	})
}

// Sweep releases by the clock it is given.
func TestSweepByHand(t *testing.T) {
	r := New(newState, func(*Entry[state]) (func(), error) { return func() {}, nil }, WithIdleTimeout(time.Hour))
	defer r.Close()
	idle, held := r.Get("idle"), r.Get("held")
	held.Hold()
	now := time.Now()
	r.Sweep(now.Add(2 * time.Hour))
	assert.True(t, idle.Released())
	assert.False(t, held.Released())
	r.Sweep(now.Add(4 * time.Hour))
	assert.False(t, held.Released())
	held.Unhold()
	r.Sweep(now.Add(6 * time.Hour)) // used since the last sweep
	assert.False(t, held.Released())
	r.Sweep(now.Add(8 * time.Hour))
	assert.True(t, held.Released())
}

// Past the bound, eviction passes over held entries while another is
// left; when every entry is held, the bound still holds.
func TestEvictionPassesOverHeld(t *testing.T) {
	c := newCounter()
	r := New(newState, c.start, WithMaxEntries(2))
	defer r.Close()
	a, b := r.Get("a"), r.Get("b")
	a.Hold()
	r.Get("c") // a is the least recently used, but held
	assert.False(t, a.Released())
	assert.True(t, b.Released())
	r.Get("a")
	c2 := r.Lookup("c")
	require.NotNil(t, c2)
	c2.Hold()
	r.Get("d")
	assert.Equal(t, 2, r.Len(), "the bound holds when every entry is held")
	assert.True(t, a.Released() != c2.Released(), "exactly one held entry was evicted")
}

func TestIdleReleaseWithoutStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(newState, nil, WithIdleTimeout(time.Second))
		old := r.Get("old")
		time.Sleep(2 * time.Second)
		r.Get("new") // a miss sweeps
		assert.True(t, old.Released())
		assert.Equal(t, 1, r.Len())
	})
}

// TestStartErrorBacksOff: a start function that fails (a watch refused at
// the control-plane client's cap, say) is not called again on every
// lookup: the entry stays with its first snapshot and the next attempt
// waits for the retry delay, which grows while the failures go on and
// resets after a success.
func TestStartErrorBacksOff(t *testing.T) {
	c := newCounter()
	c.err = errors.New("full")
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	r := New(newState, c.start, WithClock(clock), WithRetry(backoff.Policy{Min: time.Second, Max: 4 * time.Second}))
	defer r.Close()
	e := r.Get("a")
	require.NotNil(t, e, "the request still gets a first state")
	assert.Equal(t, "a:80", e.Load().authority)
	assert.Equal(t, 1, r.Len(), "the failed entry stays")
	for range 200 {
		require.Same(t, e, r.Get("a"))
	}
	assert.Equal(t, 1, c.get(c.starts, "a:80"), "200 lookups within the delay start nothing")

	advance(time.Second)
	r.Get("a")
	assert.Equal(t, 2, c.get(c.starts, "a:80"), "after the delay the next lookup tries again")
	advance(time.Second)
	r.Get("a")
	assert.Equal(t, 2, c.get(c.starts, "a:80"), "the delay doubled after the second failure")
	advance(time.Second)
	r.Get("a")
	assert.Equal(t, 3, c.get(c.starts, "a:80"))

	c.mu.Lock()
	c.err = nil
	c.mu.Unlock()
	advance(4 * time.Second)
	r.Get("a")
	assert.Equal(t, 4, c.get(c.starts, "a:80"))
	for range 10 {
		r.Get("a")
	}
	advance(time.Hour)
	r.Get("a")
	assert.Equal(t, 4, c.get(c.starts, "a:80"), "a started entry is not started again")
	assert.Equal(t, 1, r.Len())
}

func TestStartRunsWithoutTheLock(t *testing.T) {
	block := make(chan struct{})
	entered := make(chan struct{})
	start := func(e *Entry[state]) (func(), error) {
		if e.Authority() == "slow:80" {
			close(entered)
			<-block
		}
		return func() {}, nil
	}
	r := New(newState, start)
	defer r.Close()
	done := make(chan *Entry[state])
	go func() { done <- r.Get("slow") }()
	<-entered
	// Other authorities, and the slow one itself, are served meanwhile.
	assert.NotNil(t, r.Get("fast"))
	assert.Equal(t, "slow:80", r.Get("slow").Load().authority)
	close(block)
	assert.NotNil(t, <-done)
}

func TestStopOfAnEntryReleasedDuringStart(t *testing.T) {
	var stops atomic.Int32
	var r *Registry[state]
	r = New(newState, func(e *Entry[state]) (func(), error) {
		if e.Authority() == "a:80" {
			r.Get("b") // evicts a (max 1) before a's start returns
		}
		return func() { stops.Add(1) }, nil
	}, WithMaxEntries(1))
	a := r.Get("a")
	assert.True(t, a.Released())
	assert.Equal(t, int32(1), stops.Load(), "a's stop ran when its start returned")
	r.Close()
	assert.Equal(t, int32(2), stops.Load())
}

func TestCloseReleasesEverything(t *testing.T) {
	c := newCounter()
	r := New(newState, c.start, WithIdleTimeout(time.Hour))
	for i := range 10 {
		r.Get("h" + strconv.Itoa(i))
	}
	r.Close()
	r.Close()
	for i := range 10 {
		assert.Equal(t, 1, c.get(c.stops, "h"+strconv.Itoa(i)+":80"))
	}
	assert.Nil(t, r.Get("h1"))
	assert.Nil(t, r.Get("new"))
	assert.Equal(t, 0, r.Len())
}

func TestConcurrentUse(t *testing.T) {
	c := newCounter()
	r := New(newState, c.start, WithMaxEntries(20), WithIdleTimeout(5*time.Millisecond))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				key := fmt.Sprintf("h%d:%d", (i*7+g)%50, 80+g%2)
				e := r.Get(key)
				if e == nil || e.Load() == nil {
					t.Errorf("no entry for %s", key)
					return
				}
				if i%10 == 0 {
					e.Store(newState(e.Authority()))
				}
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, r.Len(), 20)
	r.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, n := range c.starts {
		assert.Equal(t, n, c.stops[a], "every start of %s is stopped once", a)
	}
}

func TestRawKeysAreBounded(t *testing.T) {
	r := New(newState, nil)
	for i := range 100 {
		// Spellings of one authority differing only in case.
		k := []byte("books")
		for j := range k {
			if i>>j&1 == 1 {
				k[j] -= 'a' - 'A'
			}
		}
		r.Get(string(k))
	}
	// The authority, books:80, and maxAliases other spellings.
	assert.Equal(t, maxAliases+1, r.keys.len())
}

func TestIndex(t *testing.T) {
	x := newIndex[state]()
	entries := make([]*Entry[state], 1000)
	for i := range entries {
		entries[i] = &Entry[state]{authority: strconv.Itoa(i)}
		x.store(entries[i].authority, entries[i])
	}
	require.Equal(t, len(entries), x.len())
	for i, e := range entries {
		require.Same(t, e, x.load(strconv.Itoa(i)))
	}
	assert.Nil(t, x.load("none"))

	// Replacing a key keeps one node for it.
	e := &Entry[state]{authority: "7"}
	x.store("7", e)
	assert.Same(t, e, x.load("7"))
	assert.Equal(t, len(entries), x.len())

	// A key is deleted only for the entry it maps to.
	x.compareAndDelete("7", entries[7])
	assert.Same(t, e, x.load("7"))
	x.compareAndDelete("7", e)
	assert.Nil(t, x.load("7"))
	for i := range entries {
		if i != 7 && i%3 == 0 {
			x.compareAndDelete(strconv.Itoa(i), entries[i])
		}
	}
	for i, e := range entries {
		switch {
		case i == 7 || i%3 == 0:
			assert.Nil(t, x.load(strconv.Itoa(i)), "key %d", i)
		default:
			assert.Same(t, e, x.load(strconv.Itoa(i)), "key %d", i)
		}
	}
	assert.Equal(t, len(entries)-1-334, x.len())
}

// TestIndexReadsWhileChanging: lookups without a lock find every key that
// stays while others come and go and the table grows.
func TestIndexReadsWhileChanging(t *testing.T) {
	x := newIndex[state]()
	var mu sync.Mutex // the registry's mu
	stay := make([]*Entry[state], 64)
	for i := range stay {
		stay[i] = &Entry[state]{authority: "stay" + strconv.Itoa(i)}
		x.store(stay[i].authority, stay[i])
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				for _, e := range stay {
					if got := x.load(e.authority); got != e {
						t.Errorf("load(%s) = %v", e.authority, got)
						return
					}
				}
			}
		}()
	}
	for i := range 20000 {
		mu.Lock()
		k := "churn" + strconv.Itoa(i)
		x.store(k, &Entry[state]{authority: k})
		if i%2 == 1 {
			x.compareAndDelete("churn"+strconv.Itoa(i-1), x.load("churn"+strconv.Itoa(i-1)))
		}
		mu.Unlock()
	}
	close(done)
	wg.Wait()
	assert.Equal(t, len(stay)+10000, x.len())
}

func TestGetAllocatesNothing(t *testing.T) {
	r := New(newState, func(*Entry[state]) (func(), error) { return func() {}, nil }, WithIdleTimeout(time.Hour))
	defer r.Close()
	key := "books.default.svc.cluster.local:7000"
	r.Get(key)
	allocs := testing.AllocsPerRun(1000, func() {
		if r.Get(key) == nil {
			t.Fatal("no entry")
		}
	})
	assert.Zero(t, allocs)
}

func TestNames(t *testing.T) {
	n := NewNames(2)
	assert.True(t, n.Admit("a"))
	assert.True(t, n.Admit("b"))
	assert.False(t, n.Admit("c"))
	assert.True(t, n.Admit("a"), "admitted names stay admitted")
	assert.Equal(t, 2, n.Len())
	assert.False(t, NewNames(0).Admit("a"))
}

func BenchmarkGet(b *testing.B) {
	r := New(newState, nil)
	key := "books.default.svc.cluster.local:7000"
	r.Get(key)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Get(key)
		}
	})
}

// TestEntryBytes bounds what an entry costs the registry beyond its
// state and its key: a proxy keeps an entry in each of four registries for
// each of the 10,000 names it may watch.
func TestEntryBytes(t *testing.T) {
	const n = 10000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("svc-%d.table.svc.cluster.local:80", i)
	}
	st := &state{}
	// What the registry allocates, the least of a few tries: other
	// goroutines can only add to the count. It includes what growing its
	// tables left behind.
	perEntry := math.Inf(1)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		r := New(func(string) *state { return st }, nil, WithMaxEntries(n))
		for _, k := range keys {
			require.NotNil(t, r.Get(k))
		}
		runtime.ReadMemStats(&after)
		require.Equal(t, n, r.Len())
		perEntry = min(perEntry, float64(after.TotalAlloc-before.TotalAlloc)/n)
		r.Close()
	}
	t.Logf("%.0f bytes an entry", perEntry)
	assert.LessOrEqual(t, perEntry, 460.0)
}
