package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const uploads = "uploads.default.svc.cluster.local:7000"

const uploadsProfile = `apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: uploads.default.svc.cluster.local
spec:
  routes:
  - name: POST /upload
    condition: {method: POST, pathRegex: /upload}
    isRetryable: true
    timeout: 500ms
  retryBudget: {retryRatio: 0.2, minRetriesPerSecond: 10, ttl: 10s}
`

// addrIn waits for the log line of p that names the address of listener
// (the key=value pairs of slog's text handler) and returns the address.
func addrIn(t *testing.T, p *proc, pattern string) string {
	t.Helper()
	re := regexp.MustCompile(pattern + `.*addr=(\S+)`)
	var addr string
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if m := re.FindStringSubmatch(p.logs.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	}, timeout, 10*time.Millisecond, "no log line matching %q", pattern)
	return addr
}

// A retryable POST under a 500ms route timeout, its chunked body trickled
// over a real socket and never ended, through the proxy: the upstream gets
// the first bytes while the body streams, and the client gets the 504 when
// the timeout fires.
func TestProxyStreamsRequestBodyUnderTimeout(t *testing.T) {
	firstBytes := make(chan string, 16)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 64)
		n, _ := io.ReadAtLeast(r.Body, buf, 5)
		select {
		case firstBytes <- string(buf[:n]):
		default:
		}
		if _, err := io.Copy(io.Discard, r.Body); err == nil {
			io.WriteString(w, "stored")
		}
	}))
	defer upstream.Close()

	bin := build(t)
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "uploads.yaml"), []byte(uploadsProfile), 0o644))
	endpoints := filepath.Join(dir, "endpoints.yaml")
	upAddr := strings.TrimPrefix(upstream.URL, "http://")
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n", uploads, upAddr)), 0o644))

	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0", "-profiles", profiles, "-endpoints", endpoints, "-interval", "100ms")
	dstAddr := addrIn(t, dst, "serving the Destination API")
	proxy := start(t, filepath.Join(bin, "proxy"), []string{"INMESH_CONTROL_BACKOFF_DELAY=100ms"},
		"-destination", dstAddr, "-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-app", "127.0.0.1:1")
	outbound := addrIn(t, proxy, "listener=outbound")
	metricsAddr := addrIn(t, proxy, "listener=metrics")

	// The profile arrives: a whole small upload is routed by it.
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest("POST", "http://"+outbound+"/upload", strings.NewReader("warm-up"))
		req.Host = uploads
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		_, ok := metric(scrape(t, metricsAddr), "route_request_total", `rt_route="POST /upload"`, `direction="outbound"`)
		return ok
	}, timeout, 50*time.Millisecond, "the profile never arrived")
	for len(firstBytes) > 0 {
		<-firstBytes
	}

	conn, err := net.Dial("tcp", outbound)
	require.NoError(t, err)
	defer conn.Close()
	stop := make(chan struct{})
	defer close(stop)
	sent := time.Now()
	_, err = fmt.Fprintf(conn, "POST /upload HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n", uploads)
	require.NoError(t, err)
	go func() { // a byte every 50ms, never the last chunk
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := io.WriteString(conn, "1\r\nx\r\n"); err != nil {
					return
				}
			}
		}
	}()

	type answer struct {
		resp *http.Response
		err  error
		at   time.Time
	}
	answered := make(chan answer, 1)
	go func() {
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		answered <- answer{resp, err, time.Now()}
	}()
	select {
	case first := <-firstBytes:
		assert.True(t, strings.HasPrefix(first, "first"), "upstream got %q", first)
	case a := <-answered:
		t.Fatalf("answered before the upstream saw the body: %+v", a)
	case <-time.After(timeout):
		t.Fatal("the upstream never got the first bytes of a body still streaming")
	}
	a := <-answered
	require.NoError(t, a.err)
	took := a.at.Sub(sent)
	t.Logf("504 through the proxy after %v (route timeout 500ms)", took.Round(time.Millisecond))
	assert.Equal(t, http.StatusGatewayTimeout, a.resp.StatusCode)
	assert.NotEmpty(t, a.resp.Header.Get("l5d-proxy-error"))
	assert.GreaterOrEqual(t, took, 500*time.Millisecond)
	assert.Less(t, took, 600*time.Millisecond, "the 504 goes out when the route timeout fires, the body still arriving")
	require.Eventually(t, func() bool {
		_, ok := metric(scrape(t, metricsAddr), "route_response_total", `rt_route="POST /upload"`, `error="timeout"`)
		return ok
	}, timeout, 20*time.Millisecond, "timeout recorded")
}
