package mailbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
