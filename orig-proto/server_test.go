package origproto

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Shutdown drains requests in flight on both protocols and refuses new
// connections.
func TestServerDrains(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		started, release := make(chan struct{}), make(chan struct{})
		srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-release
			io.WriteString(w, "finished")
		}))
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		served := make(chan error, 1)
		go func() { served <- srv.Serve(lis) }()

		client := &http.Client{Transport: testutil.NewTransport(t, mode)}
		result := make(chan string, 1)
		go func() {
			resp, err := client.Get("http://" + lis.Addr().String() + "/slow")
			if err != nil {
				result <- err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			result <- string(b)
		}()
		<-started
		shutdown := make(chan error, 1)
		go func() { shutdown <- srv.Shutdown(context.Background()) }()
		// New connections are refused once Shutdown closed the listener.
		require.Eventually(t, func() bool {
			c, err := net.Dial("tcp", lis.Addr().String())
			if err == nil {
				c.Close()
			}
			return err != nil
		}, testutil.Timeout, time.Millisecond)
		close(release)
		assert.Equal(t, "finished", <-result, "the request in flight completed")
		assert.NoError(t, <-shutdown)
		assert.ErrorIs(t, <-served, http.ErrServerClosed)
	})
}

func TestServerLimits(t *testing.T) {
	srv := NewServer(http.NotFoundHandler())
	assert.Equal(t, 64<<10, srv.MaxHeaderBytes)
	assert.True(t, srv.Protocols.HTTP1() && srv.Protocols.UnencryptedHTTP2() && !srv.Protocols.HTTP2())
}

// An HTTP/1 request that asks to upgrade its connection to h2c reaches the
// application without the ask, whether the server's handler is the mesh's
// receiving side or the application itself: an application that answers
// the upgrade (golang.org/x/net/http2/h2c) would serve the connection's
// later streams past the stack. Other upgrades stay as sent.
func TestServerStripsH2CUpgrade(t *testing.T) {
	for _, tc := range []struct {
		name, head    string
		upgrade, conn []string
	}{
		// GuardListener adds close to a request asking for an upgrade.
		{"h2c alone", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n", nil, []string{"close"}},
		{"h2c beside websocket", "Connection: keep-alive, Upgrade, HTTP2-Settings\r\nUpgrade: websocket, h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n",
			[]string{"websocket"}, []string{"keep-alive", "Upgrade", "close"}},
		{"HTTP2-Settings without Upgrade", "HTTP2-Settings: AAMAAABkAAQAAP__\r\n", nil, nil},
		{"H2C in capitals", "Connection: upgrade\r\nUpgrade: H2C\r\n", nil, []string{"close"}},
	} {
		for _, wrap := range []string{"NewHandler", "application"} {
			t.Run(tc.name+"/"+wrap, func(t *testing.T) {
				seen := make(chan http.Header, 1)
				var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen <- r.Header.Clone() })
				if wrap == "NewHandler" {
					h = NewHandler(h)
				}
				srv := NewServer(h)
				lis, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				go srv.Serve(GuardListener(lis))
				t.Cleanup(func() { srv.Close() })
				conn, err := net.Dial("tcp", lis.Addr().String())
				require.NoError(t, err)
				defer conn.Close()
				require.NoError(t, conn.SetDeadline(time.Now().Add(testutil.Timeout)))
				_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: books\r\n"+tc.head+"\r\n")
				require.NoError(t, err)
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, http.StatusOK, resp.StatusCode, "no upgrade")
				got := <-seen
				assert.Equal(t, tc.upgrade, got["Upgrade"])
				assert.Equal(t, tc.conn, got["Connection"])
				assert.Empty(t, got["Http2-Settings"])
			})
		}
	}
}

