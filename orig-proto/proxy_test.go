package origproto

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// seenRequest is what the application saw of one request.
type seenRequest struct {
	Proto            string
	Method           string
	RequestURI       string
	Host             string
	Header           http.Header
	Body             string
	ContentLength    int64
	TransferEncoding []string
	Trailer          http.Header
}

// app is the HTTP/1 application behind the receiving peer.
type app struct {
	mu   sync.Mutex
	seen []seenRequest
	mux  *http.ServeMux
}

func newApp() *app {
	a := &app{mux: http.NewServeMux()}
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Seen-Proto", r.Proto)
		io.WriteString(w, "hello from "+r.URL.Path)
	})
	a.mux.HandleFunc("/204", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	a.mux.HandleFunc("/304", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(304) })
	a.mux.HandleFunc("/trailers", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		io.WriteString(w, "body")
		w.Header().Set("X-Checksum", "abc")
	})
	a.mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		// The body was already read by the recorder; echo what it saw.
		a.mu.Lock()
		body := a.seen[len(a.seen)-1].Body
		a.mu.Unlock()
		io.WriteString(w, body)
	})
	a.mux.HandleFunc("/leak", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close, X-Hop")
		w.Header().Set("X-Hop", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		io.WriteString(w, "ok")
	})
	return a
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
		return
	}
	s := seenRequest{
		Proto: r.Proto, Method: r.Method, RequestURI: r.RequestURI, Host: r.Host, Header: r.Header.Clone(),
		Body: string(body), ContentLength: r.ContentLength, TransferEncoding: r.TransferEncoding, Trailer: r.Trailer.Clone(),
	}
	a.mu.Lock()
	a.seen = append(a.seen, s)
	a.mu.Unlock()
	a.mux.ServeHTTP(w, r)
}

func (a *app) requests() []seenRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]seenRequest(nil), a.seen...)
}

func (a *app) last(t *testing.T) seenRequest {
	t.Helper()
	s := a.requests()
	require.NotEmpty(t, s, "the app saw no request")
	return s[len(s)-1]
}

// mesh is two peers on loopback: client -> outbound proxy (HTTP/1 server,
// ReverseProxy over the upgrade Transport) -> inbound peer (HTTP/1 + h2c,
// the downgrade handler) -> app.
type mesh struct {
	app          *app
	outbound     *httptest.Server
	inbound      *httptest.Server
	inboundConns atomic.Int32
	transport    *Transport
}

func newMesh(t *testing.T) *mesh {
	m := &mesh{app: newApp()}
	m.inbound = httptest.NewUnstartedServer(NewHandler(m.app))
	m.inbound.Config = NewServer(NewHandler(m.app))
	m.inbound.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			m.inboundConns.Add(1)
		}
	}
	m.inbound.Listener = GuardListener(m.inbound.Listener)
	m.inbound.Start()
	t.Cleanup(m.inbound.Close)
	inboundURL, _ := url.Parse(m.inbound.URL)

	h2 := NewH2Transport()
	t.Cleanup(h2.CloseIdleConnections)
	h1 := &http.Transport{}
	t.Cleanup(h1.CloseIdleConnections)
	m.transport = NewTransport(WithH2(h2), WithHTTP1(h1), WithHint(func(*http.Request) bool { return true }))
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(inboundURL)
			pr.Out.Host = pr.In.Host
		},
		Transport: m.transport,
		ErrorLog:  nil,
	}
	m.outbound = httptest.NewUnstartedServer(proxy)
	m.outbound.Listener = GuardListener(m.outbound.Listener)
	m.outbound.Start()
	t.Cleanup(m.outbound.Close)
	return m
}

// raw sends bytes to the outbound proxy and returns its response.
func (m *mesh) raw(t *testing.T, request string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(m.outbound.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(testutil.Timeout))
	_, err = io.WriteString(conn, request)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "request %q", request)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

func (m *mesh) get(t *testing.T, path string, h http.Header) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", m.outbound.URL+path, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestOrigProtoReachesAppAsHTTP1(t *testing.T) {
	m := newMesh(t)
	resp, body := m.raw(t, "GET /x HTTP/1.1\r\nHost: books.default.svc.cluster.local:7000\r\n\r\n")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "hello from /x", body)
	assert.Equal(t, "HTTP/1.1", resp.Proto, "the client gets HTTP/1.1")
	seen := m.app.last(t)
	assert.Equal(t, "HTTP/1.1", seen.Proto)
	assert.Equal(t, "/x", seen.RequestURI, "origin-form")
	assert.Equal(t, "books.default.svc.cluster.local:7000", seen.Host)
	assert.Empty(t, seen.Header.Get(Header), "l5d_orig_proto_header_isnt_leaked: app")
	assert.Empty(t, resp.Header.Get(Header), "l5d_orig_proto_header_isnt_leaked: client")
	assert.Equal(t, int32(1), m.inboundConns.Load())
}

