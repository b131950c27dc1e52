package proxylog

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.b.String()), "\n")
}

func TestErrorHandler(t *testing.T) {
	var out buffer
	l := New(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})), "outbound")
	// An upstream that accepts connections and closes them at once, as a
	// crashing one does.
	hungUp, _ := testutil.AcceptAndClose(t)
	target, _ := url.Parse("http://" + hungUp.String())
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite:      func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport:    tr,
		ErrorHandler: l.ErrorHandler,
		ErrorLog:     l.ErrorLog(),
	}
	proxy := httptest.NewServer(rp)
	defer proxy.Close()

	for range 50 {
		resp, err := http.Get(proxy.URL)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	}
	// Requests their client cancelled, straight into the handler: nobody
	// is there to read an answer; none is written, and the response is
	// aborted, so that net/http sends no 200 of its own either.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 50 {
		w := &writeRecorder{header: http.Header{}}
		assert.PanicsWithValue(t, http.ErrAbortHandler, func() {
			rp.ServeHTTP(w, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
		})
		assert.Zero(t, w.status, "no head for a client that went away")
		assert.Zero(t, w.n, "no body for a client that went away")
	}
	lines := out.lines()
	require.Len(t, lines, 2, "one line per kind of error: %q", lines)
	assert.Contains(t, lines[0], "level=WARN")
	assert.Contains(t, lines[0], "kind=other")
	assert.Contains(t, lines[1], "level=DEBUG")
	assert.Contains(t, lines[1], "cancelled by its client")
}

// writeRecorder records what a handler writes, and whether it wrote a
// head at all (httptest.ResponseRecorder says 200 for none).
type writeRecorder struct {
	header http.Header
	status int
	n      int
}

func (w *writeRecorder) Header() http.Header { return w.header }
func (w *writeRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *writeRecorder) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.n += len(p)
	return len(p), nil
}

func TestKind(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{context.DeadlineExceeded, "timeout"},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, "dial"},
		{errors.New("EOF"), "other"},
		{&identity.IdentityError{Expected: "books.default.serviceaccount.identity.linkerd.cluster.local", Err: identity.ErrWrongName}, "identity"},
	} {
		assert.Equal(t, tc.want, kindOf(tc.err), "%v", tc.err)
	}
}

// A request that failed the server's identity check is answered 502 with
// l5d-proxy-error naming the identity; to a gRPC client, UNAVAILABLE.
func TestErrorHandlerNamesTheIdentityCheck(t *testing.T) {
	l := New(slog.New(slog.NewTextHandler(io.Discard, nil)), "outbound")
	err := &identity.IdentityError{Expected: "books.default.serviceaccount.identity.linkerd.cluster.local", Err: identity.ErrWrongName}
	w := httptest.NewRecorder()
	l.ErrorHandler(w, httptest.NewRequest("GET", "/", nil), err)
	assert.Equal(t, http.StatusBadGateway, w.Code)
	assert.Contains(t, w.Header().Get("L5d-Proxy-Error"), "cannot verify the server as books.default.serviceaccount.identity.linkerd.cluster.local")

	req := httptest.NewRequest("POST", "/pkg.Svc/M", nil)
	req.Header.Set("Content-Type", "application/grpc")
	w = httptest.NewRecorder()
	l.ErrorHandler(w, req, err)
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "14", w.Header().Get("Grpc-Status"))
}

func TestErrorLogKeysByOperation(t *testing.T) {
	var out buffer
	l := New(slog.New(slog.NewTextHandler(&out, nil)), "inbound").ErrorLog()
	for i := range 20 {
		l.Printf("http: TLS handshake error from 127.0.0.%d:1234: EOF", i)
		l.Printf("httputil: ReverseProxy read error during body copy: context canceled")
	}
	lines := out.lines()
	require.Len(t, lines, 1, "%q", lines)
	assert.Contains(t, lines[0], "level=WARN")
	assert.Contains(t, lines[0], "TLS handshake error")
}
