package faults

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tally counts the outcomes of requests sent through the mesh.
type tally struct {
	ok, lost, proxy5xx, other atomic.Int64
	mu                        sync.Mutex
	samples                   []string
}

func (c *tally) record(r response, err error) {
	switch {
	case err != nil:
		c.lost.Add(1)
		c.sample(err.Error())
	case r.StatusCode == 200:
		c.ok.Add(1)
	case r.StatusCode >= 500 && r.ProxyError != "":
		c.proxy5xx.Add(1)
		c.sample(fmt.Sprintf("%d l5d-proxy-error: %s", r.StatusCode, r.ProxyError))
	default:
		c.other.Add(1)
		c.sample(fmt.Sprintf("status %d", r.StatusCode))
	}
}

func (c *tally) sample(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.samples) < 10 {
		c.samples = append(c.samples, s)
	}
}

func (c *tally) check(t *testing.T, total int) {
	t.Helper()
	t.Logf("%d requests: %d ok, %d lost, %d proxy-made 5xx, %d other", total, c.ok.Load(), c.lost.Load(), c.proxy5xx.Load(), c.other.Load())
	assert.Zero(t, c.lost.Load(), "lost requests, e.g. %v", c.samples)
	assert.Zero(t, c.proxy5xx.Load(), "proxy-made 5xx, e.g. %v", c.samples)
	assert.Zero(t, c.other.Load(), "other statuses, e.g. %v", c.samples)
	assert.Equal(t, int64(total), c.ok.Load())
}

// paced sends total requests through proxy A at rate per second from
// workers goroutines, counting the outcomes.
func paced(m *mesh, total, rate, workers int, c *tally) (wait func()) {
	hc := client(workers)
	tokens := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range tokens {
				c.record(send(hc, m.aOut, books, "/books/1"))
			}
		}()
	}
	go func() {
		start := time.Now()
		for i := range total {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
			tokens <- struct{}{}
		}
		close(tokens)
	}()
	return func() {
		wg.Wait()
		hc.CloseIdleConnections()
	}
}

// The control plane is restarted five times, alternately with SIGKILL and
// SIGTERM, and stays down for a while each time, during a steady stream of
// requests through the proxy pair: every request is answered 200 by the
// app, none is lost and none is a 5xx the proxy made.
func TestControlPlaneRestarts(t *testing.T) {
	m := newMesh(t)
	total, rate := size(10000, 3000), size(500, 1000)
	down := time.Duration(size(1000, 200)) * time.Millisecond
	const restarts = 5
	var c tally
	wait := paced(m, total, rate, 8, &c)
	span := time.Duration(total) * time.Second / time.Duration(rate)
	start := time.Now()
	slowTerm := 0
	for i := range restarts {
		time.Sleep(time.Until(start.Add(span * time.Duration(i+1) / (restarts + 1))))
		if i%2 == 0 {
			m.dst.kill()
		} else if !m.dst.term(5 * time.Second) {
			slowTerm++
		}
		time.Sleep(down) // the control plane is away: the fault itself
		m.restartDestination(t)
	}
	wait()
	c.check(t, total)
	assert.Zero(t, slowTerm, "the control plane did not exit within 5 s of SIGTERM")

	// The proxies are attached to the last control plane: a profile
	// change made there is routed.
	edited := profile("  - name: GET /edited\n    condition: {method: GET, pathRegex: /edited}\n")
	writeProfile(t, m, edited)
	hc := client(1)
	defer hc.CloseIdleConnections()
	require.Eventually(t, func() bool {
		_, _ = send(hc, m.aOut, books, "/edited")
		_, ok := metricValue(scrape(m.aMetrics), "route_request_total", `rt_route="GET /edited"`)
		return ok
	}, 10*time.Second, 50*time.Millisecond, "a change on the restarted control plane was not routed")
}

// The control plane goes away and comes back every 500 ms: the proxies
// keep serving, and their memory and open files stay flat.
func TestControlPlaneFlap(t *testing.T) {
	m := newMesh(t)
	dur := time.Duration(size(60, 6)) * time.Second
	var c tally
	rate := 200
	total := int(dur.Seconds()) * rate
	// Warm up, so that pools and caches are at their size, then take the
	// baseline.
	warm := paced(m, 500, 1000, 4, &tally{})
	warm()
	baseA, baseB := usageOf(t, m.a.pid(), m.aMetrics), usageOf(t, m.b.pid(), m.bMetrics)
	t.Logf("baseline: proxy A %v; proxy B %v", baseA, baseB)

	wait := paced(m, total, rate, 4, &c)
	flaps := 0
	for start := time.Now(); time.Since(start) < dur; flaps++ {
		tick := time.Now()
		m.dst.kill()
		time.Sleep(250 * time.Millisecond) // down half of each period
		m.restartDestination(t)
		time.Sleep(time.Until(tick.Add(500 * time.Millisecond)))
		if flaps%10 == 9 {
			t.Logf("after %d flaps: proxy A %v", flaps+1, usageOf(t, m.a.pid(), m.aMetrics))
		}
	}
	wait()
	t.Logf("%d flaps in %v", flaps, dur)
	c.check(t, total)

	flat := func(base, now usage) bool {
		return now.rssMiB <= base.rssMiB+20 && now.fds <= base.fds+10 &&
			(base.goroutines < 0 || now.goroutines <= base.goroutines+20)
	}
	var a, b usage
	assert.Eventually(t, func() bool {
		a, b = usageOf(t, m.a.pid(), m.aMetrics), usageOf(t, m.b.pid(), m.bMetrics)
		return flat(baseA, a) && flat(baseB, b)
	}, 10*time.Second, 200*time.Millisecond, "not flat: proxy A %v (baseline %v); proxy B %v (baseline %v)", a, baseA, b, baseB)
	t.Logf("after: proxy A %v; proxy B %v", a, b)
}