func TestRemovesConnectionHeaders(t *testing.T) {
	m := newMesh(t)
	resp, _ := m.raw(t, "GET /leak HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Secret, l5d-dst-override\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTe: gzip\r\nX-Kept: yes\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode)
	seen := m.app.last(t)
	for _, h := range []string{"Connection", "X-Secret", "Keep-Alive", "Proxy-Connection", "Te", "Upgrade", "Transfer-Encoding"} {
		assert.Empty(t, seen.Header.Values(h), "%s reached the app", h)
	}
	assert.Equal(t, "yes", seen.Header.Get("X-Kept"))

	// Naming l5d-orig-proto in Connection cannot remove the header the
	// upgrade adds: the request is still downgraded to HTTP/1.1.
	m.raw(t, "GET /named HTTP/1.1\r\nHost: a\r\nConnection: l5d-orig-proto\r\nL5d-Orig-Proto: HTTP/1.0\r\n\r\n")
	seen = m.app.last(t)
	assert.Equal(t, "HTTP/1.1", seen.Proto)
	assert.Empty(t, seen.Header.Values(Header))
	for _, h := range []string{"X-Hop", "Keep-Alive"} {
		assert.Empty(t, resp.Header.Values(h), "%s reached the client", h)
	}
}

func TestHTTP10WithHost(t *testing.T) {
	m := newMesh(t)
	resp, body := m.raw(t, "GET /ten HTTP/1.0\r\nHost: a\r\n\r\n")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "hello from /ten", body)
	assert.Equal(t, "HTTP/1.0", m.app.last(t).Proto, "the app sees HTTP/1.0")
	assert.Equal(t, 1, resp.ProtoMajor)
}

func TestAbsoluteURIDiffersFromHost(t *testing.T) {
	m := newMesh(t)
	resp, _ := m.raw(t, "GET http://books.ns:7000/abs HTTP/1.1\r\nHost: other.ns\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode)
	seen := m.app.last(t)
	assert.Equal(t, "http://books.ns:7000/abs", seen.RequestURI, "absolute-form is carried across")
	assert.Equal(t, "books.ns:7000", seen.Host, "the URI's authority wins over Host")
	assert.Equal(t, "HTTP/1.1", seen.Proto)
}

func TestUpgradeH2cStripped(t *testing.T) {
	m := newMesh(t)
	resp, _ := m.raw(t, "GET /h2c HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
	assert.Equal(t, 200, resp.StatusCode)
	seen := m.app.last(t)
	assert.Empty(t, seen.Header.Get("Upgrade"))
	assert.Empty(t, seen.Header.Get("Http2-Settings"))
	assert.Equal(t, "HTTP/1.1", seen.Proto)
	assert.Equal(t, int32(1), m.inboundConns.Load(), "went over the h2 connection")
}

func TestUpgradesAreNeverUpgraded(t *testing.T) {
	m := newMesh(t)
	m.app.mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		buf.Flush()
		line, _ := buf.ReadString('\n')
		buf.WriteString("echo:" + line)
		buf.Flush()
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(m.outbound.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(testutil.Timeout))
	io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	assert.Equal(t, 101, resp.StatusCode)
	io.WriteString(conn, "ping\n")
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "echo:ping\n", line, "bytes tunnel both ways")
	assert.Equal(t, "HTTP/1.1", m.app.last(t).Proto)
	assert.Equal(t, "echo", m.app.last(t).Header.Get("Upgrade"), "the upgrade reached the app as HTTP/1")
}

// CONNECT and protocol upgrades go out as they came, over HTTP/1; a
// request that is already HTTP/2 goes out over HTTP/2 as it came, never
// with l5d-orig-proto.
func TestConnectIsNeverUpgraded(t *testing.T) {
	var sawH2 atomic.Bool
	ok := func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}}, nil
	}
	tr := NewTransport(WithHint(func(*http.Request) bool { return true }),
		WithH2(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.ProtoMajor != 2 || r.Header[Header] != nil {
				sawH2.Store(true)
			}
			return ok(r)
		})),
		WithHTTP1(roundTripFunc(ok)))
	for _, r := range []*http.Request{
		{Method: "CONNECT", URL: &url.URL{Host: "a:443"}, Host: "a:443", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{}},
		{Method: "GET", URL: &url.URL{Scheme: "http", Host: "a"}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{"Upgrade": {"websocket"}}},
		{Method: "GET", URL: &url.URL{Scheme: "http", Host: "a"}, Proto: "HTTP/2.0", ProtoMajor: 2, Header: http.Header{}},
	} {
		resp, err := tr.RoundTrip(r)
		require.NoError(t, err)
		resp.Body.Close()
	}
	assert.False(t, sawH2.Load(), "upgraded")
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestBodies(t *testing.T) {
	m := newMesh(t)
	t.Run("content-length", func(t *testing.T) {
		resp, body := m.raw(t, "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world")
		assert.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, "hello world", body)
		seen := m.app.last(t)
		assert.Equal(t, int64(11), seen.ContentLength)
		assert.Empty(t, seen.TransferEncoding)
	})
	t.Run("chunked", func(t *testing.T) {
		resp, body := m.raw(t, "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
		assert.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, "hello world", body)
		assert.Empty(t, m.app.last(t).Header.Get("Transfer-Encoding"))
	})
	t.Run("no body adds no transfer-encoding", func(t *testing.T) {
		m.raw(t, "GET /nobody HTTP/1.1\r\nHost: a\r\n\r\n")
		seen := m.app.last(t)
		assert.Empty(t, seen.TransferEncoding)
		assert.Equal(t, int64(0), seen.ContentLength)
		assert.Empty(t, seen.Header.Get("Content-Length"))
	})
	t.Run("content-length 0 preserved", func(t *testing.T) {
		m.raw(t, "POST /zero HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
		seen := m.app.last(t)
		assert.Equal(t, int64(0), seen.ContentLength)
		assert.Equal(t, "0", seen.Header.Get("Content-Length"))
		assert.Empty(t, seen.TransferEncoding)
	})
	t.Run("large", func(t *testing.T) {
		big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
		req, _ := http.NewRequest("POST", m.outbound.URL+"/echo", bytes.NewReader(big))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.True(t, bytes.Equal(big, got))
	})
}

