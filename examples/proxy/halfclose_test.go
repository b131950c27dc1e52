package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A client that half-closes its connection after a request (shutdown of
// its write side, as `nc -N` and some health checkers do) makes net/http
// cancel the request, and with it the proxy's call to the application.
// Neither listener may then answer a status the application never gave:
// the response is aborted (the connection closes without one), as
// httputil.ReverseProxy aborts a response it cannot finish, where the
// proxy used to write nothing and net/http sent an empty 200 in its name.
func TestHalfClosedClientGetsNoAnswerTheAppDidNotGive(t *testing.T) {
	s := startSidecar(t, nil)
	arrived := make(chan string, 1)
	released := make(chan struct{})
	t.Cleanup(func() { close(released) })
	s.app.setHold(func(r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/half-closed/") {
			return
		}
		arrived <- r.URL.Path
		select { // until the proxy gives up its call, or the test ends
		case <-r.Context().Done():
		case <-released:
		}
	})
	for name, addr := range map[string]string{"inbound": s.inAddr, "outbound": s.outAddr} {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(60*time.Second)))
			_, err = io.WriteString(conn, "GET /half-closed/"+name+" HTTP/1.1\r\nHost: "+s.appAddr+"\r\nConnection: close\r\n\r\n")
			require.NoError(t, err)
			select {
			case p := <-arrived:
				require.Equal(t, "/half-closed/"+name, p)
			case <-time.After(60 * time.Second):
				t.Fatal("the request never reached the application")
			}
			require.NoError(t, conn.(*net.TCPConn).CloseWrite())
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("answered %q with body %q while the application had not answered", resp.Status, body)
			}
		})
	}
}
