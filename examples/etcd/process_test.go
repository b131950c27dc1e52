package etcd_test

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
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/examples/internal/booksapp"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/stretchr/testify/require"
)

// proc is a process of the examples, whose output is kept to read the
// addresses its listeners got.
type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
}

func startProc(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...)}
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
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = p.cmd.Wait()
		w.Close()
		if t.Failed() {
			p.mu.Lock()
			t.Logf("%s logs:\n%s", filepath.Base(bin), p.logs.String())
			p.mu.Unlock()
		}
	})
	return p
}

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

var (
	dstAddrRe = regexp.MustCompile(`msg="serving the Destination API" addr=(\S+)`)
	loadedRe  = regexp.MustCompile(`msg="etcd: loaded the control-plane keys"`)
	listenRe  = func(name string) *regexp.Regexp {
		return regexp.MustCompile(`msg=listening listener=` + name + ` addr=(\S+)`)
	}
)

// binDir holds the binaries that buildExamples builds, once for all tests.
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
	os.Exit(code)
}

// buildExamples builds examples/destination and examples/proxy on its first
// call and returns their directory. Every test starts its own processes
// from the same binaries; linking them once per package rather than once
// per test saves seconds of CPU on each test that runs them.
func buildExamples(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "inmesh-etcd-"); binErr != nil {
			return
		}
		for _, name := range []string{"destination", "proxy"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, name), "../"+name).CombinedOutput()
			if err != nil {
				binErr = fmt.Errorf("build %s: %w\n%s", name, err, out)
				return
			}
		}
	})
	require.NoError(t, binErr)
	return binDir
}

// The programs as a user runs them: two examples/destination replicas over
// one etcd, the manifests and endpoints written by `destination apply`,
// and two examples/proxy, each on another replica: the first request
// through the caller's proxy reaches the app through the server's.
func TestProgramsOverEtcd(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("curl is not installed")
		}
		t.Skip("curl is not installed")
	}
	bin := buildExamples(t)
	m := etcdtest.Start(t)
	app := httptest.NewServer(booksapp.Handler(5 * time.Second))
	defer app.Close()
	appAddr := strings.TrimPrefix(app.URL, "http://")

	replicaA := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", m.Endpoint)
	replicaB := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", m.Endpoint)
	addrA, addrB := replicaA.waitLog(t, dstAddrRe), replicaB.waitLog(t, dstAddrRe)

	proxyArgs := func(dst string) []string {
		return []string{"-destination", dst, "-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-app", appAddr, "-metrics", "127.0.0.1:0"}
	}
	server := startProc(t, filepath.Join(bin, "proxy"), proxyArgs(addrA)...)
	serverIn := server.waitLog(t, listenRe("inbound"))

	eps := filepath.Join(t.TempDir(), "endpoints.yaml")
	require.NoError(t, os.WriteFile(eps, []byte(fmt.Sprintf("- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: %s\n    h2: true\n    labels: {pod: books-0}\n", serverIn)), 0o644))
	out, err := exec.Command(filepath.Join(bin, "destination"), "apply", "-etcd-endpoints", m.Endpoint,
		"-f", "../mesh/books.yaml", "-endpoints", eps).CombinedOutput()
	require.NoError(t, err, "%s", out)
	replicaB.waitLog(t, loadedRe)

	caller := startProc(t, filepath.Join(bin, "proxy"), proxyArgs(addrB)...)
	callerOut, callerMetrics := caller.waitLog(t, listenRe("outbound")), caller.waitLog(t, listenRe("metrics"))
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + callerMetrics + "/ready")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	}, timeout, 20*time.Millisecond)
	// The first request, on a fresh process.
	got, err := exec.Command("curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}",
		"-H", "Host: books.default.svc.cluster.local:7000", "http://"+callerOut+"/books/1").CombinedOutput()
	require.NoError(t, err, "%s", got)
	require.Equal(t, "200", string(got))
}
