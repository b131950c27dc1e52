package tap_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/mesh"
	"github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/tap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const books = "books.shop.svc.cluster.local:7000"

// meshPair starts a mesh server around app on loopback and a mesh client
// that finds it as books, both publishing to hub.
func meshPair(t *testing.T, hub *tap.Hub, app http.Handler, serverOpts ...mesh.ServerOption) *http.Client {
	return meshPairWith(t, hub, app, nil, serverOpts)
}

func meshPairWith(t *testing.T, hub *tap.Hub, app http.Handler, clientOpts []mesh.ClientOption, serverOpts []mesh.ServerOption) *http.Client {
	t.Helper()
	noMetrics := mesh.WithMeterProvider(noop.NewMeterProvider())
	server := mesh.NewServer(app, append([]mesh.ServerOption{noMetrics, mesh.WithTap(hub)}, serverOpts...)...)
	t.Cleanup(server.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := origproto.NewServer(server)
	go func() { _ = srv.Serve(origproto.GuardListener(server.Listener(lis))) }()
	t.Cleanup(func() { _ = srv.Close() })
	endpoints, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		books: {{Addr: netip.MustParseAddrPort(lis.Addr().String()), H2: true}},
	})
	require.NoError(t, err)
	client := mesh.NewClient(append([]mesh.ClientOption{mesh.WithEndpoints(endpoints), noMetrics, mesh.WithTap(hub)}, clientOpts...)...)
	t.Cleanup(client.Close)
	return &http.Client{Transport: client, Timeout: testutil.Timeout}
}

func get(t *testing.T, c *http.Client, url string, hdr ...string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

func next(t *testing.T, w *tap.Watcher) tap.Event {
	t.Helper()
	select {
	case e := <-w.Events():
		return e
	case <-time.After(testutil.Timeout):
		t.Fatal("no tap event")
	}
	return tap.Event{}
}

// The very first request of a fresh client and server is tapped on both
// sides, with what a user asks of tap: method, authority, path, status,
// latency, direction; bodies never, header values only when allowed.
func TestTapSeesTheFirstRequestBothWays(t *testing.T) {
	hub := tap.NewHub(tap.WithHeaders("X-User"))
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "secret body")
	})
	c := meshPair(t, hub, app)
	w, err := hub.Watch(tap.Filter{}, 16)
	require.NoError(t, err)
	defer w.Close()

	require.Equal(t, 200, get(t, c, "http://"+books+"/books/1", "X-User", "ana", "Authorization", "Bearer x"))
	got := map[string]tap.Event{}
	for range 2 {
		e := next(t, w)
		got[e.Direction] = e
	}
	for _, dir := range []string{"inbound", "outbound"} {
		e, ok := got[dir]
		require.True(t, ok, dir)
		assert.Equal(t, "GET", e.Method, dir)
		assert.Equal(t, books, e.Authority, dir)
		assert.Equal(t, "/books/1", e.Path, dir)
		assert.Equal(t, 200, e.Status, dir)
		assert.Equal(t, -1, e.GRPCStatus, dir)
		assert.Greater(t, e.LatencyMillis, 0.0, dir)
		assert.Equal(t, map[string]string{"X-User": "ana"}, e.Headers, dir)
		raw, err := json.Marshal(e)
		require.NoError(t, err)
		assert.NotContains(t, string(raw), "secret body")
		assert.NotContains(t, string(raw), "Bearer")
	}

	// A filter on status class and path prefix passes only what it names.
	f, err := hub.Watch(tap.Filter{Status: 4, PathPrefix: "/miss", Direction: "outbound"}, 16)
	require.NoError(t, err)
	defer f.Close()
	require.Equal(t, 200, get(t, c, "http://"+books+"/books/2"))
	require.Equal(t, 404, get(t, c, "http://"+books+"/missing"))
	e := next(t, f)
	assert.Equal(t, "/missing", e.Path)
	assert.Equal(t, 404, e.Status)
	assert.Equal(t, "outbound", e.Direction)
	select {
	case e := <-f.Events():
		t.Fatalf("the filter passed %+v", e)
	default:
	}
}

