package profileroute

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// streamUpstream is an upstream for streaming requests and responses. Its
// handlers run full duplex, so that an HTTP/1 response can go out while the
// request body still arrives.
type streamUpstream struct {
	firstBytes chan string   // the first chunk of each /stream request body
	release    chan struct{} // closed by the test to let handlers finish
	mu         sync.Mutex
	bodies     []string // whole request bodies of /early-fail
	calls      int
}

func newStreamUpstream() *streamUpstream {
	return &streamUpstream{firstBytes: make(chan string, 8), release: make(chan struct{})}
}

func (u *streamUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if http.NewResponseController(w).EnableFullDuplex() == nil { // HTTP/2 has no need
		defer r.Body.Close() // golang/go#68560
	}
	u.mu.Lock()
	u.calls++
	u.mu.Unlock()
	switch r.URL.Path {
	case "/stream": // reports the first chunk, then reads until the request ends
		buf := make([]byte, 1024)
		n, _ := r.Body.Read(buf)
		u.firstBytes <- string(buf[:n])
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	case "/early-fail": // fails at the first chunk, then reads the rest
		buf := make([]byte, 1024)
		n, _ := r.Body.Read(buf)
		w.WriteHeader(533)
		w.(http.Flusher).Flush()
		rest, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, string(buf[:n])+string(rest))
		u.mu.Unlock()
	case "/sse": // flushes an event, then waits for the test
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: hello\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-u.release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "data: bye\n\n")
	case "/grpc/stream": // a gRPC message, then waits for the test
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		io.WriteString(w, "message-1")
		w.(http.Flusher).Flush()
		select {
		case <-u.release:
		case <-r.Context().Done():
		}
		w.Header().Set("Grpc-Status", "0")
	default:
		http.NotFound(w, r)
	}
}

func (u *streamUpstream) seen() (int, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls, append([]string(nil), u.bodies...)
}

func newStreamHarness(t *testing.T, mode testutil.Mode, routes ...profiles.Route) (*streamUpstream, *harness) {
	up := newStreamUpstream()
	srv := testutil.NewServer(t, up)
	t.Cleanup(func() { // before the server's close, which waits for the handlers
		select {
		case <-up.release:
		default:
			close(up.release)
		}
	})
	m := testutil.NewMetrics(t)
	src := profiles.NewStaticSource(map[string]*profiles.Profile{testAuthority: profileWith(budget10s, routes...)})
	router := NewRouter(src, WithMeterProvider(m.Provider), WithLogger(quietLogger))
	t.Cleanup(router.Close)
	h := &harness{t: t, up: newUpstream(), url: srv.URL, metrics: m, router: router, source: src,
		client: &http.Client{Transport: router.Transport(testutil.NewTransport(t, mode))}}
	router.destFor(testAuthority) // start the watch
	require.Eventually(t, func() bool { return len(router.Table(testAuthority).Routes()) == len(routes)+1 },
		testutil.Timeout, 5*time.Millisecond)
	return up, h
}

type result struct {
	resp *http.Response
	err  error
	at   time.Time
}

// send starts req and returns where its result arrives.
func (h *harness) send(req *http.Request) <-chan result {
	req.Host = testAuthority
	done := make(chan result, 1)
	go func() {
		resp, err := h.client.Do(req)
		done <- result{resp, err, time.Now()}
	}()
	return done
}

// A retryable POST whose body streams: the upstream gets the first bytes
// while the body is still open, and with a body that never ends the caller
// gets the 504 when the route timeout fires.
func TestStreamingRequestOnRetryableRoute(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		const routeTimeout = 500 * time.Millisecond
		r := retryRoute("/stream")
		r.Timeout = routeTimeout
		up, h := newStreamHarness(t, mode, r)
		pr, pw := io.Pipe()
		defer pw.CloseWithError(errors.New("test over"))
		go func() { _, _ = pw.Write([]byte("first chunk")) }()

		req, err := http.NewRequest("POST", h.url+"/stream", pr)
		require.NoError(t, err)
		sent := time.Now()
		done := h.send(req)
		select {
		case first := <-up.firstBytes:
			assert.Equal(t, "first chunk", first)
		case res := <-done:
			t.Fatalf("the request ended before the upstream saw its body: %+v", res)
		case <-time.After(testutil.Timeout):
			t.Fatal("the upstream never received the first bytes of a body still streaming")
		}

		var res result
		select {
		case res = <-done:
		case <-time.After(testutil.Timeout):
			t.Fatal("no answer while the request body streams on")
		}
		require.NoError(t, res.err)
		res.resp.Body.Close()
		assert.Equal(t, http.StatusGatewayTimeout, res.resp.StatusCode)
		assert.Contains(t, res.resp.Header.Get("l5d-proxy-error"), "timed out")
		// The timer starts after the request was handed to the router, so
		// the time from just before is an upper bound of its delay.
		took := res.at.Sub(sent)
		t.Logf("504 after %v (route timeout %v)", took.Round(time.Millisecond), routeTimeout)
		assert.GreaterOrEqual(t, took, routeTimeout)
		assert.Less(t, took, 600*time.Millisecond, "the 504 comes when the route timeout fires")
		assert.Equal(t, "1", h.metrics.Value(t, "route_response_total", `rt_route="/stream"`, `error="timeout"`))
		assert.Empty(t, h.metrics.Lines(t, "route_response_total", `rt_route="/stream"`, `status_code=`), "a timeout is an error with no status")
	})
}

