package backoff

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/require"
)

// The README's own use of a Dialer: an http.Transport. An HTTP/1 server
// says nothing until it answers; while a healthy server works on the
// first request, the transport's dial for a second, concurrent request is
// not held back (it was when a connection counted as a failure until its
// peer spoke).
func TestDialerHTTPConcurrentRequestNotHeldBack(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	entered := make(chan struct{}, 2)
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	})}
	go srv.Serve(ln)
	defer srv.Close()

	d := NewDialer(nil, Policy{Min: time.Minute, Max: time.Minute})
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	get := func(done chan<- error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+ln.Addr().String()+"/", nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}
	done := make(chan error, 2)
	go get(done)
	<-entered // the first request is at the server
	go get(done)
	select {
	case <-entered:
	case <-time.After(testutil.Timeout):
		t.Errorf("a healthy server's second concurrent request did not reach it: its dial waits out the backoff (Failures=%d)",
			d.Failures("tcp", ln.Addr().String()))
	}
	close(release)
	cancel()
	<-done
	<-done
}

// A protocol in which the client speaks and the server only listens (log
// shipping, a push) is never held back: a connection its peer has not
// spoken on is neither a success nor a failure.
func TestDialerClientSpeaksOnlyNotHeldBack(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	d := NewDialer(nil, Policy{Min: time.Minute, Max: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	for i := range 2 {
		c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
		require.NoError(t, err, "dial %d to a healthy server (Failures=%d)", i+1, d.Failures("tcp", ln.Addr().String()))
		_, err = c.Write([]byte("log line\n"))
		require.NoError(t, err)
		c.Close()
	}
}
