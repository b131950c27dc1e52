package origproto

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// After an HTTP/1 CONNECT, its connection is the tunnel's or the server's
// to close: the Transport never pools it, so a server that refused the
// CONNECT (and may read what follows as the tunnel's bytes) never gets
// the next request on it.
func TestHTTP1ConnectConnectionNotReused(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			http.Error(w, "no tunnels here", http.StatusForbidden)
			return
		}
		io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tr := NewTransport()
	t.Cleanup(tr.CloseIdleConnections)
	host := srv.Listener.Addr().String()

	req, err := http.NewRequest(http.MethodConnect, "http://"+host, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)

	req, err = http.NewRequest(http.MethodGet, "http://"+host+"/", nil)
	require.NoError(t, err)
	resp, err = tr.RoundTrip(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.EqualValues(t, 2, conns.Load(), "the GET on a connection of its own")
}
