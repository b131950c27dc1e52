package etcd_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// examples/proxy -destination a,b over two examples/destination replicas
// on one etcd: the replica the proxy uses is killed (SIGKILL) while
// requests flow through the proxy; none fails, and endpoints applied after
// the kill reach the proxy through the other replica.
func TestProxySurvivesAReplica(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("curl is not installed")
		}
		t.Skip("curl is not installed")
	}
	bin := buildExamples(t)
	m := etcdtest.Start(t)
	app := func(name string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) }))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	one, two := app("one"), app("two")
	apply := func(addr string) {
		t.Helper()
		eps := filepath.Join(t.TempDir(), "endpoints.yaml")
		require.NoError(t, os.WriteFile(eps, []byte(fmt.Sprintf("- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: %s\n", addr)), 0o644))
		out, err := exec.Command(filepath.Join(bin, "destination"), "apply", "-etcd-endpoints", m.Endpoint,
			"-f", "../mesh/books.yaml", "-endpoints", eps).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	apply(one)

	replicaA := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", m.Endpoint)
	replicaB := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", m.Endpoint)
	addrA, addrB := replicaA.waitLog(t, dstAddrRe), replicaB.waitLog(t, dstAddrRe)

	proxy := startProc(t, filepath.Join(bin, "proxy"), "-destination", addrA+","+addrB,
		"-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-app", one, "-metrics", "127.0.0.1:0")
	out, metrics := proxy.waitLog(t, listenRe("outbound")), proxy.waitLog(t, listenRe("metrics"))
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + metrics + "/ready")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	}, timeout, 20*time.Millisecond)
	// The first request, on a fresh process.
	got, err := exec.Command("curl", "-sS", "--max-time", "10", "-H", "Host: books.default.svc.cluster.local:7000",
		"http://"+out+"/books/1").CombinedOutput()
	require.NoError(t, err, "%s", got)
	require.Equal(t, "one", string(got))

	var sent, failed atomic.Int64
	var sawTwo atomic.Bool
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		client := &http.Client{Timeout: 10 * time.Second}
		for ctx.Err() == nil {
			req, _ := http.NewRequest("GET", "http://"+out+"/books/1", nil)
			req.Host = "books.default.svc.cluster.local:7000"
			sent.Add(1)
			resp, err := client.Do(req)
			if err != nil {
				failed.Add(1)
				t.Logf("request failed: %v", err)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				failed.Add(1)
				t.Logf("request answered %d: %s", resp.StatusCode, body)
				continue
			}
			if string(body) == "two" {
				sawTwo.Store(true)
			}
		}
	}()
	defer func() {
		stop()
		wg.Wait()
	}()
	require.Eventually(t, func() bool { return sent.Load() > 20 }, timeout, time.Millisecond)

	// The replica in use (the first of the list) dies.
	require.NoError(t, replicaA.cmd.Process.Signal(syscall.SIGKILL))
	_ = replicaA.cmd.Wait()
	atKill := sent.Load()
	require.Eventually(t, func() bool { return sent.Load() > atKill+20 }, timeout, time.Millisecond, "traffic after the kill")

	start := time.Now()
	apply(two)
	require.Eventually(t, sawTwo.Load, timeout, 5*time.Millisecond, "the endpoints applied after the kill never reached the proxy")
	t.Logf("change after the kill reached the proxy in %v", time.Since(start).Round(time.Millisecond))
	stop()
	wg.Wait()
	assert.Zero(t, failed.Load(), "requests failed out of %d", sent.Load())
	t.Logf("%d requests through the kill, %d failed", sent.Load(), failed.Load())
}
