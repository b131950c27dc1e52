package origproto

import (
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