// Linkerd's tap filters (linkerd2 viz/tap/pkg TapByResource's match:
// authority, path prefix, method), and inmesh's status classes.
func TestFilterMatch(t *testing.T) {
	e := &tap.Event{Direction: "outbound", Method: "POST", Authority: "web.default.svc.cluster.local:80", Path: "/api/v1/books", Route: "books-post", Status: 503}
	for _, tc := range []struct {
		name string
		f    tap.Filter
		want bool
	}{
		{"empty filter", tap.Filter{}, true},
		{"authority, any case", tap.Filter{Authority: "WEB.default.svc.cluster.local:80"}, true},
		{"other authority", tap.Filter{Authority: "books.default.svc.cluster.local:80"}, false},
		{"path prefix", tap.Filter{PathPrefix: "/api/"}, true},
		{"path prefix of another path", tap.Filter{PathPrefix: "/admin"}, false},
		{"method, any case", tap.Filter{Method: "post"}, true},
		{"other method", tap.Filter{Method: "GET"}, false},
		{"route", tap.Filter{Route: "books-post"}, true},
		{"other route", tap.Filter{Route: "books-get"}, false},
		{"exact status", tap.Filter{Status: 503}, true},
		{"other status", tap.Filter{Status: 500}, false},
		{"status class", tap.Filter{Status: 5}, true},
		{"other class", tap.Filter{Status: 2}, false},
		{"direction", tap.Filter{Direction: "inbound"}, false},
		{"all fields", tap.Filter{Direction: "outbound", Method: "POST", PathPrefix: "/api", Status: 5}, true},
	} {
		assert.Equal(t, tc.want, tc.f.Match(e), tc.name)
	}
	for _, q := range []string{"status=abc", "status=0", "status=6", "status=9", "status=-1", "status=99", "status=600", "status=42", "direction=sideways"} {
		_, err := tap.ParseFilter(parseQuery(t, q))
		assert.Error(t, err, q)
	}
	f, err := tap.ParseFilter(parseQuery(t, "authority=a:1&path=/x&method=GET&status=2&route=r&direction=inbound"))
	require.NoError(t, err)
	assert.Equal(t, tap.Filter{Authority: "a:1", PathPrefix: "/x", Method: "GET", Status: 2, Route: "r", Direction: "inbound"}, f)
}

func parseQuery(t *testing.T, q string) map[string][]string {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/tap?"+q, nil)
	return r.URL.Query()
}

// A viewer that never reads loses events, counted, and no request waits
// for it: every request completes while its buffer is full.
func TestStalledViewerNeverSlowsARequest(t *testing.T) {
	hub := tap.NewHub()
	c := meshPair(t, hub, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	w, err := hub.Watch(tap.Filter{Direction: "outbound"}, 4)
	require.NoError(t, err)
	defer w.Close()
	const n = 100
	for range n {
		require.Equal(t, 200, get(t, c, "http://"+books+"/"))
	}
	assert.Equal(t, uint64(n-4), w.Dropped())
	assert.Equal(t, uint64(n-4), hub.Stats().Dropped)
	assert.Len(t, w.Events(), 4)
}

// While nobody watches, tap costs a request nothing but a branch: no
// allocation beyond the next handler's.
func TestNoWatcherNoCost(t *testing.T) {
	hub := tap.NewHub()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	req := httptest.NewRequest(http.MethodGet, "http://"+books+"/", nil)
	w := httptest.NewRecorder()
	bare := testing.AllocsPerRun(100, func() { app.ServeHTTP(w, req) })
	tapped := hub.Handler(app)
	assert.Equal(t, bare, testing.AllocsPerRun(100, func() { tapped.ServeHTTP(w, req) }))
	rt := hub.Transport(roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, nil }))
	assert.Equal(t, 0.0, testing.AllocsPerRun(100, func() { _, _ = rt.RoundTrip(req) }))
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The inbound policy's decision and the client's verified identity reach
// inbound events: a request the policy refuses is tapped as denied.
func TestTapCarriesThePolicysDecision(t *testing.T) {
	hub := tap.NewHub()
	deny, err := authz.DefaultServer(authz.Deny, authz.DefaultOptions{})
	require.NoError(t, err)
	c := meshPair(t, hub, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		mesh.WithInboundPolicy(authz.WithDefault(deny), authz.WithoutLocalhost(), authz.WithPolicyWait(-1)))
	w, err := hub.Watch(tap.Filter{Direction: "inbound"}, 16)
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, http.StatusForbidden, get(t, c, "http://"+books+"/"))
	e := next(t, w)
	assert.Equal(t, "denied", e.Decision)
	assert.Equal(t, http.StatusForbidden, e.Status)
	assert.Empty(t, e.ClientID, "a plaintext client has no identity")
}

