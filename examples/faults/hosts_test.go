package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// proxyFlag returns the name of the first flag of the proxy binary whose
// name matches re, or "".
func proxyFlag(t *testing.T, re string) string {
	out, _ := exec.Command(filepath.Join(bin, "proxy"), "-h").CombinedOutput()
	m := regexp.MustCompile(`(?m)^\s+-(` + re + `)\b`).FindSubmatch(out)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// A flood of distinct Hosts through proxy A's outbound listener (IP
// literals on 127.0.0.0/8 whose port nothing listens on: each falls back
// to its own address and is refused on loopback, no DNS): the proxy's
// memory stays bounded, and once the flooded authorities have been idle
// their watches are released, so that a service first used afterwards
// gets its profile.
//
// It needs the proxy to take an idle timeout for unused authorities (a
// flag with "idle" in its name), so that the release is seen in seconds;
// a cap on the watches (a flag naming "watches") keeps the short version
// small.
func TestHostFlood(t *testing.T) {
	idle := proxyFlag(t, `[\w-]*idle[\w-]*`)
	if idle == "" {
		t.Skip("the proxy has no idle-timeout flag for unused authorities yet (the authority registry); nothing to release in a test's time")
	}
	capFlag := proxyFlag(t, `[\w-]*watches[\w-]*`)
	hosts := size(100000, 12000)
	var extra []string
	if capFlag != "" && !full() {
		extra = append(extra, "-"+capFlag, "1000")
		hosts = 3000
	}
	extra = append(extra, "-"+idle, "2s")
	m := newMeshWith(t, extra...)

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
