// Package e2e runs the examples as separate processes on loopback and
// drives them with curl: a control plane, two proxies and a plain HTTP/1
// application.
package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/examples/internal/booksapp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

const (
	books   = "books.default.svc.cluster.local:7000"
	timeout = 30 * time.Second
)

func profile(extraRoute string) string {
	return `apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: books.default.svc.cluster.local
spec:
  routes:` + extraRoute + `
  - name: GET /books/{id}
    condition: {method: GET, pathRegex: '/books/[^/]+'}
  - name: GET /books
    condition: {method: GET, pathRegex: /books}
  - name: GET /flaky
    condition: {method: GET, pathRegex: /flaky}
    isRetryable: true
  - name: GET /slow
    condition: {method: GET, pathRegex: /slow}
    timeout: 300ms
  retryBudget: {retryRatio: 0.2, minRetriesPerSecond: 10, ttl: 10s}
`
}

// binDir holds the binaries that build compiles, once for all tests.
var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// build compiles the examples once and returns their directory.
func build(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "inmesh-e2e-"); binErr != nil {
			return
		}
		for _, name := range []string{"destination", "proxy", "app", "mesh"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, name), "../"+name)
			if out, err := cmd.CombinedOutput(); err != nil {
				binErr = fmt.Errorf("build %s: %w\n%s", name, err, out)
				return
			}
		}
	})
	require.NoError(t, binErr)
	return binDir
}

type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
}

func start(t *testing.T, bin string, env []string, args ...string) *proc {
	return startIn(t, "", bin, env, args...)
}

// startIn is start with dir as the working directory ("": the test's).
func startIn(t *testing.T, dir, bin string, env []string, args ...string) *proc {
	p := &proc{cmd: exec.Command(bin, args...)}
	p.cmd.Dir = dir
	p.cmd.Env = append(os.Environ(), env...)
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	require.NoError(t, p.cmd.Start())
	go func() {
		s := bufio.NewScanner(r)
		for s.Scan() {
			p.mu.Lock()
			p.logs.WriteString(s.Text() + "\n")
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		p.stop()
		w.Close()
		if t.Failed() {
			p.mu.Lock()
			t.Logf("%s logs:\n%s", filepath.Base(bin), p.logs.String())
			p.mu.Unlock()
		}
	})
	return p
}

func (p *proc) stop() {
	if p.cmd.ProcessState == nil && p.cmd.Process.Signal(syscall.Signal(0)) == nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = p.cmd.Wait()
	}
}

// needCurl skips a test that drives the examples with curl where curl is
// missing, and fails it in CI, where it must be installed.
func needCurl(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("curl is not installed")
		}
		t.Skip("curl is not installed")
	}
}

func curl(t *testing.T, args ...string) (status int, headers, body string) {
	t.Helper()
	full := append([]string{"-sS", "--max-time", "10", "-D", "-", "-w", "\n%{http_code}"}, args...)
	out, err := exec.Command("curl", full...).CombinedOutput()
	require.NoError(t, err, "curl %v: %s", args, out)
	s := string(out)
	i := strings.LastIndexByte(s, '\n')
	status, _ = strconv.Atoi(s[i+1:])
	head, rest, _ := strings.Cut(s[:i], "\r\n\r\n")
	return status, strings.ToLower(head), rest
}

func scrape(t *testing.T, addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func metric(text, name string, labels ...string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if ok {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			return v, true
		}
	}
	return 0, false
}

