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

// A client that closes its own connection while waiting for the reply (its
// request timed out or was cancelled) has learned nothing about the peer:
// the next dial to the healthy server must not be held back.
func TestDialerLocalCloseNotAFailure(t *testing.T) {
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
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	read := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 1)); read <- err }()
	c.Close() // the client gives up waiting for its reply
	<-read

	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	c, err = d.DialContext(ctx, "tcp", ln.Addr().String())
	require.NoError(t, err, "a dial to a healthy server after the client closed its own connection (Failures=%d)",
		d.Failures("tcp", ln.Addr().String()))
	c.Close()
}

// Same with a read deadline the client set itself.
func TestDialerReadDeadlineNotAFailure(t *testing.T) {
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
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	c.SetReadDeadline(time.Now()) // already past: the read times out at once
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	c, err = d.DialContext(ctx, "tcp", ln.Addr().String())
	require.NoError(t, err, "a dial after the client's own read deadline (Failures=%d)", d.Failures("tcp", ln.Addr().String()))
	c.Close()
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
