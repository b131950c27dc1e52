package origproto

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each request on a keep-alive connection is checked: those before an
// ambiguous one are answered, the ambiguous one gets 400, the connection
// closes and nothing after it reaches the app.
func TestGuardChecksEveryPipelinedRequest(t *testing.T) {
	m := newWireMesh(t)
	statuses := m.exchange(t, "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"+
		"POST /b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"+
		"GET /c HTTP/1.1\r\nHost: a\r\n\r\n"+
		"POST /d HTTP/1.1\r\nHost: a\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"+smuggled+
		"GET /marker HTTP/1.1\r\nHost: a\r\n\r\n")
	assert.Equal(t, []int{200, 200, 200, 400}, statuses)
	var uris []string
	for _, s := range m.app.requests() {
		uris = append(uris, s.RequestURI)
	}
	assert.Equal(t, []string{"/a", "/b", "/c"}, uris)
}

// The guard holds a request head split across many reads until it is
// whole: byte-at-a-time delivery is checked like one write.
func TestGuardByteByByte(t *testing.T) {
	m := newWireMesh(t)
	conn, err := net.Dial("tcp", m.outbound)
	require.NoError(t, err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(testutil.Timeout))
	data := "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" +
		"POST /b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n" + smuggled
	go func() {
		for i := range len(data) {
			if _, err := conn.Write([]byte{data[i]}); err != nil {
				return
			}
		}
	}()
	br := bufio.NewReader(conn)
	var statuses []int
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		io.Copy(io.Discard, resp.Body)
		statuses = append(statuses, resp.StatusCode)
	}
	assert.Equal(t, []int{200, 400}, statuses)
	require.Len(t, m.app.requests(), 1)
	assert.Equal(t, "hello", m.app.requests()[0].Body)
}

// An Upgrade request that the handler declines ends its connection: the
// bytes after it, which the guard does not check, are never read as a
// request.
func TestGuardDeclinedUpgradeCloses(t *testing.T) {
	m := newWireMesh(t)
	statuses := m.exchange(t, "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: nothing\r\n\r\n"+
		"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"+smuggled)
	assert.Len(t, statuses, 1)
	for _, s := range m.app.requests() {
		assert.Equal(t, "/ws", s.RequestURI)
	}
}

// A chunked POST with a trailer crosses both HTTP/1 hops and the HTTP/2
// hop between them with the trailer's value.
func TestRequestTrailersThroughProxies(t *testing.T) {
	m := newWireMesh(t)
	statuses := m.exchange(t, "POST /t HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\nConnection: close\r\n\r\n"+
		"5\r\nhello\r\n0\r\nX-Sum: 42\r\n\r\n")
	assert.Equal(t, []int{200}, statuses)
	seen := m.app.requests()
	require.Len(t, seen, 1)
	assert.Equal(t, "hello", seen[0].Body)
	assert.Equal(t, "42", seen[0].Trailer.Get("X-Sum"))
}

// BenchmarkGuard compares a keep-alive HTTP/1 connection with and without
// the guard: the guard adds a copy of each read and no allocation per
// request.
func BenchmarkGuard(b *testing.B) {
	for _, guarded := range []bool{false, true} {
		name := "plain"
		if guarded {
			name = "guarded"
		}
		b.Run(name, func(b *testing.B) {
			srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
			}))
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(b, err)
			if guarded {
				lis = GuardListener(lis)
			}
			done := make(chan struct{})
			go func() { defer close(done); srv.Serve(lis) }()
			defer func() { srv.Close(); <-done }()
			conn, err := net.Dial("tcp", lis.Addr().String())
			require.NoError(b, err)
			defer conn.Close()
			req := "POST /x HTTP/1.1\r\nHost: a\r\nUser-Agent: bench\r\nAccept: */*\r\nTransfer-Encoding: chunked\r\n\r\n" +
				"5\r\nhello\r\n" + strings.Repeat("a", 0) + "0\r\n\r\n"
			br := bufio.NewReader(conn)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := io.WriteString(conn, req); err != nil {
					b.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

// readerConn is a net.Conn whose reads come from r in pieces of at most
// step bytes.
type readerConn struct {
	net.Conn
	r    *strings.Reader
	step int
}

func (c *readerConn) Read(b []byte) (int, error) {
	if len(b) > c.step {
		b = b[:c.step]
	}
	return c.r.Read(b)
}

func (c *readerConn) Close() error { return nil }

// FuzzGuard feeds arbitrary bytes through the guard in arbitrary pieces:
// it never panics, hands on the input unchanged up to where it refuses or
// stops, and adds nothing but its own refusal line or Connection: close.
func FuzzGuard(f *testing.F) {
	f.Add("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX: 1\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 3)
	f.Add("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nhello", 1)
	f.Add("GET / HTTP/1.1\r\nUpgrade: x\r\n\r\nanything", 7)
	f.Add(h2Preface+"\x00\x00\x00\x01\x00\x00\x00\x00\x01", 5)
	f.Fuzz(func(t *testing.T, in string, step int) {
		if step <= 0 || step > 1<<16 {
			step = 1
		}
		c := &guardConn{Conn: &readerConn{r: strings.NewReader(in), step: step}, headerTimeout: time.Hour}
		out, _ := io.ReadAll(c)
		c.Close()
		got := string(out)
		got = strings.TrimSuffix(got, refusedLine)
		got = strings.Replace(got, string(connectionClose), "", 1)
		require.True(t, strings.HasPrefix(in, got), "output is not the input: %q from %q", out, in)
	})
}

// A large head within the limit passes whole, and the connection keeps
// serving after it; one past the limit is refused.
func TestGuardLargeHead(t *testing.T) {
	m := newWireMesh(t)
	big := "X-Big: " + strings.Repeat("v", 40<<10) + "\r\n"
	statuses := m.exchange(t, "GET /big HTTP/1.1\r\nHost: a\r\n"+big+"\r\nGET /after HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
	assert.Equal(t, []int{200, 200}, statuses)
	seen := m.app.requests()
	require.Len(t, seen, 2)
	assert.Len(t, seen[0].Header.Get("X-Big"), 40<<10)
	statuses = m.exchange(t, "GET /huge HTTP/1.1\r\nHost: a\r\nX-Big: "+strings.Repeat("v", maxHeadBytes)+"\r\n\r\nGET /after HTTP/1.1\r\nHost: a\r\n\r\n")
	require.NotEmpty(t, statuses)
	assert.GreaterOrEqual(t, statuses[0], 400)
	assert.Len(t, m.app.requests(), 2)
}
