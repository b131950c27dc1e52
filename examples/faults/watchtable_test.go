package faults

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/router"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A full table of watches at the default bound: Hosts inside the proxy's
// search path (-search-networks covering them), each an authority whose
// profile, endpoints and policy the proxy watches on the control plane.
// With the table full, the proxy and the control plane each stay within
// 256 MiB of RSS; a second pass of as many new names, past the bound,
// keeps them there and grows neither much (the table plateaus).
func TestWatchTableFits(t *testing.T) {
	n := destination.DefaultMaxWatches
	require.Equal(t, router.DefaultMaxAuthorities, n, "one default bound")
	// A memory limit, as a container's, so that what is measured is the
	// state the proxy keeps rather than garbage not yet collected.
	m := newMeshEnv(t, []string{"GOMEMLIMIT=200MiB"}, "-search-networks", "127.0.0.0/8")
	fill := func(from int) {
		hc := client(32)
		defer hc.CloseIdleConnections()
		var next atomic.Int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(5 * time.Minute)
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int64(from) + next.Add(1) - 1
					if i >= int64(from+n) || time.Now().After(deadline) {
						return
					}
					host := fmt.Sprintf("127.%d.%d.%d:1", 1+i/65536, (i/256)%256, i%256)
					_, _ = send(hc, m.aOut, host, "/")
				}
			}()
		}
		wg.Wait()
		require.False(t, time.Now().After(deadline), "the pass did not finish in time")
	}
	proxyBase, cpBase := usageOf(t, m.a.pid(), m.aMetrics), rssOf(t, m.dst.pid())
	fill(0)
	proxyFull, cpFull := usageOf(t, m.a.pid(), m.aMetrics), rssOf(t, m.dst.pid())
	fill(n)
	proxyAgain, cpAgain := usageOf(t, m.a.pid(), m.aMetrics), rssOf(t, m.dst.pid())
	perProxy := (proxyFull.rssMiB - proxyBase.rssMiB) / float64(n)
	perCP := (cpFull - cpBase) / float64(n)
	t.Logf("%d authorities: proxy %v -> %v -> %v (%.1f KiB each); control plane rss %.1f -> %.1f -> %.1f MiB (%.1f KiB each)",
		n, proxyBase, proxyFull, proxyAgain, perProxy*1024, cpBase, cpFull, cpAgain, perCP*1024)
	for _, rss := range []float64{proxyFull.rssMiB, proxyAgain.rssMiB} {
		assert.Less(t, rss, 256.0, "the proxy's RSS with a full table of %d authorities", n)
	}
	for _, rss := range []float64{cpFull, cpAgain} {
		assert.Less(t, rss, 256.0, "the control plane's RSS with a full table of %d authorities", n)
	}
	// The second pass's growth is the garbage of its churn under the
	// memory limit, not table state (the goroutines stay put); its
	// allowance does not shrink as the table gets cheaper (+45 MiB over a
	// 123 MiB table with a stream per watch, +40 MiB over a 72 MiB table
	// over the Watches service).
	assert.Less(t, proxyAgain.rssMiB-proxyFull.rssMiB, max(0.25*(proxyFull.rssMiB-proxyBase.rssMiB)+16, 48), "the proxy's table plateaus")
	if proxyFull.goroutines >= 0 && proxyAgain.goroutines >= 0 {
		assert.LessOrEqual(t, proxyAgain.goroutines, proxyFull.goroutines+n/20, "the proxy's goroutines plateau")
	}
	assert.Less(t, cpAgain-cpFull, 0.25*(cpFull-cpBase)+16, "the control plane's table plateaus")
}

// rssOf returns a process's resident memory in MiB.
func rssOf(t *testing.T, pid int) float64 {
	return usageOf(t, pid, "127.0.0.1:0").rssMiB
}