// The hub's HTTP stream: one JSON object per line to a command line,
// Server-Sent Events to a browser, 400 for a bad filter.
func TestStreamOverHTTP(t *testing.T) {
	hub := tap.NewHub()
	c := meshPair(t, hub, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv := testutil.NewServer(t, hub)

	resp, err := http.Get(srv.URL + "/?status=600")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

	for _, tc := range []struct{ accept, contentType, prefix string }{
		{"", "application/x-ndjson", "{"},
		{"text/event-stream", "text/event-stream", "data: {"},
	} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/?direction=outbound&path=/books", nil)
		require.NoError(t, err)
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		assert.Equal(t, tc.contentType, resp.Header.Get("Content-Type"))
		// The stream is registered once its head arrives.
		lines := make(chan string, 64)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		require.Equal(t, 200, get(t, c, "http://"+books+"/other"))
		require.Equal(t, 200, get(t, c, "http://"+books+"/books/7"))
		var line string
		for line = range lines {
			if strings.HasPrefix(line, tc.prefix) {
				break
			}
		}
		require.True(t, strings.HasPrefix(line, tc.prefix), tc.accept)
		var e tap.Event
		require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &e))
		assert.Equal(t, "/books/7", e.Path, "the filter passed only /books")
		_ = resp.Body.Close()
		wg.Wait()
	}
	require.Eventually(t, func() bool { return hub.Stats().Watchers == 0 }, testutil.Timeout, 5*time.Millisecond,
		"a viewer that goes away stops its watcher")
}

// A routed and retried request's event names its route and counts its
// retries, as the router knew them when the response head arrived.
func TestTapNamesTheRouteAndCountsRetries(t *testing.T) {
	hub := tap.NewHub()
	var calls atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%3 != 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	src := profiles.NewStaticSource(map[string]*profiles.Profile{books: {
		Routes:      []profiles.Route{{Condition: profiles.PathRegex("/flaky"), Labels: map[string]string{"route": "GET /flaky"}, Retryable: true}},
		RetryBudget: &profiles.RetryBudget{RetryRatio: 1, MinRetriesPerSecond: 100, TTL: 10 * time.Second},
	}})
	c := meshPairWith(t, hub, app, []mesh.ClientOption{mesh.WithProfiles(src), mesh.WithDiscoveryWait(testutil.Timeout)}, nil)
	w, err := hub.Watch(tap.Filter{Direction: "outbound"}, 16)
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, http.StatusOK, get(t, c, "http://"+books+"/flaky"), "the first request, retried twice")
	e := next(t, w)
	assert.Equal(t, "GET /flaky", e.Route)
	assert.Equal(t, http.StatusOK, e.Status)
	assert.Equal(t, 2, e.Retries, "two 503s retried, then 200")
}

// While a viewer watches, a tapped request costs three allocations: its
// request copy, the context carrying its slot and one for its recorder
// (or the watch over its response body), slot and event together.
func TestWatchedRequestAllocations(t *testing.T) {
	hub := tap.NewHub()
	w, err := hub.Watch(tap.Filter{}, 1)
	require.NoError(t, err)
	defer w.Close()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	req := httptest.NewRequest(http.MethodGet, "http://"+books+"/", nil)
	rec := httptest.NewRecorder()
	bare := testing.AllocsPerRun(100, func() { app.ServeHTTP(rec, req) })
	tapped := hub.Handler(app)
	assert.Equal(t, bare+3, testing.AllocsPerRun(100, func() { tapped.ServeHTTP(rec, req) }))
	resp := &http.Response{StatusCode: 200, Header: http.Header{}}
	rt := hub.Transport(roundTripFunc(func(*http.Request) (*http.Response, error) { return resp, nil }))
	assert.Equal(t, 3.0, testing.AllocsPerRun(100, func() { _, _ = rt.RoundTrip(req) }))

	// A response with a body, read to its end and closed.
	withBody := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}, nil
	})
	drain := func(rt http.RoundTripper) {
		resp, _ := rt.RoundTrip(req)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	bare = testing.AllocsPerRun(100, func() { drain(withBody) })
	rt = hub.Transport(withBody)
	assert.Equal(t, bare+3, testing.AllocsPerRun(100, func() { drain(rt) }))
	assert.Positive(t, w.Dropped(), "the watcher's buffer of one filled: events were published")
}

