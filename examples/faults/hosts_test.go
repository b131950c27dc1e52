package faults

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A flood of distinct Hosts through proxy A's outbound listener (IP
// literals on 127.0.0.0/8 whose port nothing listens on: each falls back
// to its own address and is refused on loopback, no DNS). IP literals are
// outside the proxy's search path, so the flood opens no control-plane
// watch; the proxy's memory stays within the bound its authority limit
// sets, and a service first used afterwards gets its profile.
//
// The proxy is run with the bounds an operator would set for a small
// sidecar: 1,000 authorities and watches, a 2 s idle timeout, and a Go
// memory limit (GOMEMLIMIT, as for a container): what is measured is the
// state the proxy keeps, not garbage the collector has not reached yet
// (without the limit the RSS of a process allocating this fast runs to
// several times its live heap). Kept state past the limit would show as
// growth all the same.
func TestHostFlood(t *testing.T) {
	hosts := size(100000, 12000)
	extra := []string{"-max-authorities", "1000", "-max-watches", "1000", "-idle-timeout", "2s"}
	m := newMeshEnv(t, []string{"GOMEMLIMIT=64MiB"}, extra...)

	base := usageOf(t, m.a.pid(), m.aMetrics)
	hc := client(32)
	defer hc.CloseIdleConnections()
	var next atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * time.Minute)
	start := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(hosts) || time.Now().After(deadline) {
					return
				}
				host := fmt.Sprintf("127.%d.%d.%d:1", 1+i/65536, (i/256)%256, i%256)
				_, _ = send(hc, m.aOut, host, "/")
			}
		}()
	}
	wg.Wait()
	hc.CloseIdleConnections()
	require.False(t, time.Now().After(deadline), "the flood did not finish in time")
	after := usageOf(t, m.a.pid(), m.aMetrics)
	t.Logf("%d Hosts in %v: proxy A %v -> %v", hosts, time.Since(start).Round(time.Millisecond), base, after)
	assert.LessOrEqual(t, after.rssMiB-base.rssMiB, 50.0, "memory growth of proxy A over %d Hosts", hosts)

	// A service first used after the flood: its own profile and
	// endpoint, once the flooded authorities were released.
	const authors = "authors.default.svc.cluster.local:7000"
	writeFile(t, filepath.Join(m.profiles, "authors.yaml"), `apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: authors.default.svc.cluster.local
spec:
  routes:
  - name: GET /authors
    condition: {method: GET, pathRegex: /books/.*}
`)
	writeFile(t, m.endpoints, fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n",
		books, m.bIn, authors, m.bIn))
	waitEndpoint(t, m.dstAddr, authors, m.bIn)
	hc1 := client(1)
	defer hc1.CloseIdleConnections()
	require.Eventually(t, func() bool {
		_, _ = send(hc1, m.aOut, authors, "/books/1")
		_, ok := metricValue(scrape(m.aMetrics), "route_request_total", `rt_route="GET /authors"`)
		return ok
	}, timeout, 100*time.Millisecond, "a service first used after the flood never got its profile")
}

// writeFile replaces path by renaming a complete copy over it.
func writeFile(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(data), 0o644))
	require.NoError(t, os.Rename(tmp, path))
}