func TestBodylessResponsesDontHang(t *testing.T) {
	m := newMesh(t)
	for _, tc := range []struct{ method, path string }{{"GET", "/204"}, {"GET", "/304"}, {"HEAD", "/"}} {
		req, _ := http.NewRequest(tc.method, m.outbound.URL+tc.path, nil)
		client := &http.Client{Timeout: testutil.Timeout}
		resp, err := client.Do(req)
		require.NoError(t, err, tc.path)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Empty(t, body, "%s %s", tc.method, tc.path)
	}
}

func TestTrailersPass(t *testing.T) {
	m := newMesh(t)
	resp := m.get(t, "/trailers", nil)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "body", string(body))
	assert.Equal(t, "abc", resp.Trailer.Get("X-Checksum"))

	// Request trailers too, through the transport itself (ReverseProxy
	// forwards a copy of the request's trailer map, which stays empty).
	req, _ := http.NewRequest("POST", m.inbound.URL+"/", io.NopCloser(strings.NewReader("data")))
	req.ContentLength = -1
	req.Trailer = http.Header{"X-Req-Sum": {"42"}}
	resp2, err := m.transport.RoundTrip(req)
	require.NoError(t, err)
	resp2.Body.Close()
	assert.Equal(t, "42", m.app.last(t).Trailer.Get("X-Req-Sum"))
}

// 64 HTTP/1 clients at once, on a cold start, share one connection between
// the peers.
func TestOneConnectionBetweenPeers(t *testing.T) {
	m := newMesh(t)
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			tr := &http.Transport{DisableKeepAlives: true} // 64 separate client connections
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Get(fmt.Sprintf("%s/c%d", m.outbound.URL, i))
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Len(t, m.app.requests(), 64)
	assert.Equal(t, int32(1), m.inboundConns.Load(), "one TCP connection between the peers")
}

// Linkerd's modern outbound_http1: against a bare h2 server (not a mesh
// peer), the upgraded request carries the header and the HTTP/1 client gets
// HTTP/1.1 back.
func TestOutboundToBareH2Server(t *testing.T) {
	got := make(chan string, 1)
	bare := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Proto + " " + r.Header.Get(Header)
		w.Header().Set(Header, r.Header.Get(Header)) // echo it
	}))
	tr := NewTransport(WithHint(func(*http.Request) bool { return true }))
	req, _ := http.NewRequest("GET", bare.URL+"/", nil)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "HTTP/2.0 HTTP/1.1", <-got)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "HTTP/1.1", resp.Proto)
	assert.Empty(t, resp.Header.Get(Header))
	tr.h2.(*http.Transport).CloseIdleConnections()
}

