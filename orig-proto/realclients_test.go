package origproto

import (
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tool finds a real client on PATH. In CI (.ci/run installs them) a missing
// tool is a failure; elsewhere the test is skipped.
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed", name)
		}
		t.Skipf("%s is not installed", name)
	}
	return path
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %v:\n%s", name, args, out)
	return string(out)
}

func TestCurl(t *testing.T) {
	curl := tool(t, "curl")
	m := newMesh(t)
	base := []string{"-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code} %{http_version}"}
	t.Run("http1.0", func(t *testing.T) {
		out := run(t, curl, append(base, "--http1.0", "-D", "-", m.outbound.URL+"/ten")...)
		assert.True(t, strings.HasPrefix(out, "HTTP/1.0 200"), out)
		assert.Equal(t, "HTTP/1.0", m.app.last(t).Proto)
	})
	t.Run("http1.1", func(t *testing.T) {
		out := run(t, curl, append(base, "--http1.1", m.outbound.URL+"/eleven")...)
		assert.True(t, strings.HasSuffix(out, "200 1.1"), out)
		assert.Contains(t, out, "hello from /eleven")
		assert.Equal(t, "HTTP/1.1", m.app.last(t).Proto)
	})
	t.Run("absolute-form", func(t *testing.T) {
		out := run(t, curl, append(base, "--http1.1", "--request-target", "http://books.ns:7000/abs", m.outbound.URL)...)
		assert.True(t, strings.HasSuffix(out, "200 1.1"), out)
		assert.Equal(t, "http://books.ns:7000/abs", m.app.last(t).RequestURI)
	})
	t.Run("chunked upload", func(t *testing.T) {
		data := strings.Repeat("chunk of data\n", 20000)
		file := filepath.Join(t.TempDir(), "upload.bin")
		require.NoError(t, os.WriteFile(file, []byte(data), 0o644))
		out := run(t, curl, append(base, "--http1.1", "-H", "Transfer-Encoding: chunked", "--data-binary", "@"+file, m.outbound.URL+"/echo")...)
		assert.True(t, strings.HasSuffix(out, "200 1.1"), out[len(out)-20:])
		assert.Equal(t, data, m.app.last(t).Body)
		assert.Equal(t, data+"\n200 1.1", out)
	})
	t.Run("connection-listed header removed", func(t *testing.T) {
		run(t, curl, append(base, "--http1.1", "-H", "Connection: X-Secret", "-H", "X-Secret: 1", m.outbound.URL+"/")...)
		assert.Empty(t, m.app.last(t).Header.Get("X-Secret"))
	})
	t.Run("prior knowledge with the header", func(t *testing.T) {
		out := run(t, curl, append(base, "--http2-prior-knowledge", "-H", "l5d-orig-proto: HTTP/1.1", "-D", "-", m.inbound.URL+"/pk")...)
		assert.True(t, strings.HasSuffix(out, "200 2"), out)
		assert.Contains(t, strings.ToLower(out), "l5d-orig-proto: http/1.1")
		assert.Equal(t, "HTTP/1.1", m.app.last(t).Proto)
	})
	t.Run("prior knowledge without the header", func(t *testing.T) {
		out := run(t, curl, append(base, "--http2-prior-knowledge", m.inbound.URL+"/plain")...)
		assert.True(t, strings.HasSuffix(out, "200 2"), out)
		assert.Equal(t, "HTTP/2.0", m.app.last(t).Proto, "not downgraded")
	})
	t.Run("prior knowledge with a bad value", func(t *testing.T) {
		out := run(t, curl, append(base, "--http2-prior-knowledge", "-H", "l5d-orig-proto: HTTP/9", m.inbound.URL+"/bad")...)
		assert.True(t, strings.HasSuffix(out, "400 2"), out)
	})
}

func TestNghttp(t *testing.T) {
	nghttp := tool(t, "nghttp")
	m := newMesh(t)
	out := run(t, nghttp, "-v", "-H", "l5d-orig-proto: HTTP/1.0", m.inbound.URL+"/ng")
	assert.Contains(t, out, "l5d-orig-proto: HTTP/1.0")
	assert.Equal(t, "HTTP/1.0", m.app.last(t).Proto)
}

// h2specBaseline are the cases a stock net/http h2c server fails (research
// on this machine, Go 1.26): a mixed listener falls back to HTTP/1 on a bad
// preface, Go allows larger frames, and it answers connection-specific
// headers with a 400 rather than a reset.
var h2specBaseline = []string{"http2/3.5/2", "http2/4.2/3", "http2/6.5.3/1", "http2/6.9.1/3", "http2/8.1.2.2/1", "http2/8.1.2.2/2"}

// h2spec runs h2spec against addr and returns the IDs of the failed cases.
func h2spec(t *testing.T, bin, addr string, specs ...string) []string {
	host, port, _ := net.SplitHostPort(addr)
	report := filepath.Join(t.TempDir(), "h2spec.xml")
	args := append([]string{"-h", host, "-p", port, "-j", report, "-o", "2"}, specs...)
	out, _ := exec.Command(bin, args...).CombinedOutput() // exits 1 when a case fails
	data, err := os.ReadFile(report)
	require.NoError(t, err, "h2spec wrote no report:\n%s", out)
	var suites struct {
		Suites []struct {
			Cases []struct {
				Package string   `xml:"package,attr"`
				Errors  []string `xml:"error"`
				Fails   []string `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	require.NoError(t, xml.Unmarshal(data, &suites))
	var failed []string
	total := 0
	for _, s := range suites.Suites {
		for i, c := range s.Cases {
			total++
			if len(c.Errors)+len(c.Fails) > 0 {
				failed = append(failed, fmt.Sprintf("%s/%d", c.Package, i+1))
			}
		}
	}
	if len(specs) == 0 {
		require.Greater(t, total, 100, "h2spec ran too few cases:\n%s", out)
	}
	return failed
}

// TestH2spec runs h2spec against a bare net/http h2c server and against the
// downgrade listener: the listener fails no case outside the bare server's
// failures and the known baseline.
func TestH2spec(t *testing.T) {
	bin := os.Getenv("H2SPEC")
	if bin == "" {
		bin = tool(t, "h2spec")
	}
	body := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "hello from the app")
	})
	start := func(srv *http.Server) string {
		s := httptest.NewUnstartedServer(nil)
		s.Config = srv
		if srv.ConnContext != nil { // NewServer's, on a guarded listener
			s.Listener = GuardListener(s.Listener)
		}
		s.Start()
		t.Cleanup(s.Close)
		return s.Listener.Addr().String()
	}
	bare := &http.Server{Handler: body, Protocols: new(http.Protocols)}
	bare.Protocols.SetHTTP1(true)
	bare.Protocols.SetUnencryptedHTTP2(true)
	bareFailed := h2spec(t, bin, start(bare))
	oursFailed := h2spec(t, bin, start(NewServer(NewHandler(body))))
	t.Logf("bare net/http h2c fails %v; the downgrade listener fails %v", bareFailed, oursFailed)
	allowed := append(slices.Clone(h2specBaseline), bareFailed...)
	ours := start(NewServer(NewHandler(body)))
	for _, id := range oursFailed {
		if slices.Contains(allowed, id) {
			continue
		}
		// A case outside the baseline must fail every time to count:
		// h2spec's timing-sensitive cases flake on a loaded machine.
		fails := 0
		for range 3 {
			if len(h2spec(t, bin, ours, id)) > 0 {
				fails++
			}
		}
		assert.Less(t, fails, 3, "h2spec case %s fails on the downgrade listener only", id)
	}
}