// An identity is what TLS verified, never a client's word: a
// l5d-client-id that a client sends as a request trailer, on HTTP/1
// (chunked, declared in Trailer or not) or HTTP/2, never reaches the
// application, nor, from a client that is not trusted, any other l5d-*
// trailer. Other trailers arrive. NewServer removes a claimed identity on
// its own, without NewHandler in front of the application (which then
// trusts every client's other l5d-* trailers), on plaintext connections
// too, where one used to reach the application.
func TestClaimedIdentityTrailersRemoved(t *testing.T) {
	const claimed = "admin.default.serviceaccount.identity.linkerd.cluster.local"
	server, client, _ := certifiedPair(t)
	serve := func(t *testing.T, trusted, meshed, handler bool) (addr string, got chan http.Header) {
		got = make(chan http.Header, 1)
		var app http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			got <- r.Trailer.Clone()
		})
		if handler {
			app = NewHandler(app, WithTrust(func(*http.Request) bool { return trusted }))
		}
		srv := NewServer(app)
		srv.ErrorLog = quietLogger
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		l := lis
		if meshed {
			l = MeshTLSListener(lis, server)
		}
		go srv.Serve(GuardListener(l))
		t.Cleanup(func() { srv.Close() })
		return lis.Addr().String(), got
	}
	// dial connects in plaintext, or in meshed mTLS with the client's
	// certificate (HTTP/2 inside it with prior knowledge).
	dial := func(meshed bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			raw, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil || !meshed {
				return raw, err
			}
			tc := tls.Client(raw, client.ClientConfig(booksID))
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			return struct{ net.Conn }{tc}, nil // not a *tls.Conn: no ALPN needed
		}
	}
	for _, tc := range []struct {
		name string
		send func(t *testing.T, addr string, meshed bool)
	}{
		{"HTTP/1 declared", func(t *testing.T, addr string, meshed bool) {
			rawTrailers(t, dial(meshed), addr, "Trailer: L5d-Client-Id, L5d-Dst-Override, X-Checksum\r\n")
		}},
		{"HTTP/1 undeclared", func(t *testing.T, addr string, meshed bool) { rawTrailers(t, dial(meshed), addr, "") }},
		{"HTTP/2", func(t *testing.T, addr string, meshed bool) {
			req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/", nil)
			require.NoError(t, err)
			req.ContentLength = -1
			req.Trailer = http.Header{ClientIDHeader: nil, "L5d-Dst-Override": nil, "X-Checksum": nil}
			req.Body = &trailerSetter{Reader: strings.NewReader("body"), trailer: req.Trailer,
				set: map[string]string{ClientIDHeader: claimed, "L5d-Dst-Override": "x:1", "X-Checksum": "abc"}}
			rt := &http.Transport{Protocols: new(http.Protocols), DialContext: dial(meshed)}
			rt.Protocols.SetUnencryptedHTTP2(true)
			defer rt.CloseIdleConnections()
			resp, err := rt.RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
		}},
	} {
		for _, meshed := range []bool{false, true} {
			for _, trusted := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/meshed=%v/trusted=%v", tc.name, meshed, trusted), func(t *testing.T) {
					addr, got := serve(t, trusted, meshed, true)
					tc.send(t, addr, meshed)
					tr := <-got
					assert.Empty(t, tr.Get(ClientIDHeader), "claimed identity")
					assert.Equal(t, "abc", tr.Get("X-Checksum"), "other trailers arrive")
					if trusted {
						assert.Equal(t, "x:1", tr.Get("L5d-Dst-Override"), "a trusted client's other l5d-* trailers arrive")
					} else {
						assert.Empty(t, tr.Get("L5d-Dst-Override"), "no l5d-* from a client not trusted")
					}
				})
			}
			t.Run(fmt.Sprintf("%s/meshed=%v/without NewHandler", tc.name, meshed), func(t *testing.T) {
				addr, got := serve(t, true, meshed, false)
				tc.send(t, addr, meshed)
				tr := <-got
				assert.Empty(t, tr.Get(ClientIDHeader), "claimed identity")
				assert.Equal(t, "abc", tr.Get("X-Checksum"), "other trailers arrive")
			})
		}
	}
}

// rawTrailers sends a chunked HTTP/1 POST whose trailers claim an
// identity, with the extra header lines head, on a connection of dial,
// and reads its response.
func rawTrailers(t *testing.T, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr, head string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	conn, err := dial(ctx, "tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(testutil.Timeout)))
	_, err = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: books\r\nTransfer-Encoding: chunked\r\n"+head+"\r\n"+
		"4\r\nbody\r\n0\r\nL5d-Client-Id: admin.default.serviceaccount.identity.linkerd.cluster.local\r\n"+
		"L5d-Dst-Override: x:1\r\nX-Checksum: abc\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	resp.Body.Close()
}

// trailerSetter is a request body that sets its trailers' values at its
// end, as net/http's client reads them after the body.
type trailerSetter struct {
	*strings.Reader
	trailer http.Header
	set     map[string]string
}

func (s *trailerSetter) Read(p []byte) (int, error) {
	n, err := s.Reader.Read(p)
	if err == io.EOF {
		for k, v := range s.set {
			s.trailer.Set(k, v)
		}
	}
	return n, err
}

func (s *trailerSetter) Close() error { return nil }
