package etcd_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// traffic is a caller sending requests through a proxy's outbound
// listener, one after another from each of its workers, until ended: it
// counts the requests, the failures (an error or a status other than 200)
// and the answers by body.
type traffic struct {
	sent, failed atomic.Int64
	mu           sync.Mutex
	bodies       map[string]int64
	stop         func()
	wg           sync.WaitGroup
}

func startTraffic(t *testing.T, outbound, host string, workers int) *traffic {
	t.Helper()
	tr := &traffic{bodies: make(map[string]int64)}
	ctx, stop := context.WithCancel(context.Background())
	tr.stop = stop
	client := &http.Client{Timeout: 10 * time.Second}
	for range workers {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequest("GET", "http://"+outbound+"/books/1", nil)
				req.Host = host
				tr.sent.Add(1)
				resp, err := client.Do(req)
				if err != nil {
					tr.failed.Add(1)
					t.Logf("request failed: %v", err)
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					tr.failed.Add(1)
					t.Logf("request answered %d: %s", resp.StatusCode, body)
					continue
				}
				tr.mu.Lock()
				tr.bodies[string(body)]++
				tr.mu.Unlock()
			}
		}()
	}
	t.Cleanup(tr.end)
	return tr
}

// saw reports whether an answer had body b.
func (tr *traffic) saw(b string) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.bodies[b] > 0
}

// flows waits until n more requests were sent.
func (tr *traffic) flows(t *testing.T, n int64, what string) {
	t.Helper()
	from := tr.sent.Load()
	require.Eventually(t, func() bool { return tr.sent.Load() >= from+n }, timeout, time.Millisecond, what)
}

// end stops the workers and waits for their last requests.
func (tr *traffic) end() {
	tr.stop()
	tr.wg.Wait()
}

// newApp starts an HTTP server that answers every request with its name,
// and returns its address.
func newApp(t *testing.T, name string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) }))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// waitReady waits until a proxy's admin listener answers /ready.
func waitReady(t *testing.T, metrics string) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + metrics + "/ready")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	}, timeout, 20*time.Millisecond)
}

// curlBooks sends one request for the books service through a proxy's
// outbound listener with curl, and returns the body.
func curlBooks(t *testing.T, outbound string) string {
	t.Helper()
	got, err := exec.Command("curl", "-sS", "--fail", "--max-time", "10", "-H", "Host: books.default.svc.cluster.local:7000",
		"http://"+outbound+"/books/1").CombinedOutput()
	require.NoError(t, err, "%s", got)
	return string(got)
}

// needCurl skips the test without curl, and fails it in CI.
func needCurl(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("curl is not installed")
		}
		t.Skip("curl is not installed")
	}
}

// applyBooks writes the books manifests and the endpoints addrs of the
// books service to etcd with `destination apply`, as a user does, trying
// again while it fails (etcd elects a new leader after its leader died).
func applyBooks(t *testing.T, bin, etcdEndpoints string, addrs ...string) {
	t.Helper()
	yaml := "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n"
	for _, a := range addrs {
		yaml += "  - addr: " + a + "\n"
	}
	eps := filepath.Join(t.TempDir(), "endpoints.yaml")
	require.NoError(t, os.WriteFile(eps, []byte(yaml), 0o644))
	var out []byte
	require.Eventually(t, func() bool {
		var err error
		out, err = exec.Command(filepath.Join(bin, "destination"), "apply", "-etcd-endpoints", etcdEndpoints,
			"-f", "../mesh/books.yaml", "-endpoints", eps).CombinedOutput()
		if err != nil {
			t.Logf("apply: %v: %s", err, out)
		}
		return err == nil
	}, 2*timeout, 100*time.Millisecond, "apply: %s", out)
}