// Linkerd's modern inbound_http1: a bare h2 client posing as a peer.
func TestInboundFromBareH2Client(t *testing.T) {
	m := newMesh(t)
	h2 := testutil.NewTransport(t, testutil.H2C)
	req, _ := http.NewRequest("GET", m.inbound.URL+"/in", nil)
	req.Host = "books.ns:7000"
	req.Header.Set(Header, "HTTP/1.1")
	resp, err := h2.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "HTTP/2.0", resp.Proto)
	assert.Equal(t, "HTTP/1.1", resp.Header.Get(Header), "echoed to the peer")
	seen := m.app.last(t)
	assert.Equal(t, "HTTP/1.1", seen.Proto)
	assert.Equal(t, "/in", seen.RequestURI, "origin-form, no scheme")
	assert.Equal(t, "books.ns:7000", seen.Host)
	assert.Empty(t, seen.Header.Get(Header))
}

func TestInvalidValueIs400(t *testing.T) {
	m := newMesh(t)
	h2 := testutil.NewTransport(t, testutil.H2C)
	for _, v := range []string{"-", "HTTP/1.1;absolute-form", "HTTP/2", "http/1.1", "HTTP/1.1; absolute-form ", "HTTP/1.1, HTTP/1.0"} {
		req, _ := http.NewRequest("GET", m.inbound.URL+"/", nil)
		req.Header.Set(Header, v)
		resp, err := h2.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 400, resp.StatusCode, "%q", v)
	}
	assert.Empty(t, m.app.requests(), "no invalid request reached the app")
}

func TestUntrustedPeerLosesL5dHeaders(t *testing.T) {
	a := newApp()
	h := NewHandler(a, WithTrust(func(*http.Request) bool { return false }))
	srv := testutil.NewServer(t, h)
	h2 := testutil.NewTransport(t, testutil.H2C)
	req, _ := http.NewRequest("GET", srv.URL+"/", nil)
	req.Header.Set(Header, "HTTP/1.1")
	req.Header.Set("L5d-Dst-Override", "evil:80")
	req.Header.Set("l5d-client-id", "forged")
	req.Header.Set("X-Ok", "1")
	resp, err := h2.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	seen := a.last(t)
	assert.Equal(t, "HTTP/2.0", seen.Proto, "no downgrade for an untrusted peer")
	for name := range seen.Header {
		assert.False(t, strings.HasPrefix(strings.ToLower(name), "l5d-"), "%s reached the app", name)
	}
	assert.Equal(t, "1", seen.Header.Get("X-Ok"))
	assert.Empty(t, resp.Header.Get(Header))
}

func TestUpgradeErrorIsBadGateway(t *testing.T) {
	addr := testutil.FreeAddr(t)
	tr := NewTransport(WithHint(func(*http.Request) bool { return true }))
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(&url.URL{Scheme: "http", Host: addr}) },
		Transport: tr,
		ErrorLog:  nil,
	}
	proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		var ue *UpgradeError
		assert.ErrorAs(t, err, &ue)
		w.WriteHeader(http.StatusBadGateway)
	}
	srv := testutil.NewServer(t, proxy)
	resp, body := (&mesh{outbound: srv}).raw(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	assert.Equal(t, 502, resp.StatusCode, body)
	assert.NotContains(t, resp.Header.Get("Connection"), "h2")
}

// A request of many small headers fits the peer's HTTP/1 limit (64 KiB of
// header bytes) but not HTTP/2's count of them (32 bytes more a field):
// it is not upgraded, goes to the peer as HTTP/1 and arrives whole,
// instead of failing in the client's own HTTP/2 transport (where a
// balancer would count it against the endpoint).
func TestManyHeadersNotUpgraded(t *testing.T) {
	many, _ := http.NewRequest(http.MethodGet, "http://a/many", nil)
	var b strings.Builder
	b.WriteString("GET /many HTTP/1.1\r\nHost: a\r\n")
	for i := range 3000 {
		many.Header.Set(fmt.Sprint("X-H", i), "v")
		fmt.Fprintf(&b, "X-H%d: v\r\n", i)
	}
	b.WriteString("\r\n")
	few, _ := http.NewRequest(http.MethodGet, "http://a/few", nil)
	few.Header.Set("X-H", "v")
	assert.False(t, Eligible(many), "3,000 headers")
	assert.True(t, Eligible(few))

	m := newMesh(t)
	resp, _ := m.raw(t, b.String())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "v", m.app.last(t).Header.Get("X-H2999"), "every header arrived")
}
