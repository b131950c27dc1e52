package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/examples/internal/proxylog"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lines counts the log lines written through it and keeps the first few.
type lines struct {
	mu    sync.Mutex
	n     int
	first bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n += bytes.Count(p, []byte("\n"))
	if l.first.Len() < 4096 {
		l.first.Write(p)
	}
	return len(p), nil
}

func (l *lines) count() (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n, l.first.String()
}

// resets opens an h2c connection to addr and sends n requests for
// authority (with extra headers), each reset by the client (RST_STREAM
// CANCEL) right after its headers. It sends them in batches, each closed by
// a PING whose answer says the server read the batch.
func resets(addr, authority string, n int, extra ...string) error {
	const batch = 200
	hs := append([]string{":method", "GET", ":scheme", "http", ":authority", authority, ":path", "/"}, extra...)
	var hbuf bytes.Buffer
	for sent := 0; sent < n; {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		pong, done := make(chan struct{}, 1), make(chan struct{})
		bw := bufio.NewWriter(conn)
		fr := http2.NewFramer(bw, conn)
		go readFrames(fr, conn, pong, done)
		enc := hpack.NewEncoder(&hbuf)
		err = func() error {
			if _, err := bw.WriteString(http2.ClientPreface); err != nil {
				return err
			}
			if err := fr.WriteSettings(); err != nil {
				return err
			}
			for id := uint32(1); sent < n && id < 1<<30; {
				for i := 0; i < batch && sent < n; i++ {
					hbuf.Reset()
					for j := 0; j < len(hs); j += 2 {
						if err := enc.WriteField(hpack.HeaderField{Name: hs[j], Value: hs[j+1]}); err != nil {
							return err
						}
					}
					if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
						return err
					}
					if err := fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
						return err
					}
					id += 2
					sent++
				}
				if err := fr.WritePing(false, [8]byte{1}); err != nil {
					return err
				}
				if err := bw.Flush(); err != nil {
					return err
				}
				select {
				case <-pong:
				case <-done:
					return nil // GOAWAY or a closed connection: carry on afresh
				case <-time.After(10 * time.Second):
					return errors.New("no PING answer")
				}
			}
			return nil
		}()
		conn.Close()
		<-done
		if err != nil {
			return err
		}
	}
	return nil
}

// readFrames answers the server's SETTINGS, reports PING answers and ends
// with the connection (or a GOAWAY).
func readFrames(fr *http2.Framer, conn net.Conn, pong chan<- struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.PingFrame:
			if f.IsAck() {
				select {
				case pong <- struct{}{}:
				default:
				}
			}
		case *http2.GoAwayFrame:
			conn.Close()
			return
		}
	}
}

// 100,000 requests reset by their client, half at each listener of the
// proxy (upgraded requests, which the inbound one downgrades), cost a few
// log lines, not one line each.
func TestClientResetsAreNotLogged(t *testing.T) {
	n := 100_000
	if testing.Short() || raceEnabled {
		n = 10_000
	}
	out := &lines{}
	log := slog.New(slog.NewTextHandler(out, nil))

	// The application speaks HTTP/1 and h2c, as one that receives the
	// requests that arrive as HTTP/2 must.
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	app.Config.Protocols = new(http.Protocols)
	app.Config.Protocols.SetHTTP1(true)
	app.Config.Protocols.SetUnencryptedHTTP2(true)
	app.Start()
	defer app.Close()
	appURL, _ := url.Parse(app.URL)

	var reached atomic.Int64
	count := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached.Add(1)
			h.ServeHTTP(w, r)
		})
	}
	serve := func(srv *http.Server) string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lis = origproto.GuardListener(lis) // as the proxy serves
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("serve: %v", err)
			}
		}()
		t.Cleanup(func() {
			srv.Close()
			<-done
		})
		return lis.Addr().String()
	}

	opts := []mesh.Option{mesh.WithLogger(log)}
	client := mesh.NewClient(mesh.ClientOptions(opts...)...)
	defer client.Close()
	outLog, inLog := proxylog.New(log, "outbound"), proxylog.New(log, "inbound")
	outbound := origproto.NewServer(fullDuplex(count(outboundProxy(client, outLog))))
	outbound.ErrorLog = outLog.ErrorLog()
	toApp, closeApp := appTransport(0)
	defer closeApp()
	inboundStack := mesh.NewServer(count(inboundProxy(appURL, toApp, inLog)), mesh.ServerOptions(opts...)...)
	defer inboundStack.Close()
	inbound := origproto.NewServer(fullDuplex(inboundStack))
	inbound.ErrorLog = inLog.ErrorLog()
	outAddr, inAddr := serve(outbound), serve(inbound)

	// n/2 at each listener, on two connections each, at once.
	start := time.Now()
	errs := make(chan error, 4)
	for _, addr := range []string{outAddr, outAddr, inAddr, inAddr} {
		go func() { errs <- resets(addr, appURL.Host, n/4, "l5d-orig-proto", "HTTP/1.1") }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	lines, first := out.count()
	t.Logf("%d client resets in %v: %d requests reached the proxies, %d log lines",
		n, time.Since(start).Round(time.Millisecond), reached.Load(), lines)
	assert.Greater(t, reached.Load(), int64(n/2), "the resets reached the proxies' handlers")
	assert.LessOrEqual(t, lines, 36, "log lines:\n%s", first)
	assert.NotContains(t, first, "level=WARN", "a client's own cancellation is not a warning")

	// The proxies still answer.
	req, _ := http.NewRequest("GET", "http://"+outAddr+"/", nil)
	req.Host = appURL.Host
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "ok", string(b))
}
