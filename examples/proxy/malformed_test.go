package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/examples/internal/proxylog"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/tap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// seenApp is an application (HTTP/1 and h2c) that records each request it
// is sent: protocol, method, Host, target, body and l5d-client-id.
type seenApp struct {
	mu   sync.Mutex
	seen []string
	hold func(*http.Request) // called before the answer, when set
}

// setHold makes the app call hold with every request before it answers.
func (a *seenApp) setHold(hold func(*http.Request)) {
	a.mu.Lock()
	a.hold = hold
	a.mu.Unlock()
}

func (a *seenApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	line := fmt.Sprintf("%s %s %s body=%q client-id=%q", r.Method, r.Host, r.RequestURI, b, r.Header.Get("l5d-client-id"))
	if err != nil {
		line += " err=" + err.Error()
	}
	a.mu.Lock()
	a.seen = append(a.seen, line)
	hold := a.hold
	a.mu.Unlock()
	if hold != nil {
		hold(r)
	}
	io.WriteString(w, "ok")
}

func (a *seenApp) requests() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.seen...)
}

// sidecar is the proxy's two listeners, built as run builds them, in this
// process, in front of a seenApp; its log lines are counted.
type sidecar struct {
	app             *seenApp
	appAddr         string
	outAddr, inAddr string
	log             *lines
}

func startSidecar(t *testing.T, hub *tap.Hub) *sidecar {
	s := &sidecar{app: &seenApp{}, log: &lines{}}
	log := slog.New(slog.NewTextHandler(s.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	app := httptest.NewUnstartedServer(s.app)
	app.Config.Protocols = new(http.Protocols)
	app.Config.Protocols.SetHTTP1(true)
	app.Config.Protocols.SetUnencryptedHTTP2(true)
	app.Start()
	t.Cleanup(app.Close)
	appURL, err := url.Parse(app.URL)
	require.NoError(t, err)
	s.appAddr = appURL.Host
	opts := []mesh.Option{mesh.WithLogger(log)}
	if hub != nil {
		opts = append(opts, mesh.WithTap(hub))
	}
	client := mesh.NewClient(mesh.ClientOptions(opts...)...)
	t.Cleanup(client.Close)
	outLog, inLog := proxylog.New(log, "outbound"), proxylog.New(log, "inbound")
	outbound := origproto.NewServer(fullDuplex(outboundProxy(client, outLog)))
	outbound.ErrorLog = outLog.ErrorLog()
	toApp, closeApp := appTransport(0)
	t.Cleanup(closeApp)
	inboundStack := mesh.NewServer(inboundProxy(appURL, mesh.TraceTransport(toApp), inLog), mesh.ServerOptions(opts...)...)
	t.Cleanup(inboundStack.Close)
	inbound := origproto.NewServer(fullDuplex(inboundStack))
	inbound.ErrorLog = inLog.ErrorLog()
	serve := func(srv *http.Server, wrap func(net.Listener) net.Listener) string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lis = wrap(lis)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("serve: %v", err)
			}
		}()
		t.Cleanup(func() { srv.Close(); <-done })
		return lis.Addr().String()
	}
	s.outAddr = serve(outbound, origproto.GuardListener)
	s.inAddr = serve(inbound, inboundStack.Listener)
	return s
}

// rawExchange writes data on a new connection and returns the status line
// of every response read until the connection closes.
func rawExchange(t *testing.T, addr, data string) []string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	go io.WriteString(conn, data)
	br := bufio.NewReader(conn)
	var out []string
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return out
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, resp.Status)
	}
}

// h2Exchange sends one request (header fields in order, then body when
// not empty) on a new prior-knowledge connection and returns its status,
// or "reset CODE".
func h2Exchange(t *testing.T, addr string, body string, fields ...string) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	bw := bufio.NewWriter(conn)
	fr := http2.NewFramer(bw, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	bw.WriteString(http2.ClientPreface)
	require.NoError(t, fr.WriteSettings())
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	for i := 0; i < len(fields); i += 2 {
		require.NoError(t, enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]}))
	}
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hbuf.Bytes(), EndStream: body == "", EndHeaders: true}))
	if body != "" {
		require.NoError(t, fr.WriteData(1, true, []byte(body)))
	}
	require.NoError(t, bw.Flush())
	for {
		f, err := fr.ReadFrame()
		require.NoError(t, err)
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, fr.WriteSettingsAck())
				require.NoError(t, bw.Flush())
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				return f.PseudoValue("status")
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return "reset " + f.ErrCode.String()
			}
		case *http2.GoAwayFrame:
			return "goaway " + f.ErrCode.String()
		}
	}
}