// noEvent fails the test if w holds an event now: events are published on
// the goroutine that ends the request, so none can be on its way.
func noEvent(t *testing.T, w *tap.Watcher, when string) {
	t.Helper()
	select {
	case e := <-w.Events():
		t.Errorf("an event %s: %+v", when, e)
	default:
	}
}

// An outbound event is published once, when its response ends, as
// Linkerd's tap reports a response's end (its eos) from the trailers: read
// to its end, a body's event carries the grpc-status of the trailers
// (where grpc-go puts a call's status) or of the head (a trailers-only
// answer); a body that breaks gives the event its error; a body closed
// before its end publishes the event as it stands. Nothing is published
// before, nor again after.
func TestOutboundEventAtTheEndOfTheResponse(t *testing.T) {
	app := func(stop <-chan struct{}) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/trailers":
				w.Header().Set("Trailer", "Grpc-Status")
				_, _ = io.WriteString(w, "message")
				w.Header().Set("Grpc-Status", "13")
			case "/trailers-only":
				w.Header().Set("Grpc-Status", "14")
			case "/plain":
				_, _ = io.WriteString(w, "ok")
			case "/broken":
				_, _ = io.WriteString(w, "partial")
				_ = http.NewResponseController(w).Flush()
				panic(http.ErrAbortHandler)
			case "/endless":
				w.Header().Set("Grpc-Status", "0")
				_, _ = io.WriteString(w, "partial")
				_ = http.NewResponseController(w).Flush()
				select {
				case <-r.Context().Done():
				case <-stop:
				}
			}
		})
	}
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		stop := make(chan struct{})
		srv := testutil.NewServer(t, app(stop))
		t.Cleanup(func() { close(stop) }) // before the server closes
		hub := tap.NewHub()
		w, err := hub.Watch(tap.Filter{}, 16)
		require.NoError(t, err)
		defer w.Close()
		rt := hub.Transport(testutil.NewTransport(t, mode))
		for _, tc := range []struct {
			path string
			// closeEarly closes the body after its head, unread.
			closeEarly     bool
			wantGRPCStatus int
			wantError      bool
		}{
			{path: "/trailers", wantGRPCStatus: 13},
			{path: "/trailers-only", wantGRPCStatus: 14},
			{path: "/plain", wantGRPCStatus: -1},
			{path: "/broken", wantGRPCStatus: -1, wantError: true},
			{path: "/endless", closeEarly: true, wantGRPCStatus: 0},
		} {
			req, err := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
			require.NoError(t, err)
			resp, err := rt.RoundTrip(req)
			require.NoError(t, err, tc.path)
			if tc.path != "/trailers-only" {
				noEvent(t, w, "before the body of "+tc.path+" ended")
			}
			if !tc.closeEarly {
				_, err = io.Copy(io.Discard, resp.Body)
				assert.Equal(t, tc.wantError, err != nil, "%s: reading the body: %v", tc.path, err)
			}
			require.NoError(t, resp.Body.Close())
			e := next(t, w)
			assert.Equal(t, tc.path, e.Path)
			assert.Equal(t, http.StatusOK, e.Status, tc.path)
			assert.Equal(t, tc.wantGRPCStatus, e.GRPCStatus, tc.path)
			assert.Equal(t, tc.wantError, e.Error != "", "%s: error %q", tc.path, e.Error)
			_, _ = resp.Body.Read(make([]byte, 1))
			_ = resp.Body.Close()
			noEvent(t, w, "again after "+tc.path)
		}
	})
}

