package backoff

import (
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/require"
)

// listenSilent serves connections that read everything and say nothing
// (a healthy server of a protocol in which the client speaks first), until
// the test ends.
func listenSilent(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// A client that ends its own read (it closes the connection while it waits
// for its reply, as a cancelled request does, or its read deadline passes)
// has learned nothing of the peer: the next dial to the healthy server is
// not held back.
func TestDialerClientsOwnEndNotAFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(c net.Conn)
	}{
		{"close", func(c net.Conn) {
			read := make(chan error, 1)
			go func() { _, err := c.Read(make([]byte, 1)); read <- err }()
			c.Close()
			<-read
		}},
		{"read deadline", func(c net.Conn) {
			c.SetReadDeadline(time.Now()) // already past: the read times out at once
			_, _ = c.Read(make([]byte, 1))
			c.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := listenSilent(t)
			d := NewDialer(nil, Policy{Min: time.Minute, Max: time.Minute})
			c, err := d.DialContext(context.Background(), "tcp", addr)
			require.NoError(t, err)
			tc.end(c)
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
			defer cancel()
			c, err = d.DialContext(ctx, "tcp", addr)
			require.NoError(t, err, "the next dial to the healthy server (Failures=%d)", d.Failures("tcp", addr))
			c.Close()
		})
	}
}

func readLoops() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "net/http.(*persistConn).readLoop")
}

// HTTP/1 through http.Transport: a request the client cancels before a
// slow (healthy) server answered closes its connection; the next request
// to that server must not wait out the backoff.
func TestDialerHTTPCancelledRequestDoesNotHoldBackNext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	entered := make(chan struct{}, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-r.Context().Done()
		}
	})}
	go srv.Serve(ln)
	defer srv.Close()

	d := NewDialer(nil, Policy{Min: time.Minute, Max: time.Minute})
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+ln.Addr().String()+"/slow", nil)
		_, err := tr.RoundTrip(req)
		errc <- err
	}()
	<-entered
	cancel()
	require.Error(t, <-errc)
	// The cancelled request's connection's read loop has ended.
	require.Eventually(t, func() bool { return readLoops() == 0 }, testutil.Timeout, 5*time.Millisecond)

	ctx2, cancel2 := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel2()
	req, _ := http.NewRequestWithContext(ctx2, "GET", "http://"+ln.Addr().String()+"/", nil)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err, "the next request to the healthy server (Failures=%d)", d.Failures("tcp", ln.Addr().String()))
	resp.Body.Close()
}

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
	addr := listenSilent(t)
	d := NewDialer(nil, Policy{Min: time.Minute, Max: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	for i := range 2 {
		c, err := d.DialContext(ctx, "tcp", addr)
		require.NoError(t, err, "dial %d to a healthy server (Failures=%d)", i+1, d.Failures("tcp", addr))
		_, err = c.Write([]byte("log line\n"))
		require.NoError(t, err)
		c.Close()
	}
}
