package faults

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	inmesh "github.com/inmesh/inmesh/mesh"
	"github.com/inmesh/inmesh/tap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// smallSendBuffers sets a small kernel send buffer on the connections it
// accepts, so that a client that reads nothing fills it after a few
// kilobytes (loopback's usual buffers would hold megabytes first).
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// serveHTTP serves h on a held loopback port until the test ends, and
// returns its address; wrap, if given, wraps the listener.
func serveHTTP(t *testing.T, h http.Handler, wrap func(net.Listener) net.Listener) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	if wrap != nil {
		lis = wrap(lis)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return addr
}

// p50 returns the median of ds.
func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// A tap whose viewers read nothing while requests flow through a tapped
// inbound stack: one streams /tap over HTTP and never reads (its socket
// buffers are small, so the tap's writes block after a few kilobytes), the
// other is an in-process watcher that never receives. The requests' median
// latency with the stalled viewers stays that without any (the ratio is
// logged; only a generous bound is asserted), no request fails, the
// in-process watcher holds exactly its buffer (256 events) and counts
// every other event as dropped, the HTTP viewer's watcher drops too, and
// the heap stays bounded. When the viewers go away the hub has no watcher
// left and the process's goroutines and heap are back at their baseline.
func TestSlowTapViewer(t *testing.T) {
	hub := tap.NewHub()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	srv := inmesh.NewServer(app, inmesh.WithTap(hub), inmesh.WithMeterProvider(noop.NewMeterProvider()), inmesh.WithLogger(quiet))
	t.Cleanup(srv.Close)
	addr := serveInbound(t, srv)
	hc := &http.Client{Transport: meshClient(t, books, addr, ""), Timeout: 10 * time.Second}
	tapAddr := serveHTTP(t, hub, func(l net.Listener) net.Listener { return smallSendBuffers{l} })

	n := size(20000, 2000) // requests in each phase
	var failed atomic.Int64
	phase := func() []time.Duration {
		lat := make([]time.Duration, 0, n)
		for range n {
			start := time.Now()
			code, err := get(context.Background(), hc, books, books, "/books/1")
			lat = append(lat, time.Since(start))
			if err != nil || code != 200 {
				if failed.Add(1) == 1 {
					t.Logf("a request failed: %d %v", code, err)
				}
			}
		}
		return lat
	}
	phase() // warm up
	base := measure()
	t.Logf("baseline: %v", base)
	without := phase()

	// The viewers: one over HTTP that reads only the response head, then
	// nothing; one in the process that never receives.
	viewer, err := net.DialTimeout("tcp", tapAddr, 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, viewer.(*net.TCPConn).SetReadBuffer(4096))
	_, err = io.WriteString(viewer, "GET /tap HTTP/1.1\r\nHost: localhost\r\n\r\n")
	require.NoError(t, err)
	stalled, err := hub.Watch(tap.Filter{}, 0)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return hub.Stats().Watchers == 2 }, timeout, time.Millisecond, "the HTTP viewer never watched")

	with := phase()
	during := measure()
	stats := hub.Stats()
	ratio := float64(p50(with)) / float64(p50(without))
	t.Logf("p50 without a viewer %v, with two stalled viewers %v (ratio %.2f); hub: %+v; in-process watcher dropped %d; during: %v",
		p50(without), p50(with), ratio, stats, stalled.Dropped(), during)
	assert.Zero(t, failed.Load(), "failed requests")
	assert.LessOrEqual(t, p50(with), 3*p50(without)+2*time.Millisecond, "stalled viewers slowed the requests")
	assert.Equal(t, tap.DefaultBuffer, len(stalled.Events()), "the in-process watcher's buffer is full")
	assert.Equal(t, uint64(n-tap.DefaultBuffer), stalled.Dropped(), "every event past the buffer is dropped, counted")
	assert.Greater(t, stats.Dropped, stalled.Dropped(), "the HTTP viewer's watcher drops too")
	assert.Equal(t, uint64(n), stats.Published, "one event a request")
	assert.LessOrEqual(t, during.heapMiB, base.heapMiB+16, "heap with the stalled viewers")

	// Going away releases everything: the HTTP viewer's connection ends
	// the tap's blocked write.
	viewer.Close()
	stalled.Close()
	require.Eventually(t, func() bool { return hub.Stats().Watchers == 0 }, timeout, time.Millisecond, "watchers left after the viewers went")
	backToBaseline(t, base, 5, 8, nil)

	// And a viewer that reads sees the requests after them.
	resp, err := http.Get("http://" + tapAddr + "/tap")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Eventually(t, func() bool { return hub.Stats().Watchers == 1 }, timeout, time.Millisecond)
	code, err := get(context.Background(), hc, books, books, "/after")
	require.NoError(t, err)
	require.Equal(t, 200, code)
	var e tap.Event
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	assert.Equal(t, "/after", e.Path)
}