func TestEndToEnd(t *testing.T) {
	needCurl(t)
	bin := build(t)
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "books.yaml"), []byte(profile("")), 0o644))

	// Every listener's port is picked by the kernel and held by its
	// process, which logs it.
	app := httptest.NewServer(booksapp.Handler(5 * time.Second))
	defer app.Close()
	appAddr := strings.TrimPrefix(app.URL, "http://")
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644)) // no authorities until proxy B listens
	dstArgs := []string{"-profiles", profiles, "-endpoints", endpoints, "-interval", "100ms"}
	dst := start(t, filepath.Join(bin, "destination"), nil, append([]string{"-listen", "127.0.0.1:0"}, dstArgs...)...)
	dstAddr := dst.waitLog(t, dstAddrRe)
	_, _, bIn, bMetrics := startProxy(t, bin, dstAddr, appAddr)
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n    labels: {pod: books-0}\n", books, bIn)), 0o644))
	// Proxy A starts once the control plane knows books: a request sent
	// while it is unknown would fall back to resolving the name.
	dst.waitLog(t, loadedEndpointsRe)
	proxyA, aOut, _, aMetrics := startProxy(t, bin, dstAddr, appAddr)
	for _, addr := range []string{aMetrics, bMetrics} {
		require.Eventually(t, func() bool {
			resp, err := http.Get("http://" + addr + "/ready")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		}, timeout, 20*time.Millisecond)
	}

	get := func(path string) (int, string, string) {
		return curl(t, "-H", "Host: "+books, "http://"+aOut+path)
	}
	// The profile reaches proxy A: its route label shows on the metrics.
	require.Eventually(t, func() bool {
		get("/books/1")
		_, ok := metric(scrape(t, aMetrics), "route_request_total", `rt_route="GET /books/{id}"`, `direction="outbound"`)
		return ok
	}, timeout, 50*time.Millisecond, "the profile never arrived")

	// The admin listener explains the route: the profile's, by first match.
	resp, err := http.Get("http://" + aMetrics + "/routes?authority=" + books + "&method=GET&path=/books/1")
	require.NoError(t, err)
	explained, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Contains(t, string(explained), `"model": "serviceprofile"`)
	assert.Contains(t, string(explained), `"route": "GET /books/{id}"`)

	status, headers, body := get("/books/42")
	assert.Equal(t, 200, status)
	assert.Equal(t, `{"id":"42"}`, body)
	assert.Contains(t, headers, "x-app-proto: http/1.1", "the app sees HTTP/1.1")
	assert.Contains(t, headers, "x-app-l5d-headers: 0", "no l5d-* header reaches the app")
	assert.NotContains(t, headers, "l5d-orig-proto", "nor the client")

	// Retries: the flaky route fails every other call; the client sees 200.
	for range 3 {
		status, _, body = get("/flaky")
		assert.Equal(t, 200, status)
		assert.Equal(t, "recovered", body)
	}
	text := scrape(t, aMetrics)
	failed, _ := metric(text, "route_actual_response_total", `rt_route="GET /flaky"`, `status_code="503"`, `classification="failure"`)
	assert.GreaterOrEqual(t, failed, 3.0, "the failed attempts are counted")
	_, ok := metric(text, "route_response_total", `rt_route="GET /flaky"`, `status_code="200"`)
	assert.True(t, ok)

	// Timeouts: the slow route gives 504 at its timeout.
	status, headers, _ = get("/slow")
	assert.Equal(t, 504, status)
	assert.Contains(t, headers, "l5d-proxy-error")
	text = scrape(t, aMetrics)
	_, ok = metric(text, "route_response_total", `rt_route="GET /slow"`, `classification="failure"`, `error="timeout"`)
	assert.True(t, ok, "timeout recorded")
	_, ok = metric(text, "request_total", `direction="outbound"`, `dst_pod="books-0"`)
	assert.True(t, ok, "endpoint labels on request_total")

	// One h2 connection between the peers carried everything.
	opened, _ := metric(scrape(t, bMetrics), "tcp_open_total", `direction="inbound"`, `peer="src"`)
	assert.Equal(t, 1.0, opened, "connections from proxy A to proxy B")
	// As `linkerd viz edges` reads it: proxy A's connection to B, by the
	// endpoint's labels, still open; and its application's own
	// connections to A's outbound listener.
	text = scrape(t, aMetrics)
	edge, ok := metric(text, "tcp_open_connections", `direction="outbound"`, `peer="dst"`, `dst_pod="books-0"`)
	assert.True(t, ok, "tcp_open_connections of the edge to B")
	assert.Equal(t, 1.0, edge)
	accepted, _ := metric(text, "tcp_open_total", `direction="outbound"`, `peer="src"`, `no_tls_reason="loopback"`)
	assert.GreaterOrEqual(t, accepted, 1.0, "the application's connections to the outbound listener")

	// The balancer's families and its endpoint states are on the admin
	// listener: one endpoint, ready.
	text = scrape(t, aMetrics)
	ready, ok := metric(text, "outbound_http_balancer_endpoints", `endpoint_state="ready"`, `parent_name="books"`, `parent_namespace="default"`, `parent_port="7000"`)
	assert.True(t, ok, "outbound_http_balancer_endpoints on /metrics")
	assert.Equal(t, 1.0, ready)
	_, ok = metric(text, "outbound_http_balancer_queue_requests_total", `parent_name="books"`)
	assert.True(t, ok)
	resp, err = http.Get("http://" + aMetrics + "/endpoints?authority=" + books)
	require.NoError(t, err)
	states, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Contains(t, string(states), `"addr": "`+bIn+`"`)
	assert.Contains(t, string(states), `"state": "ready"`)

	// Editing the profile changes routing without a restart.
	edited := "\n  - name: GET /books/edited\n    condition: {method: GET, pathRegex: /books/edited}"
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "books.yaml"), []byte(profile(edited)), 0o644))
	editedAt := time.Now()
	require.Eventually(t, func() bool {
		get("/books/edited")
		_, ok := metric(scrape(t, aMetrics), "route_request_total", `rt_route="GET /books/edited"`)
		return ok
	}, 2*time.Second, 20*time.Millisecond, "the edit did not take effect within 2s")
	t.Logf("profile edit took effect after %v", time.Since(editedAt).Round(time.Millisecond))

	// The control plane goes away: traffic keeps flowing on what is known.
	dst.stop()
	for range 5 {
		status, _, _ = get("/books/7")
		assert.Equal(t, 200, status)
	}
	// It comes back with a change made while it was down: updates resume.
	later := "\n  - name: GET /books/later\n    condition: {method: GET, pathRegex: /books/later}"
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "books.yaml"), []byte(profile(later)), 0o644))
	// The port was released when the killed process exited; its
	// replacement takes it again.
	start(t, filepath.Join(bin, "destination"), nil, append([]string{"-listen", dstAddr}, dstArgs...)...)
	require.Eventually(t, func() bool {
		get("/books/later")
		_, ok := metric(scrape(t, aMetrics), "route_request_total", `rt_route="GET /books/later"`)
		return ok
	}, timeout, 50*time.Millisecond, "updates did not resume after the control plane came back")

	// SIGTERM: the proxy drains and exits cleanly, within 5s.
	took, err := proxyA.terminate(5 * time.Second)
	require.NoError(t, err)
	t.Logf("proxy exited %v after SIGTERM", took.Round(time.Millisecond))
}

// A bad backoff variable stops the proxy at start-up, naming the variable.
func TestProxyRejectsBadBackoffVariable(t *testing.T) {
	bin := build(t)
	cmd := exec.Command(filepath.Join(bin, "proxy"), "-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-metrics", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "INMESH_CONTROL_BACKOFF_DELAY=5")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "started despite a bad variable:\n%s", out)
	assert.Contains(t, string(out), `INMESH_CONTROL_BACKOFF_DELAY="5" is not a duration`)
}