// A request that is malformed on its own is its client's fault: each gets
// a 4xx from the listener it reached, none reaches the application, and
// none is logged as a proxy error (which would blame the upstream).
func TestMalformedRequestsAre4xx(t *testing.T) {
	s := startSidecar(t, nil)
	for _, tc := range []struct{ name, addr, request string }{
		{"outbound HTTP/1.0 without Host", s.outAddr, "GET / HTTP/1.0\r\n\r\n"},
		{"outbound empty Host", s.outAddr, "GET / HTTP/1.1\r\nHost: \r\nConnection: close\r\n\r\n"},
		{"outbound Host with a bad port", s.outAddr, "GET / HTTP/1.1\r\nHost: a:99999\r\nConnection: close\r\n\r\n"},
		{"outbound Host with an open bracket", s.outAddr, "GET / HTTP/1.1\r\nHost: [::1\r\nConnection: close\r\n\r\n"},
		{"outbound bad chunk", s.outAddr, "POST / HTTP/1.1\r\nHost: " + s.appAddr + "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n\r\n"},
		{"inbound bad chunk", s.inAddr, "POST / HTTP/1.1\r\nHost: " + s.appAddr + "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n\r\n"},
	} {
		got := rawExchange(t, tc.addr, tc.request)
		if assert.NotEmpty(t, got, tc.name) {
			assert.True(t, strings.HasPrefix(got[0], "4"), "%s: answered %q", tc.name, got[0])
		}
	}
	for _, addr := range []string{s.outAddr, s.inAddr} {
		got := h2Exchange(t, addr, "", ":method", "G ET", ":scheme", "http", ":authority", s.appAddr, ":path", "/")
		assert.True(t, strings.HasPrefix(got, "4") || strings.HasPrefix(got, "reset"), "HTTP/2 :method with a space: %s", got)
	}
	for _, r := range s.app.requests() {
		assert.Contains(t, r, "err=", "only a request whose body broke on the way reaches the application: %s", r)
	}
	n, first := s.log.count()
	assert.Zero(t, n, "a client's malformed request is logged as a proxy error:\n%s", first)
}

// An HTTP/1 CONNECT gets 501 at either listener, where a ReverseProxy
// would answer 200 with a chunked body and carry nothing through the
// tunnel the client then believes it has; the application never sees it.
func TestHTTP1ConnectRefused(t *testing.T) {
	s := startSidecar(t, nil)
	for name, addr := range map[string]string{"outbound": s.outAddr, "inbound": s.inAddr} {
		t.Run(name, func(t *testing.T) {
			got := rawExchange(t, addr, "CONNECT "+s.appAddr+" HTTP/1.1\r\nHost: "+s.appAddr+"\r\n\r\n")
			assert.Equal(t, []string{"501 Not Implemented"}, got)
			assert.Empty(t, s.app.requests())
		})
	}
	n, first := s.log.count()
	assert.Zero(t, n, "a refused CONNECT is not a proxy error:\n%s", first)
}

// An HTTP/2 CONNECT from a peer, carrying an HTTP/1 request as its
// stream's bytes, gets 501 at the inbound listener; the application never
// sees the request inside it (whose l5d-client-id no TLS proved), and a
// request after it is served as itself.
func TestHTTP2ConnectNotSmuggled(t *testing.T) {
	s := startSidecar(t, nil)
	inner := "GET /admin HTTP/1.1\r\nHost: " + s.appAddr + "\r\nl5d-client-id: admin.default.serviceaccount.identity.linkerd.cluster.local\r\n\r\n"
	got := h2Exchange(t, s.inAddr, inner, ":method", "CONNECT", ":authority", s.appAddr)
	assert.Equal(t, "501", got)
	got = h2Exchange(t, s.inAddr, "", ":method", "GET", ":scheme", "http", ":authority", s.appAddr, ":path", "/after")
	assert.Equal(t, "200", got)
	assert.Equal(t, []string{fmt.Sprintf("GET %s /after body=\"\" client-id=\"\"", s.appAddr)}, s.app.requests())
	n, first := s.log.count()
	assert.Zero(t, n, "a refused CONNECT is not a proxy error:\n%s", first)
}
