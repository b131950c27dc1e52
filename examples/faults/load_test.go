package faults

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	h2loadRequests = regexp.MustCompile(`requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout`)
	h2loadStatus   = regexp.MustCompile(`status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx`)
)

// h2load runs h2load with args and checks that all n requests succeeded
// with a 2xx.
func h2load(t *testing.T, n int, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args = append([]string{"-n", strconv.Itoa(n)}, args...)
	start := time.Now()
	out, err := exec.CommandContext(ctx, "h2load", args...).CombinedOutput()
	require.NoError(t, err, "h2load %v:\n%s", args, out)
	t.Logf("h2load %v: %v", args, time.Since(start).Round(time.Millisecond))
	req := h2loadRequests.FindSubmatch(out)
	st := h2loadStatus.FindSubmatch(out)
	require.NotNil(t, req, "h2load output:\n%s", out)
	require.NotNil(t, st, "h2load output:\n%s", out)
	num := func(b []byte) int { v, _ := strconv.Atoi(string(b)); return v }
	assert.Equal(t, n, num(req[4]), "succeeded:\n%s", out)
	assert.Zero(t, num(req[5]), "failed:\n%s", out)
	assert.Zero(t, num(req[6]), "errored:\n%s", out)
	assert.Zero(t, num(req[7]), "timed out:\n%s", out)
	assert.Equal(t, n, num(st[1]), "2xx:\n%s", out)
}

// h2load at both listeners of the proxy pair, every request answered 2xx:
// HTTP/2 with 20 streams on each of 50 connections at proxy B's downgrade
// listener (as a peer proxy sends upgraded requests), and HTTP/1 from 50
// connections through proxy A's outbound listener, over the upgraded hop.
func TestH2Load(t *testing.T) {
	need(t, "h2load")
	m := newMesh(t)
	n := size(100000, 10000)
	t.Run("downgrade listener h2", func(t *testing.T) {
		h2load(t, n, "-c", "50", "-m", "20", "-H", ":authority: "+books, "-H", "l5d-orig-proto: HTTP/1.1",
			"http://"+m.bIn+"/books/1")
	})
	t.Run("outbound listener h1", func(t *testing.T) {
		h2load(t, n, "--h1", "-c", "50", "-H", ":authority: "+books, "http://"+m.aOut+"/books/1")
	})
}
