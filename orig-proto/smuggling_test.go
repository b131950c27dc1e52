package origproto

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wireMesh is the mesh with real HTTP/1 hops at both ends, where smuggling
// lives: client -> outbound proxy (HTTP/1) -> h2 -> inbound peer ->
// ReverseProxy over HTTP/1 -> app server.
type wireMesh struct {
	app      *app
	outbound string
}

func newWireMesh(t *testing.T) *wireMesh {
	m := &wireMesh{app: newApp()}
	appSrv := httptest.NewServer(m.app) // HTTP/1 only
	t.Cleanup(appSrv.Close)
	appURL, _ := url.Parse(appSrv.URL)
	toApp := &http.Transport{}
	t.Cleanup(toApp.CloseIdleConnections)
	inbound := httptest.NewUnstartedServer(nil)
	inbound.Config = NewServer(NewHandler(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(appURL)
			pr.Out.Host = pr.In.Host
			pr.Out.Trailer = pr.In.Trailer // filled in as the body is read
		},
		Transport: toApp,
	}))
	inbound.Listener = GuardListener(inbound.Listener)
	inbound.Start()
	t.Cleanup(inbound.Close)
	inboundURL, _ := url.Parse(inbound.URL)
	h2 := NewH2Transport()
	t.Cleanup(h2.CloseIdleConnections)
	outbound := httptest.NewUnstartedServer(nil)
	outbound.Config = NewServer(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(inboundURL)
			pr.Out.Host = pr.In.Host
			pr.Out.Trailer = pr.In.Trailer
		},
		Transport: NewTransport(WithH2(h2), WithHint(func(*http.Request) bool { return true })),
	})
	outbound.Listener = GuardListener(outbound.Listener)
	outbound.Start()
	t.Cleanup(outbound.Close)
	m.outbound = strings.TrimPrefix(outbound.URL, "http://")
	return m
}

const smuggled = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"