// A failure that arrives before the request body was read whole is not
// retried (a retry would have to resend bytes the first attempt may still
// be sending); the upstream gets every byte once.
func TestNoRetryBeforeBodyIsRead(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		up, h := newStreamHarness(t, mode, retryRoute("/early-fail"))
		pr, pw := io.Pipe()
		defer pw.CloseWithError(errors.New("test over"))
		go func() { _, _ = pw.Write([]byte("chunk-1;")) }()
		req, err := http.NewRequest("POST", h.url+"/early-fail", pr)
		require.NoError(t, err)
		var res result
		select {
		case res = <-h.send(req):
		case <-time.After(testutil.Timeout):
			t.Fatal("the failure never reached the caller")
		}
		require.NoError(t, res.err)
		assert.Equal(t, 533, res.resp.StatusCode, "not retried")
		defer res.resp.Body.Close()

		// HTTP/1 sends the rest of the body; Go's HTTP/2 transport stops
		// sending it once a failure status arrived.
		want := "chunk-1;chunk-2;"
		if mode == testutil.H2C {
			want = "chunk-1;"
			res.resp.Body.Close() // resets the stream, ending the upstream's read
		} else {
			_, err = pw.Write([]byte("chunk-2;"))
			require.NoError(t, err)
			require.NoError(t, pw.Close())
		}
		require.Eventually(t, func() bool { _, b := up.seen(); return len(b) == 1 }, testutil.Timeout, 5*time.Millisecond)
		calls, bodies := up.seen()
		assert.Equal(t, 1, calls)
		assert.Equal(t, []string{want}, bodies, "each chunk once")
	})
}

// A streamed body that ends within the cap is replayed byte for byte.
func TestPipeBodyReplayed(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		h := newHarness(t, mode, profileWith(budget10s, retryRoute("/0.5")))
		pr, pw := io.Pipe()
		var want bytes.Buffer
		go func() {
			for i := range 40 {
				chunk := bytes.Repeat([]byte{byte('a' + i%26)}, 1000+i)
				want.Write(chunk)
				_, _ = pw.Write(chunk)
			}
			pw.Close()
		}()
		status, body := h.do("POST", "/0.5", pr)
		assert.Equal(t, 200, status)
		assert.Equal(t, "retried", body)
		seen := h.up.seen("/0.5")
		require.Len(t, seen, 2)
		assert.Equal(t, want.String(), seen[0], "the first attempt got the body whole")
		assert.Equal(t, seen[0], seen[1], "the replay is byte-identical")
	})
}

// Responses with data go to the caller at once, even on a retryable route
// whose classes or gRPC status wait on trailers.
func TestStreamingResponseNotHeld(t *testing.T) {
	sse := retryRoute("/sse")
	sse.ResponseClasses = []profiles.ResponseClass{{Condition: profiles.StatusRange{Min: 500, Max: 599}, IsFailure: true}}
	cases := []struct {
		name, path, first string
		grpc              bool
	}{
		{"server-sent events", "/sse", "data: hello\n\n", false},
		{"grpc server stream", "/grpc/stream", "message-1", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
				up, h := newStreamHarness(t, mode, sse, retryRoute("/grpc/stream"))
				req, err := http.NewRequest("POST", h.url+tc.path, strings.NewReader("call"))
				require.NoError(t, err)
				if tc.grpc {
					req.Header.Set("Content-Type", "application/grpc")
				}
				var res result
				select {
				case res = <-h.send(req):
				case <-time.After(testutil.Timeout):
					t.Fatal("the response was held while the server streams")
				}
				require.NoError(t, res.err)
				defer res.resp.Body.Close()
				got := make([]byte, len(tc.first))
				read := make(chan error, 1)
				go func() { _, err := io.ReadFull(res.resp.Body, got); read <- err }()
				select {
				case err := <-read:
					require.NoError(t, err)
				case <-time.After(testutil.Timeout):
					t.Fatal("the first chunk did not reach the caller while the server waits")
				}
				assert.Equal(t, tc.first, string(got))
				close(up.release)
				rest, err := io.ReadAll(res.resp.Body)
				require.NoError(t, err)
				if !tc.grpc {
					assert.Equal(t, "data: bye\n\n", string(rest))
				} else {
					assert.Equal(t, "0", res.resp.Trailer.Get("Grpc-Status"))
				}
				calls, _ := up.seen()
				assert.Equal(t, 1, calls)
			})
		})
	}
}

