// Package faults runs the examples as separate processes on loopback (a
// control plane, two proxies, the books application) and puts them under
// faults and load: control-plane restarts and flapping, h2load at both
// listeners, rapid stream resets and bursts of streams, a flood of distinct
// Hosts, gRPC streams opened and cancelled by the thousand. Some run the library's stacks in
// the test process instead (inproc_test.go), where its own goroutines and
// heap are measured: a TLS handshake flood at a meshed port, a flood of
// requests an inbound policy refuses, the control plane restarted while
// certificates are due for renewal; a replicated control plane over a
// three-member etcd cluster losing a replica and its etcd member under
// load (fleet_test.go); a flood of registrants past the Registration
// API's limits, and forged registrations (another identity, a Service not
// bound to the caller, a certificate of another trust root), alone and in
// a flood (registration_test.go); tap viewers that read nothing
// (tap_test.go); a dashboard read by many under traffic, and refused to a
// client not on loopback (dashboard_test.go); hedging and mirroring on a
// route whose backends fail, reset or are gone (hedgemirror_test.go).
//
// By default each test runs a short version (a few seconds each);
// INMESH_FULL=1 runs the full sizes (see run-full.sh).
package faults

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/examples/internal/booksapp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

const (
	books   = "books.default.svc.cluster.local:7000"
	timeout = 30 * time.Second
)

// bin is where TestMain built the example binaries.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "inmesh-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, name := range []string{"destination", "proxy"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, name), "../"+name).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", name, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	bin = dir
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { os.RemoveAll(dir) }))
}

// full reports whether the full sizes were asked for.
func full() bool { return os.Getenv("INMESH_FULL") != "" }

// size returns the full or the short figure.
func size(fullN, shortN int) int {
	if full() {
		return fullN
	}
	return shortN
}

// need skips the test when a tool is missing, and fails it under CI.
func need(t *testing.T, tool string) {
	if _, err := exec.LookPath(tool); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed", tool)
		}
		t.Skipf("%s is not installed", tool)
	}
}

type proc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	logs   bytes.Buffer
	addrs  map[string]string // listener name -> address, from the logs
	exited chan struct{}
	err    error
}

var listenLine = regexp.MustCompile(`(?:listener=(\w+) )?addr=(127\.0\.0\.1:\d+)`)

// start runs bin with args; the addresses it logs as listening are read
// from its output.
func start(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(filepath.Join(bin, name), args...), addrs: map[string]string{}, exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	require.NoError(t, p.cmd.Start())
	go func() {
		s := bufio.NewScanner(r)
		for s.Scan() {
			line := s.Text()
			p.mu.Lock()
			if p.logs.Len() < 1<<20 {
				p.logs.WriteString(line + "\n")
			}
			if m := listenLine.FindStringSubmatch(line); m != nil && strings.Contains(line, "msg=") {
				key := m[1]
				if key == "" {
					key = "grpc"
				}
				p.addrs[key] = m[2]
			}
			p.mu.Unlock()
		}
	}()
	go func() {
		p.err = p.cmd.Wait()
		w.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			p.mu.Lock()
			t.Logf("%s logs (first MiB):\n%s", name, p.logs.String())
			p.mu.Unlock()
		}
	})
	return p
}

// addr waits for the process to log the address of listener.
func (p *proc) addr(t *testing.T, listener string) string {
	t.Helper()
	var a string
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		a = p.addrs[listener]
		return a != ""
	}, timeout, 10*time.Millisecond, "no %s address logged", listener)
	return a
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// term sends SIGTERM and reports whether the process exited within d (it
// is killed otherwise).
func (p *proc) term(d time.Duration) bool {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return true
	case <-time.After(d):
		p.kill()
		return false
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// mesh is the examples wired as a meshed deployment: the books app served
// by this test process, a control plane, proxy B in front of the app and
// proxy A whose outbound listener the test sends to.
type mesh struct {
	dir, profiles, endpoints string
	dstArgs                  []string
	dstAddr                  string
	dst, a, b                *proc
	aOut, aMetrics           string
	bIn, bMetrics            string
	app                      *http.Server
}

func newMesh(t *testing.T) *mesh { return newMeshWith(t) }

// newMeshWith starts the mesh with extra flags for both proxies.
func newMeshWith(t *testing.T, proxyFlags ...string) *mesh {
	t.Helper()
	return newMeshEnv(t, nil, proxyFlags...)
}

// newMeshEnv is newMeshWith with more environment for the proxies.
func newMeshEnv(t *testing.T, proxyEnv []string, proxyFlags ...string) *mesh {
	t.Helper()
	m := &mesh{dir: t.TempDir()}
	m.profiles = filepath.Join(m.dir, "profiles")
	require.NoError(t, os.Mkdir(m.profiles, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(m.profiles, "books.yaml"), []byte(booksProfile), 0o644))
	m.endpoints = filepath.Join(m.dir, "endpoints.yaml")
	// The control plane starts before proxy B's address is known: a
	// placeholder authority until then.
	require.NoError(t, os.WriteFile(m.endpoints, []byte("- authority: placeholder.default.svc.cluster.local:80\n  endpoints: []\n"), 0o644))

	appLis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m.app = &http.Server{Handler: booksapp.Handler(5 * time.Second), ReadHeaderTimeout: 10 * time.Second}
	go m.app.Serve(appLis)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = m.app.Shutdown(ctx)
	})

	m.dstArgs = []string{"-profiles", m.profiles, "-endpoints", m.endpoints, "-interval", "100ms"}
	m.dst = start(t, "destination", nil, append([]string{"-listen", "127.0.0.1:0"}, m.dstArgs...)...)
	m.dstAddr = m.dst.addr(t, "grpc")
	env := append([]string{"INMESH_CONTROL_BACKOFF_DELAY=100ms"}, proxyEnv...)
	proxy := func() *proc {
		return start(t, "proxy", env, append([]string{"-destination", m.dstAddr, "-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0",
			"-metrics", "127.0.0.1:0", "-app", appLis.Addr().String()}, proxyFlags...)...)
	}
	m.b = proxy()
	m.bIn, m.bMetrics = m.b.addr(t, "inbound"), m.b.addr(t, "metrics")
	m.a = proxy()
	m.aOut, m.aMetrics = m.a.addr(t, "outbound"), m.a.addr(t, "metrics")
	writeFile(t, m.endpoints, fmt.Sprintf(
		"- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n    labels: {pod: books-0}\n", books, m.bIn))
	// Nothing is sent for books before the control plane names its
	// endpoint: a proxy would otherwise fall back to the name itself, a
	// DNS lookup.
	waitEndpoint(t, m.dstAddr, books, m.bIn)

	// Ready when a request through A reaches the app over B with the
	// profile's route.
	hc := client(4)
	defer hc.CloseIdleConnections()
	require.Eventually(t, func() bool {
		resp, err := send(hc, m.aOut, books, "/books/1")
		if err != nil || resp.StatusCode != 200 {
			return false
		}
		return strings.Contains(scrape(m.aMetrics), `rt_route="GET /books/{id}"`) &&
			strings.Contains(scrape(m.bMetrics), `direction="inbound"`)
	}, timeout, 50*time.Millisecond, "the mesh never became ready")
	return m
}