func TestSmugglingCorpus(t *testing.T) {
	m := newWireMesh(t)
	const reject = "\x00reject"
	cases := []struct {
		name, request, body string
	}{
		{"CL+TE", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, reject},
		{"TE+CL", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + smuggled, reject},
		{"CL+TE folded", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 40\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n" + smuggled, reject},
		{"TE folded", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + smuggled, reject},
		{"CL folded", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\t5\r\n\r\nhello" + smuggled, reject},
		{"CL+TE identity", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: identity\r\n\r\nhello" + smuggled, reject},
		{"TE chunked,identity", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n", reject},
		{"TE empty", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\nContent-Length: 5\r\n\r\nhello" + smuggled, reject},
		{"TE with OWS", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  chunked \t\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "hello"},
		{"TE name with space before colon", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\nhello" + smuggled, reject},
		{"bare LF in header line", "POST / HTTP/1.1\r\nHost: a\r\nX-A: 1\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello" + smuggled, reject},
		{"bare LF line endings", "GET / HTTP/1.1\nHost: a\n\n", reject},
		{"bare LF ends head", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\nhello" + smuggled, reject},
		{"chunked trailer obs-fold", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n folded\r\n\r\n" + smuggled, reject},
		{"chunked with trailer", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n" + smuggled, "hello"},
		{"leading empty line", "\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", reject},
		{"two different CL", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 40\r\n\r\nhello" + smuggled, reject},
		{"CL list", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 40\r\n\r\nhello" + smuggled, reject},
		{"same CL twice", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", "hello"},
		{"negative CL", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\nhello", reject},
		{"plus CL", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello", reject},
		{"hex CL", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\nhello", reject},
		{"TE identity,chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + smuggled, reject},
		{"TE xchunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + smuggled, reject},
		{"TE gzip,chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", reject},
		{"TE twice", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", reject},
		{"TE mixed case", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "hello"},
		{"TE on HTTP/1.0", "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + smuggled, reject},
		{"chunk extension", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\n\r\n", "hello"},
		{"bare LF chunk size", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n" + smuggled, reject},
		{"chunk size overflow", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nhello\r\n0\r\n\r\n", reject},
		{"chunk too short", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nhello\r\n0\r\n\r\n", reject},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: a\r\nX-Folded: one\r\n two\r\n\r\n", reject},
		{"NUL in value", "GET / HTTP/1.1\r\nHost: a\r\nX-Bad: a\x00b\r\n\r\n", reject},
		{"bare CR in value", "GET / HTTP/1.1\r\nHost: a\r\nX-Bad: a\rX-Injected: 1\r\n\r\n", reject},
		{"CR/LF in Host", "GET / HTTP/1.1\r\nHost: a\rX-Injected: 1\r\n\r\n", reject},
		{"space in name", "GET / HTTP/1.1\r\nHost: a\r\nX Bad: 1\r\n\r\n", reject},
		{"space before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", reject},
		{"bad char in name", "GET / HTTP/1.1\r\nHost: a\r\nX@Bad: 1\r\n\r\n", reject},
		{"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", reject},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", reject},
		{"bad Host", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", reject},
		{"double space request line", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", reject},
		{"absolute-form with other Host", "GET http://books.ns:7000/ HTTP/1.1\r\nHost: other\r\n\r\n", ""},
		{"Connection lists l5d-orig-proto", "GET / HTTP/1.1\r\nHost: a\r\nConnection: l5d-orig-proto, l5d-dst-override\r\n\r\n", ""},
		{"Connection lists Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\nhello" + smuggled, "hello"},
		{"Connection lists Transfer-Encoding", "POST / HTTP/1.1\r\nHost: a\r\nConnection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + smuggled, "hello"},
		{"Connection lists Host", "GET / HTTP/1.1\r\nHost: a\r\nConnection: Host\r\n\r\n", ""},
		{"h2c upgrade with body", "POST / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Length: 5\r\n\r\nhello", "hello"},
		{"expect continue", "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello", "hello"},
		{"huge header", "GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\n\r\n", reject},
		{"unknown version", "GET / HTTP/1.2\r\nHost: a\r\n\r\n", ""},
		{"HTTP/2 version on HTTP/1", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", reject},
	}
	require.GreaterOrEqual(t, len(cases), 30)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(m.app.requests())
			// The case, then a marker that closes the connection: every
			// request the proxy answers on this connection is answered
			// before the marker's response, or the connection ends first.
			statuses := m.exchange(t, tc.request+"GET /marker HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
			require.NotEmpty(t, statuses, "no response at all")
			var got []seenRequest
			answered := len(statuses) // responses to the case's own requests
			for _, s := range m.app.requests()[before:] {
				if s.RequestURI == "/marker" {
					answered--
					continue
				}
				got = append(got, s)
			}
			if tc.body == reject {
				assert.GreaterOrEqual(t, statuses[0], 400, "accepted")
				for _, s := range statuses {
					// The marker was never answered: the connection closed.
					assert.GreaterOrEqual(t, s, 400, "the connection stayed open after the refusal")
				}
				assert.Empty(t, got, "a rejected request reached the app")
				return
			}
			assert.Less(t, statuses[0], 400)
			require.NotEmpty(t, got)
			assert.Equal(t, tc.body, got[0].Body)
			assert.Empty(t, got[0].Header.Values(Header))
			assert.Empty(t, got[0].Header.Values("Transfer-Encoding"))
			// Anything else the app saw, the proxy answered as a request
			// of its own: the hops agree on where each request ends.
			for _, s := range got[1:] {
				assert.Equal(t, "/smuggled", s.RequestURI)
			}
			assert.LessOrEqual(t, len(got), answered, "the app saw a request the proxy never answered")
		})
	}
}

// exchange writes raw bytes on a new connection and returns the status of
// every response read until the connection closes.
func (m *wireMesh) exchange(t *testing.T, data string) []int {
	t.Helper()
	conn, err := net.Dial("tcp", m.outbound)
	require.NoError(t, err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(testutil.Timeout))
	go io.WriteString(conn, data)
	br := bufio.NewReader(conn)
	var statuses []int
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return statuses
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
	}
}
