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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is the application behind the proxies: it records every
// request it sees, with its body and trailers.
type recorder struct {
	mu   sync.Mutex
	seen []string // "METHOD URI body trailer-X-Sum"
}

func (a *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.seen = append(a.seen, fmt.Sprintf("%s %s %s %s", r.Method, r.URL.Path, body, r.Trailer.Get("X-Sum")))
	a.mu.Unlock()
	io.WriteString(w, "ok")
}

func (a *recorder) requests() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.seen...)
}

// exchange writes raw bytes on a new connection and returns the status of
// every response read until the connection closes.
func exchange(t *testing.T, addr, data string) []int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	go io.WriteString(conn, data)
	br := bufio.NewReader(conn)
	var statuses []int
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return statuses
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
	}
}

// Ambiguous framing is refused at both HTTP/1 listeners of the proxy, with
// 400 and a closed connection; the app never sees a request the proxy did
// not answer. Request trailers reach the app through both hops.
func TestFramingAtProxyListeners(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "books.yaml"), []byte(profile("")), 0o644))

	app := &recorder{}
	appSrv := httptest.NewServer(app)
	t.Cleanup(appSrv.Close)
	appAddr := strings.TrimPrefix(appSrv.URL, "http://")

	// Every listener's port is picked by the kernel and held by its
	// process, which logs it.
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644)) // no authorities until proxy B listens
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0", "-profiles", profiles, "-endpoints", endpoints, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)
	_, _, bIn, bMetrics := startProxy(t, bin, dstAddr, appAddr)
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n", books, bIn)), 0o644))
	dst.waitLog(t, loadedEndpointsRe)
	_, aOut, _, aMetrics := startProxy(t, bin, dstAddr, appAddr)
	for _, addr := range []string{aMetrics, bMetrics} {
		require.Eventually(t, func() bool {
			resp, err := http.Get("http://" + addr + "/ready")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		}, timeout, 20*time.Millisecond)
	}
	host := "Host: " + books + "\r\n"
	require.Eventually(t, func() bool {
		s := exchange(t, aOut, "GET /ready HTTP/1.1\r\n"+host+"Connection: close\r\n\r\n")
		return len(s) == 1 && s[0] == 200
	}, timeout, 50*time.Millisecond, "the outbound proxy never reached the app")

	const smuggled = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
	ambiguous := map[string]string{
		"CL+TE":              "POST /x HTTP/1.1\r\n" + host + "Content-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"TE+CL":              "POST /x HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + smuggled,
		"CL+TE folded":       "POST /x HTTP/1.1\r\n" + host + "Content-Length: 40\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"TE folded":          "POST /x HTTP/1.1\r\n" + host + "Transfer-Encoding: identity\r\n ,chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"TE identity":        "POST /x HTTP/1.1\r\n" + host + "Transfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello" + smuggled,
		"TE gzip, chunked":   "POST /x HTTP/1.1\r\n" + host + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"TE twice":           "POST /x HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"TE on HTTP/1.0":     "POST /x HTTP/1.0\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"two CLs":            "POST /x HTTP/1.1\r\n" + host + "Content-Length: 5\r\nContent-Length: 40\r\n\r\nhello" + smuggled,
		"obs-fold":           "GET /x HTTP/1.1\r\n" + host + "X-Folded: a\r\n b\r\n\r\n" + smuggled,
		"bare LF":            "GET /x HTTP/1.1\r\n" + host + "X-A: 1\nContent-Length: 5\r\n\r\nhello" + smuggled,
		"bare LF chunk size": "POST /x HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n" + smuggled,
		"second request":     "GET /first HTTP/1.1\r\n" + host + "\r\nPOST /x HTTP/1.1\r\n" + host + "Content-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
	}
	for _, listener := range []struct{ name, addr string }{{"outbound", aOut}, {"inbound", bIn}} {
		for name, req := range ambiguous {
			t.Run(listener.name+"/"+name, func(t *testing.T) {
				before := len(app.requests())
				// A marker after the case: answered only if the connection
				// stayed open.
				statuses := exchange(t, listener.addr, req+"GET /marker HTTP/1.1\r\n"+host+"\r\n")
				require.NotEmpty(t, statuses, "no response at all")
				seen := app.requests()[before:]
				if name == "second request" {
					require.Equal(t, 200, statuses[0])
					statuses = statuses[1:]
					require.NotEmpty(t, seen)
					assert.Equal(t, "GET /first  ", seen[0])
					seen = seen[1:]
				}
				assert.GreaterOrEqual(t, statuses[0], 400)
				for _, s := range statuses {
					assert.GreaterOrEqual(t, s, 400, "the connection stayed open after the refusal")
				}
				assert.Empty(t, seen, "the app saw a request the proxy refused")
			})
		}
		t.Run(listener.name+"/trailer", func(t *testing.T) {
			before := len(app.requests())
			statuses := exchange(t, listener.addr, "POST /t HTTP/1.1\r\n"+host+"Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 42\r\n\r\n")
			assert.Equal(t, []int{200}, statuses)
			assert.Equal(t, []string{"POST /t hello 42"}, app.requests()[before:])
		})
	}
}