// The route timeout stops when a streamed response goes to the caller: the
// stream may outlive it.
func TestStreamOutlivesRouteTimeout(t *testing.T) {
	r := retryRoute("/sse")
	r.Timeout = 50 * time.Millisecond
	r.ResponseClasses = []profiles.ResponseClass{{Condition: profiles.StatusRange{Min: 500, Max: 599}, IsFailure: true}}
	up, h := newStreamHarness(t, testutil.H2C, r)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", h.url+"/sse", nil)
	require.NoError(t, err)
	res := <-h.send(req)
	require.NoError(t, res.err)
	defer res.resp.Body.Close()
	first := make([]byte, len("data: hello\n\n"))
	_, err = io.ReadFull(res.resp.Body, first)
	require.NoError(t, err)
	time.Sleep(2 * r.Timeout) // past the route timeout: the stream must stay open
	close(up.release)
	rest, err := io.ReadAll(res.resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "data: bye\n\n", string(rest))
	assert.Equal(t, 200, res.resp.StatusCode)
	assert.Empty(t, h.metrics.Lines(t, "route_response_total", `error="timeout"`), "no timeout recorded")
}

// duplexApp answers at once, then reads the request body to its end.
var duplexApp = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.WriteString(w, "ack;")
	w.(http.Flusher).Flush()
	n, err := io.Copy(io.Discard, r.Body)
	fmt.Fprintf(w, "read %d bytes, err %v", n, err)
})

// DuplexExchange checks that the server behind url answers an HTTP/1 POST
// while its body still arrives, and then reads the rest of it.
func duplexExchange(t *testing.T, url, host string) {
	t.Helper()
	pr, pw := io.Pipe()
	defer pw.CloseWithError(errors.New("test over"))
	go func() { _, _ = pw.Write([]byte("part-1;")) }()
	req, err := http.NewRequest("POST", url, pr)
	require.NoError(t, err)
	req.Host = host
	client := &http.Client{Transport: testutil.NewTransport(t, testutil.H1)}
	done := make(chan result, 1)
	go func() {
		resp, err := client.Do(req)
		done <- result{resp: resp, err: err}
	}()
	var res result
	select {
	case res = <-done:
	case <-time.After(testutil.Timeout):
		t.Fatal("no response while the request body streams: the server waited for the whole body")
	}
	require.NoError(t, res.err)
	defer res.resp.Body.Close()
	ack := make([]byte, len("ack;"))
	_, err = io.ReadFull(res.resp.Body, ack)
	require.NoError(t, err)
	assert.Equal(t, "ack;", string(ack))
	_, err = pw.Write([]byte("part-2;"))
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	rest, err := io.ReadAll(res.resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "read 14 bytes, err <nil>", string(rest))
}

// The router's inbound handler serves HTTP/1 full duplex.
func TestHandlerServesHTTP1FullDuplex(t *testing.T) {
	router := NewRouter(profiles.NewStaticSource(nil), WithLogger(quietLogger))
	defer router.Close()
	srv := testutil.NewServer(t, router.Handler(duplexApp))
	duplexExchange(t, srv.URL+"/upload", testAuthority)
	// The connection stays usable for the next request.
	h := &harness{t: t, url: srv.URL, client: &http.Client{Transport: testutil.NewTransport(t, testutil.H1)}}
	for range 3 {
		status, body := h.do("POST", "/again", strings.NewReader("x"))
		assert.Equal(t, 200, status)
		assert.Equal(t, "ack;read 1 bytes, err <nil>", body)
	}
}

