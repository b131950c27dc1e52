package origproto

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
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