// waitEndpoint waits until the control plane at dstAddr serves addr as an
// endpoint of authority.
func waitEndpoint(t *testing.T, dstAddr, authority, addr string) {
	t.Helper()
	dc, err := destination.Dial(dstAddr, destination.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	defer dc.Close()
	found := make(chan struct{})
	var once sync.Once
	stop, err := dc.WatchEndpoints(context.Background(), authority, func(u endpoint.Update) {
		if u.Set == nil {
			return
		}
		for _, e := range u.Set.Endpoints {
			if e.Addr.String() == addr {
				once.Do(func() { close(found) })
			}
		}
	})
	require.NoError(t, err)
	defer stop()
	select {
	case <-found:
	case <-time.After(timeout):
		t.Fatalf("the control plane never served %s for %s", addr, authority)
	}
}

// restartDestination starts a new control plane on the same address as
// the one that went away, so that the proxies reconnect to it.
func (m *mesh) restartDestination(t *testing.T) {
	t.Helper()
	m.dst = start(t, "destination", nil, append([]string{"-listen", m.dstAddr}, m.dstArgs...)...)
	m.dst.addr(t, "grpc")
}

// profile is books' ServiceProfile, with extra routes (YAML list items)
// after its own.
func profile(extra string) string {
	return `apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: books.default.svc.cluster.local
spec:
  routes:
  - name: GET /books/{id}
    condition: {method: GET, pathRegex: '/books/[^/]+'}
  - name: GET /books
    condition: {method: GET, pathRegex: /books}
` + extra + `  retryBudget: {retryRatio: 0.2, minRetriesPerSecond: 10, ttl: 10s}
`
}

var booksProfile = profile("")

func writeProfile(t *testing.T, m *mesh, yaml string) {
	t.Helper()
	// Written aside and renamed, so that the control plane's poll never
	// reads half a file.
	writeFile(t, filepath.Join(m.profiles, "books.yaml"), yaml)
}

func client(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, DisableCompression: true}, Timeout: 10 * time.Second}
}

type response struct {
	StatusCode int
	ProxyError string
}

// send makes GET path with Host host to addr and drains the answer.
func send(hc *http.Client, addr, host, path string) (response, error) {
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	if err != nil {
		return response{}, err
	}
	req.Host = host
	resp, err := hc.Do(req)
	if err != nil {
		return response{}, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return response{resp.StatusCode, resp.Header.Get("l5d-proxy-error")}, err
}

func scrape(addr string) string {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricValue returns the value of the first sample of name (with every
// label fragment given).
func metricValue(text, name string, labels ...string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if ok {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// usage is what a process holds: resident memory, open fds, threads, and
// goroutines where its /metrics exports go_goroutines (-1 otherwise).
type usage struct {
	rssMiB     float64
	fds        int
	threads    int
	goroutines int
}

func (u usage) String() string {
	g := "n/a"
	if u.goroutines >= 0 {
		g = strconv.Itoa(u.goroutines)
	}
	return fmt.Sprintf("rss %.1f MiB, %d fds, %d threads, goroutines %s", u.rssMiB, u.fds, u.threads, g)
}

func usageOf(t *testing.T, pid int, metricsAddr string) usage {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	u := usage{goroutines: -1}
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			kb, _ := strconv.ParseFloat(f[1], 64)
			u.rssMiB = kb / 1024
		case "Threads:":
			u.threads, _ = strconv.Atoi(f[1])
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	require.NoError(t, err)
	u.fds = len(fds)
	if v, ok := metricValue(scrape(metricsAddr), "go_goroutines"); ok {
		u.goroutines = int(v)
	}
	return u
}