// An inbound response its handler aborts (panic(http.ErrAbortHandler), as
// httputil.ReverseProxy does when its upstream breaks mid-body) is an
// event with the abort as its error, after its head (the status that went
// out) or before it (no status); the panic reaches net/http, which breaks
// the response off.
func TestInboundEventOfAnAbortedResponse(t *testing.T) {
	hub := tap.NewHub()
	app := hub.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/after-head" {
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, "partial")
			_ = http.NewResponseController(w).Flush()
		}
		panic(http.ErrAbortHandler)
	}))
	w, err := hub.Watch(tap.Filter{}, 16)
	require.NoError(t, err)
	defer w.Close()
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		srv := testutil.NewServer(t, app)
		c := &http.Client{Transport: testutil.NewTransport(t, mode), Timeout: testutil.Timeout}
		for _, tc := range []struct {
			path       string
			wantStatus int
		}{{"/after-head", http.StatusAccepted}, {"/before-head", 0}} {
			resp, err := c.Get(srv.URL + tc.path)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			require.Error(t, err, "%s: the client sees the response broken off", tc.path)
			e := next(t, w)
			assert.Equal(t, "inbound", e.Direction)
			assert.Equal(t, tc.path, e.Path)
			assert.Equal(t, tc.wantStatus, e.Status, tc.path)
			assert.Equal(t, http.ErrAbortHandler.Error(), e.Error, tc.path)
		}
	})
}

// A busy stack's events reach a viewer several to a write: the stream
// waits tap.FlushDelay after the first event of a quiet spell and sends
// what queued meanwhile together. Read as raw HTTP/1 chunks (one per
// write), 200 events published back to back arrive in far fewer than 200;
// a stream that flushed each event would send 200.
func TestStreamBatchesEvents(t *testing.T) {
	hub := tap.NewHub()
	srv := testutil.NewServer(t, hub)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(testutil.Timeout)))
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"chunked"}, resp.TransferEncoding)
	require.Eventually(t, func() bool { return hub.Stats().Watchers == 1 }, testutil.Timeout, time.Millisecond)

	const n = 200
	for i := range n {
		hub.Publish(&tap.Event{Direction: "inbound", Method: "GET", Authority: books, Path: "/" + strconv.Itoa(i), Status: 200})
	}
	events, chunks := 0, 0
	for events < n {
		line, err := br.ReadString('\n') // the chunk's size
		require.NoError(t, err)
		size, err := strconv.ParseInt(strings.TrimSpace(line), 16, 64)
		require.NoError(t, err)
		body := make([]byte, size+2) // and its CRLF
		_, err = io.ReadFull(br, body)
		require.NoError(t, err)
		chunks++
		events += strings.Count(string(body[:size]), "\n")
	}
	assert.Equal(t, n, events)
	assert.LessOrEqual(t, chunks, n/4, "writes for %d events (a response buffer holds about 10)", n)
	t.Logf("%d events in %d writes", n, chunks)
}

// A viewer that stops reading its stream is dropped once a write has
// waited the write timeout, and its watcher slot is freed, rather than
// held for as long as its connection stays open.
func TestStalledViewerIsDropped(t *testing.T) {
	hub := tap.NewHub(tap.WithHeaders("x-padding"), tap.WithWriteTimeout(200*time.Millisecond))
	c := meshPair(t, hub, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv := testutil.NewServer(t, hub)

	// A viewer that asks and never reads, with a small receive buffer.
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	_, err = io.WriteString(conn, "GET /?direction=outbound HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return hub.Stats().Watchers == 1 }, testutil.Timeout, time.Millisecond)

	// Events of 8 KiB each, until the stream's writes stall and the viewer
	// is dropped.
	padding := strings.Repeat("x", 8<<10)
	deadline := time.Now().Add(6 * testutil.Timeout)
	for hub.Stats().Watchers != 0 {
		require.True(t, time.Now().Before(deadline), "the viewer that stopped reading still holds its watcher")
		for range 20 {
			require.Equal(t, 200, get(t, c, "http://"+books+"/", "x-padding", padding))
		}
	}
}
