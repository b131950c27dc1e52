package faults

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// resetConn opens an h2c connection to addr and sends HEADERS then
// RST_STREAM for streams until n are done or the server ends the
// connection; it returns how many it reset.
func resetConn(addr string, n int, block []byte) (int, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	bw := bufio.NewWriterSize(c, 64<<10)
	var mu sync.Mutex // the framer's writes: this loop and the reader's acks
	fr := http2.NewFramer(bw, c)
	mu.Lock()
	_, _ = bw.WriteString(http2.ClientPreface)
	_ = fr.WriteSettings()
	_ = bw.Flush()
	mu.Unlock()
	var closed atomic.Bool
	pong := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer closed.Store(true)
		rf := http2.NewFramer(io.Discard, c)
		for {
			f, err := rf.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					mu.Lock()
					_ = fr.WriteSettingsAck()
					_ = bw.Flush()
					mu.Unlock()
				}
			case *http2.PingFrame:
				if f.IsAck() {
					close(pong)
				}
			case *http2.GoAwayFrame:
				return
			}
		}
	}()
	done := 0
	for id := uint32(1); done < n && !closed.Load(); id += 2 {
		mu.Lock()
		err = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: true, EndHeaders: true})
		if err == nil {
			err = fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
		if err == nil && done%50 == 49 {
			err = bw.Flush()
		}
		mu.Unlock()
		if err != nil {
			break
		}
		done++
	}
	// The server answers a PING after reading every frame before it: the
	// connection stays up until the server has seen all the streams.
	mu.Lock()
	_ = fr.WritePing(false, [8]byte{'i', 'n', 'm', 'e', 's', 'h'})
	_ = bw.Flush()
	mu.Unlock()
	select {
	case <-pong:
	case <-readerDone:
	case <-time.After(30 * time.Second):
	}
	c.Close()
	<-readerDone
	return done, nil
}

// Streams opened and reset at once (HEADERS then RST_STREAM), 10
// connections at a time at proxy B's downgrade listener: afterwards its
// open files, memory and goroutines are back near where they were, and
// the mesh still serves.
func TestRapidReset(t *testing.T) {
	m := newMesh(t)
	total := size(100000, 10000)
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, h := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", books}, {":path", "/books/1"}, {"l5d-orig-proto", "HTTP/1.1"}} {
		require.NoError(t, enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]}))
	}
	block := buf.Bytes()
	// Warm up the paths the streams take, then the baseline.
	_, err := resetConn(m.bIn, 200, block)
	require.NoError(t, err)
	base := usageOf(t, m.b.pid(), m.bMetrics)
	t.Logf("baseline: proxy B %v", base)

	const conns = 10
	var sent, dials atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A connection the server ends (as Go's server does when
			// resets outrun its handlers) is replaced; bounded in count.
			left := total / conns
			for range 1000 {
				if left <= 0 {
					return
				}
				dials.Add(1)
				k, err := resetConn(m.bIn, left, block)
				if err != nil {
					return
				}
				left -= k
				sent.Add(int64(k))
			}
		}()
	}
	wg.Wait()
	t.Logf("%d streams reset over %d connections in %v", sent.Load(), dials.Load(), time.Since(start).Round(time.Millisecond))
	require.GreaterOrEqual(t, sent.Load(), int64(total))
	t.Logf("right after: proxy B %v", usageOf(t, m.b.pid(), m.bMetrics))

	// A Go process returns memory after a collection, and collects only
	// as it allocates: ordinary requests through the mesh keep it
	// allocating while the state left by the resets is checked.
	hc := client(4)
	defer hc.CloseIdleConnections()
	var now usage
	var failed int
	assert.Eventually(t, func() bool {
		for range 200 {
			if r, err := send(hc, m.aOut, books, "/books/1"); err != nil || r.StatusCode != 200 {
				failed++
			}
		}
		now = usageOf(t, m.b.pid(), m.bMetrics)
		return now.fds <= base.fds+10 && now.rssMiB <= base.rssMiB+50 &&
			(base.goroutines < 0 || now.goroutines <= base.goroutines+10)
	}, 20*time.Second, 100*time.Millisecond, "proxy B did not come back: %v (baseline %v)", now, base)
	t.Logf("after: proxy B %v", now)
	assert.Zero(t, failed, "requests through the mesh failed after the resets")
}
