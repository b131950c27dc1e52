package faults

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// burstConn opens an h2c connection to addr, sends n requests with the
// header block block at once, and reads until every one is answered (or the
// server ends the connection); it returns how many were answered.
func burstConn(addr string, n int, block []byte) (int, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	bw := bufio.NewWriterSize(c, 64<<10)
	var mu sync.Mutex
	fr := http2.NewFramer(bw, c)
	mu.Lock()
	_, _ = bw.WriteString(http2.ClientPreface)
	_ = fr.WriteSettings()
	for i := range n {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndStream: true, EndHeaders: true})
	}
	err = bw.Flush()
	mu.Unlock()
	if err != nil {
		return 0, err
	}
	rf := http2.NewFramer(io.Discard, c)
	done := 0
	for done < n {
		f, err := rf.ReadFrame()
		if err != nil {
			return done, nil
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				mu.Lock()
				_ = fr.WriteSettingsAck()
				_ = bw.Flush()
				mu.Unlock()
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				done++
			}
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				done++
			}
		case *http2.RSTStreamFrame:
			done++
		case *http2.GoAwayFrame:
			return done, nil
		}
	}
	return done, nil
}

// abuseConn opens an h2c connection to addr, writes what send writes, then
// a PING, and reads until the PING is answered or the server ends the
// connection.
func abuseConn(addr string, send func(fr *http2.Framer) error) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	bw := bufio.NewWriterSize(c, 64<<10)
	fr := http2.NewFramer(bw, c)
	_, _ = bw.WriteString(http2.ClientPreface)
	_ = fr.WriteSettings()
	_ = send(fr) // the server may end the connection before the end
	_ = fr.WritePing(false, [8]byte{'a', 'b', 'u', 's', 'e'})
	_ = bw.Flush()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return nil // ended by the server
		}
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
			return nil
		}
	}
}

// floods are the HTTP/2 abuse cases besides the bursts and resets: each
// writes its frames on a fresh connection after the preface.
func floods(block []byte) map[string]func(fr *http2.Framer) error {
	return map[string]func(fr *http2.Framer) error{
		"CONTINUATION flood": func(fr *http2.Framer) error {
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndStream: true}); err != nil {
				return err
			}
			for range 10000 {
				if err := fr.WriteContinuation(1, false, nil); err != nil {
					return err
				}
			}
			return nil
		},
		"SETTINGS flood": func(fr *http2.Framer) error {
			for range 10000 {
				if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535}); err != nil {
					return err
				}
			}
			return nil
		},
		// A 4000-byte value in the dynamic table, then referred to 2000
		// times: 6 KiB on the wire, 8 MB decoded.
		"HPACK bomb": func(fr *http2.Framer) error {
			var b bytes.Buffer
			enc := hpack.NewEncoder(&b)
			_ = enc.WriteField(hpack.HeaderField{Name: "x-bomb", Value: strings.Repeat("a", 4000)})
			bomb := append(bytes.Clone(block), b.Bytes()...)
			bomb = append(bomb, bytes.Repeat([]byte{0x80 | 62}, 2000)...)
			return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: bomb, EndStream: true, EndHeaders: true})
		},
	}
}

// An HTTP/2 client that sends a burst of requests at once at proxy B's
// downgrade listener makes B open a connection to the application for each
// request in flight (HTTP/1 carries one at a time); afterwards they wait
// in B's pool, two goroutines each. Once traffic settles they are closed
// within the pool's idle timeout (3s, as Linkerd's proxy), and B holds what
// it held before, as its untouched twin would: before, up to 64 of them
// stayed for 90s (B at 148 goroutines against 22 before the burst). The
// other abuse cases (streams reset at once, CONTINUATION and SETTINGS
// floods, an HPACK bomb) run beside the burst and leave nothing either.
func TestStreamBurstLeavesNoAppPool(t *testing.T) {
	m := newMesh(t)
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, h := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", books}, {":path", "/books/1"}, {"l5d-orig-proto", "HTTP/1.1"}} {
		require.NoError(t, enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]}))
	}
	block := buf.Bytes()
	base := usageOf(t, m.b.pid(), m.bMetrics)
	require.GreaterOrEqual(t, base.goroutines, 0, "proxy B exports no go_goroutines")
	t.Logf("baseline: proxy B %v", base)

	conns, streams := size(10, 4), size(1000, 500)
	var answered atomic.Int64
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := burstConn(m.bIn, streams, block)
			assert.NoError(t, err)
			answered.Add(int64(k))
		}()
	}
	// And streams opened and reset at once, as in TestRapidReset, and the
	// floods.
	_, err := resetConn(m.bIn, streams, block)
	require.NoError(t, err)
	for name, send := range floods(block) {
		require.NoError(t, abuseConn(m.bIn, send), name)
	}
	wg.Wait()
	require.Equal(t, int64(conns*streams), answered.Load(), "not every stream of the burst was answered")
	t.Logf("right after: proxy B %v", usageOf(t, m.b.pid(), m.bMetrics))

	// Waiting for the pool's idle timeout, not the transport's 90s; a
	// request through the mesh now and then shows it still serves.
	hc := client(1)
	defer hc.CloseIdleConnections()
	var now usage
	var failed int
	start := time.Now()
	assert.Eventually(t, func() bool {
		if r, err := send(hc, m.aOut, books, "/books/1"); err != nil || r.StatusCode != 200 {
			failed++
		}
		now = usageOf(t, m.b.pid(), m.bMetrics)
		return now.goroutines <= base.goroutines+6 && now.fds <= base.fds+3
	}, 20*time.Second, 100*time.Millisecond, "proxy B still holds what the burst left (the line below)")
	t.Logf("after %v: proxy B %v", time.Since(start).Round(time.Millisecond), now)
	assert.Zero(t, failed, "requests through the mesh failed after the burst")
}
