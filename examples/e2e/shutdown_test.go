package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitLog waits until the process has logged a line matching re and returns
// the first submatch.
func (p *proc) waitLog(t *testing.T, re *regexp.Regexp) string {
	t.Helper()
	var got string
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if m := re.FindStringSubmatch(p.logs.String()); m != nil {
			got = m[len(m)-1]
			return true
		}
		return false
	}, timeout, 10*time.Millisecond, "no log line matching %s", re)
	return got
}

// terminate sends SIGTERM and returns how long the process took to exit
// cleanly; past limit it kills the process and returns an error.
func (p *proc) terminate(limit time.Duration) (time.Duration, error) {
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			return time.Since(start), fmt.Errorf("exit status after SIGTERM: %w", err)
		}
		return time.Since(start), nil
	case <-time.After(limit):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		return limit, fmt.Errorf("%s did not exit within %v of SIGTERM", filepath.Base(p.cmd.Path), limit)
	}
}

var (
	dstAddrRe         = regexp.MustCompile(`msg="serving the Destination API" addr=(\S+)`)
	loadedEndpointsRe = regexp.MustCompile(`msg="(loaded endpoints)"`)
	listenRe          = func(name string) *regexp.Regexp {
		return regexp.MustCompile(`msg=listening listener=` + name + ` addr=(\S+)`)
	}
)

// startProxy starts a proxy whose listeners the kernel picks, and returns it
// with its outbound, inbound and metrics addresses.
func startProxy(t *testing.T, bin, dstAddr, appAddr string) (p *proc, out, in, metrics string) {
	p = start(t, filepath.Join(bin, "proxy"), []string{"INMESH_CONTROL_BACKOFF_DELAY=100ms"},
		"-destination", dstAddr, "-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-app", appAddr, "-metrics", "127.0.0.1:0")
	return p, p.waitLog(t, listenRe("outbound")), p.waitLog(t, listenRe("inbound")), p.waitLog(t, listenRe("metrics"))
}

// The control plane is stopped with SIGTERM: it exits within 5s, having
// ended its streams. A replacement on the same port (the first process
// chose it, listening on :0, and released it on exit) serves a changed
// profile, which the proxies route by within 3s. Then SIGTERM to a proxy
// with two requests in flight: the one that finishes during the drain
// completes, the one that never ends is cut at the 4s drain bound, and the
// proxy exits within 5s.
func TestSIGTERMControlPlaneRestartAndProxyDrain(t *testing.T) {
	needCurl(t)
	bin := build(t)
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "books.yaml"), []byte(profile("")), 0o644))
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644)) // no authorities yet

	release := make(chan struct{})
	inDrain := make(chan struct{}, 2)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/drain":
			inDrain <- struct{}{}
			<-release
		case "/stuck":
			inDrain <- struct{}{}
			<-r.Context().Done() // answers only when the caller goes away
			return
		}
		fmt.Fprintf(w, "app %s", r.URL.Path)
	}))
	defer app.Close()
	defer close(release)
	appAddr := strings.TrimPrefix(app.URL, "http://")

	dstArgs := []string{"-profiles", profiles, "-endpoints", endpoints, "-interval", "100ms"}
	dst := start(t, filepath.Join(bin, "destination"), nil, append([]string{"-listen", "127.0.0.1:0"}, dstArgs...)...)
	dstAddr := dst.waitLog(t, dstAddrRe)
	_, _, bIn, _ := startProxy(t, bin, dstAddr, appAddr)
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n", books, bIn)), 0o644))
	// Proxy A starts once the control plane knows books: a request sent
	// while it is unknown would fall back to resolving the name.
	dst.waitLog(t, loadedEndpointsRe)
	proxyA, aOut, _, aMetrics := startProxy(t, bin, dstAddr, appAddr)

	get := func(path string) (int, string) {
		status, _, body := curl(t, "-H", "Host: "+books, "http://"+aOut+path)
		return status, body
	}
	routed := func(route string) func() bool {
		return func() bool {
			get("/books/" + route)
			_, ok := metric(scrape(t, aMetrics), "route_request_total", `rt_route="GET /books/`+route+`"`)
			return ok
		}
	}
	require.Eventually(t, func() bool { s, _ := get("/books/1"); return s == 200 }, timeout, 50*time.Millisecond, "never routed to the endpoint")
	first := "\n  - name: GET /books/first\n    condition: {method: GET, pathRegex: /books/first}"
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "books.yaml"), []byte(profile(first)), 0o644))
	require.Eventually(t, routed("first"), timeout, 20*time.Millisecond, "the first profile never arrived")

	// SIGTERM to the control plane: it ends the proxies' streams and exits.
	took, err := dst.terminate(5 * time.Second)
	require.NoError(t, err)
	t.Logf("control plane exited %v after SIGTERM", took.Round(time.Millisecond))
	status, body := get("/books/7")
	assert.Equal(t, 200, status, "traffic flows on the last known state")
	assert.Equal(t, "app /books/7", body)

	// Its replacement, on the same port, with a changed profile.
	changed := "\n  - name: GET /books/restarted\n    condition: {method: GET, pathRegex: /books/restarted}"
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "books.yaml"), []byte(profile(changed)), 0o644))
	startedAt := time.Now()
	dst2 := start(t, filepath.Join(bin, "destination"), nil, append([]string{"-listen", dstAddr}, dstArgs...)...)
	assert.Equal(t, dstAddr, dst2.waitLog(t, dstAddrRe))
	require.Eventually(t, routed("restarted"), 3*time.Second, 20*time.Millisecond, "the replacement's profile was not routed within 3s")
	t.Logf("the replacement's profile was routed %v after it started", time.Since(startedAt).Round(time.Millisecond))

	// SIGTERM to proxy A with two requests in flight: it drains what
	// finishes, cuts what does not at the bound, then exits.
	type exit struct {
		took time.Duration
		err  error
	}
	type result struct {
		status int
		body   string
		err    error
	}
	send := func(path string, to chan<- result) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+aOut+path, nil)
		req.Host = books
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			to <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		to <- result{resp.StatusCode, string(b), err}
	}
	inflight, stuck := make(chan result, 1), make(chan result, 1)
	go send("/drain", inflight)
	go send("/stuck", stuck)
	for range 2 {
		select {
		case <-inDrain:
		case <-time.After(timeout):
			t.Fatal("the requests never reached the app")
		}
	}
	exited := make(chan exit, 1)
	go func() {
		took, err := proxyA.terminate(5 * time.Second)
		exited <- exit{took, err}
	}()
	proxyA.waitLog(t, regexp.MustCompile(`msg="(shutting down)"`))
	release <- struct{}{}
	r := <-inflight
	require.NoError(t, r.err)
	assert.Equal(t, 200, r.status, "the in-flight request was drained")
	assert.Equal(t, "app /drain", r.body)
	e := <-exited
	require.NoError(t, e.err)
	t.Logf("proxy exited %v after SIGTERM, with a request that never ends in flight", e.took.Round(time.Millisecond))
	assert.GreaterOrEqual(t, e.took, 4*time.Second, "the stuck request had its 4s to drain")
	if r := <-stuck; r.err == nil {
		assert.NotEqual(t, "app /stuck", r.body, "the stuck request was cut, not answered")
	}
}