// Full duplex costs a short response nothing: without a body, or with one
// the application read to its end, the response keeps its Content-Length
// (no chunked framing, no second write), as Go's server sends it. A body
// left unread still gets its response first.
func TestHandlerKeepsContentLength(t *testing.T) {
	router := NewRouter(profiles.NewStaticSource(nil), WithLogger(quietLogger))
	defer router.Close()
	srv := testutil.NewServer(t, router.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/read" {
			_, _ = io.Copy(io.Discard, r.Body)
		}
		_, _ = w.Write([]byte("ok"))
	})))
	client := &http.Client{Transport: testutil.NewTransport(t, testutil.H1)}
	for _, c := range []struct {
		method, path, body string
		chunked            bool
	}{
		{"GET", "/get", "", false},
		{"POST", "/read", "a body", false},
		{"POST", "/unread", "a body", true},
	} {
		var body io.Reader
		if c.body != "" {
			body = strings.NewReader(c.body)
		}
		req, err := http.NewRequest(c.method, srv.URL+c.path, body)
		require.NoError(t, err)
		req.Host = testAuthority
		resp, err := client.Do(req)
		require.NoError(t, err, c.path)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, "ok", string(got), c.path)
		if c.chunked {
			assert.Equal(t, []string{"chunked"}, resp.TransferEncoding, "%s: flushed before the unread body is closed", c.path)
		} else {
			assert.Equal(t, int64(2), resp.ContentLength, c.path)
			assert.Empty(t, resp.TransferEncoding, c.path)
		}
	}
}

// A body the caller can give again (GetBody) is retried even when the
// failure came before the first attempt read it, each attempt with the
// whole body.
func TestRetryWithGetBodyBeforeBodyIsRead(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		var mu sync.Mutex
		var bodies []string
		calls := 0
		srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			if n == 1 {
				w.WriteHeader(533) // before reading the body
				return
			}
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			bodies = append(bodies, string(b))
			mu.Unlock()
			io.WriteString(w, "ok")
		}))
		src := profiles.NewStaticSource(map[string]*profiles.Profile{testAuthority: profileWith(budget10s, retryRoute("/x"))})
		router := NewRouter(src, WithLogger(quietLogger))
		defer router.Close()
		router.destFor(testAuthority)
		require.Eventually(t, func() bool { return len(router.Table(testAuthority).Routes()) == 2 }, testutil.Timeout, 5*time.Millisecond)
		h := &harness{t: t, url: srv.URL, client: &http.Client{Transport: router.Transport(testutil.NewTransport(t, mode))}}
		body := strings.Repeat("payload;", 1000)
		status, got := h.do("POST", "/x", strings.NewReader(body))
		assert.Equal(t, 200, status)
		assert.Equal(t, "ok", got)
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, 2, calls)
		assert.Equal(t, []string{body}, bodies, "the retry sent the whole body once")
	})
}

// An upgraded request (HTTP/2 restored to HTTP/1 by the orig-proto layer)
// without a body is not served as an HTTP/1 duplex exchange: the response
// is not flushed early, so it keeps its content-length and its
// end of stream rides on its one DATA frame.
func TestHandlerUpgradedRequestKeepsContentLength(t *testing.T) {
	router := NewRouter(profiles.NewStaticSource(nil), WithLogger(quietLogger))
	defer router.Close()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, 1, r.ProtoMajor, "the application sees the HTTP/1 request")
		_, _ = w.Write([]byte("ok"))
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := origproto.NewServer(origproto.NewHandler(router.Handler(app)))
	go func() { _ = srv.Serve(origproto.GuardListener(lis)) }()
	defer srv.Close()
	h2 := origproto.NewH2Transport()
	defer h2.CloseIdleConnections()
	client := &http.Client{Transport: origproto.NewTransport(origproto.WithH2(h2),
		origproto.WithHint(func(*http.Request) bool { return true }))}
	for range 3 {
		req, err := http.NewRequest("GET", "http://"+lis.Addr().String()+"/books/1", nil)
		require.NoError(t, err)
		req.Host = testAuthority
		resp, err := client.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, "ok", string(body))
		assert.Equal(t, int64(2), resp.ContentLength, "flushed before the handler ended")
	}
}

type duplexWriter struct{ http.ResponseWriter }

func (duplexWriter) EnableFullDuplex() error { return nil }

type unwrapper struct{ http.ResponseWriter }

func (u unwrapper) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// Full duplex is asked for only of a writer that has it, directly or
// through the writers wrapping it, as http.ResponseController finds it.
func TestCanFullDuplex(t *testing.T) {
	rec := httptest.NewRecorder()
	assert.False(t, canFullDuplex(rec))
	assert.False(t, canFullDuplex(unwrapper{rec}))
	assert.True(t, canFullDuplex(duplexWriter{rec}))
	assert.True(t, canFullDuplex(unwrapper{unwrapper{duplexWriter{rec}}}))
}
