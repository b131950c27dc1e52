package mailbox

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLatestWins(t *testing.T) {
	block := make(chan struct{})
	var mu sync.Mutex
	var got []int
	first := make(chan struct{})
	m := Start(context.Background(), context.Background(), nil, func(v int) {
		if v == 1 {
			close(first)
			<-block // a slow callback
		}
		mu.Lock()
		got = append(got, v)
		mu.Unlock()
	}, nil)
	m.Offer(1)
	<-first
	for v := 2; v <= 100; v++ {
		m.Offer(v) // never blocks on the slow callback
	}
	close(block)
	assert.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && got[len(got)-1] == 100
	}, 10*time.Second, time.Millisecond)
	m.Stop()
	m.Stop()
	mu.Lock()
	assert.Equal(t, []int{1, 100}, got, "the values the callback had no time for were replaced")
	mu.Unlock()
}

func TestContextEndsIt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	var wg sync.WaitGroup
	Start(context.Background(), ctx, &wg, func(int) {}, func() { close(exited) })
	cancel()
	<-exited
	wg.Wait()
}

func TestEachValueOnce(t *testing.T) {
	var mu sync.Mutex
	var got []int
	m := Start(context.Background(), context.Background(), nil, func(v int) {
		mu.Lock()
		got = append(got, v)
		mu.Unlock()
	}, nil)
	for v := range 1000 {
		m.Offer(v)
	}
	assert.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && got[len(got)-1] == 999
	}, 10*time.Second, time.Millisecond)
	m.Stop()
	for i := 1; i < len(got); i++ {
		assert.Less(t, got[i-1], got[i], "a value was delivered twice or out of order")
	}
}

// An idle mailbox holds no goroutine: thousands of watchers of quiet
// authorities cost no stacks. A value offered starts one, which ends once
// the value is delivered.
func TestIdleMailboxHoldsNoGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	delivered := make(chan int, 1)
	var ms []*Mailbox[int]
	for range 1000 {
		ms = append(ms, Start(context.Background(), context.Background(), nil, func(int) {}, nil))
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before+5, "1,000 idle mailboxes")
	m := Start(context.Background(), context.Background(), nil, func(v int) { delivered <- v }, nil)
	m.Offer(7)
	assert.Equal(t, 7, <-delivered)
	m.Stop()
	for _, m := range ms {
		m.Stop()
	}
}

// Stop called while a delivery runs waits for it; onExit runs once, after
// the last delivery, and nothing is delivered after Stop returned.
func TestStopWaitsForDelivery(t *testing.T) {
	in, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var events []string
	m := Start(context.Background(), context.Background(), nil, func(v int) {
		if v == 1 {
			close(in)
			<-release
		}
		mu.Lock()
		events = append(events, "deliver")
		mu.Unlock()
	}, func() {
		mu.Lock()
		events = append(events, "exit")
		mu.Unlock()
	})
	m.Offer(1)
	<-in
	stopped := make(chan struct{})
	go func() { m.Stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while deliver ran")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-stopped
	m.Offer(3)
	m.Stop()
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"deliver", "exit"}, events)
}

// hookCount is the number of contexts with mailboxes hooked on them.
func hookCount() int {
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	return len(hooks.m)
}

// The mailboxes of one context share one hook on it: ending the context
// ends each of them (with its onExit and the WaitGroup), a mailbox
// stopped before leaves the hook, and the last one to go takes the hook
// off the context. Parent and ctx hook apart.
func TestMailboxesShareTheirContextsHook(t *testing.T) {
	require.Zero(t, hookCount())
	parent, cancelParent := context.WithCancel(context.Background())
	defer cancelParent()
	ctx, cancel := context.WithCancel(context.Background())
	valued := context.WithValue(ctx, valueKey{}, 1) // ctx's Done: the same hook
	var wg sync.WaitGroup
	var exited sync.WaitGroup
	var boxes []*Mailbox[int]
	for i := range 100 {
		exited.Add(1)
		c := ctx
		if i%2 == 1 {
			c = valued
		}
		boxes = append(boxes, Start(parent, c, &wg, func(int) {}, exited.Done))
	}
	assert.Equal(t, 2, hookCount(), "one hook for parent, one for ctx")
	for _, m := range boxes[:10] {
		m.Stop()
	}
	hooks.mu.Lock()
	assert.Len(t, hooks.m[ctx.Done()].boxes, 90)
	hooks.mu.Unlock()
	cancel()
	exited.Wait()
	wg.Wait()
	for _, m := range boxes {
		m.Stop() // ended: it returns at once
	}
	require.Zero(t, hookCount(), "the last mailbox of parent took its hook off")

	// A context already done ends the mailbox at once.
	exited.Add(1)
	Start(context.Background(), ctx, &wg, func(int) {}, exited.Done)
	exited.Wait()
	wg.Wait()
	require.Zero(t, hookCount())
}

// An idle mailbox holds no channel until a Stop has to wait.
func TestStopOfAFinishedMailboxMakesNoChannel(t *testing.T) {
	m := Start(context.Background(), context.Background(), nil, func(int) {}, nil)
	m.Stop()
	assert.Nil(t, m.done)
	assert.True(t, m.finished)
}

type valueKey struct{}

// owner records the mailboxes it is told finished.
type owner struct {
	mu       sync.Mutex
	finished []*Mailbox[int]
}

func (o *owner) MailboxFinished(m *Mailbox[int]) {
	o.mu.Lock()
	o.finished = append(o.finished, m)
	o.mu.Unlock()
}

// TestOwnerToldWhichFinished checks that the owner of several mailboxes
// is told of each one's end, once, whether Stop or its context ended it,
// before Stop returns.
func TestOwnerToldWhichFinished(t *testing.T) {
	o := new(owner)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stopped := StartOwned(context.Background(), context.Background(), &wg, func(int) {}, o)
	cancelled := StartOwned(context.Background(), ctx, &wg, func(int) {}, o)
	stopped.Stop()
	o.mu.Lock()
	assert.Equal(t, []*Mailbox[int]{stopped}, o.finished, "before Stop returns")
	o.mu.Unlock()
	cancel()
	wg.Wait()
	stopped.Stop()
	cancelled.Stop()
	o.mu.Lock()
	defer o.mu.Unlock()
	assert.Equal(t, []*Mailbox[int]{stopped, cancelled}, o.finished)
}
