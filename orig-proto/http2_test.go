package origproto

import (
	"net/http"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What reaches a bare HTTP/1 + h2c server through the Transport, peer or
// not: a request that must stay HTTP/2 (it arrived as HTTP/2, or it is
// gRPC, whatever ProtoMajor its client set) goes as HTTP/2 without
// l5d-orig-proto; gRPC-Web and plain HTTP/1 keep today's behaviour.
func TestHTTP2OnlyRequestsStayHTTP2(t *testing.T) {
	got := make(chan string, 1)
	server := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Proto + " " + r.Header.Get(Header)
	}))
	for _, tc := range []struct {
		name        string
		peer        bool
		protoMajor  int
		contentType string
		want        string
	}{
		{"http2 to a peer", true, 2, "", "HTTP/2.0 "},
		{"http2 to a non-peer", false, 2, "", "HTTP/2.0 "},
		{"grpc built as HTTP/1.1 to a non-peer", false, 1, "application/grpc", "HTTP/2.0 "},
		{"grpc+proto to a peer", true, 1, "application/grpc+proto", "HTTP/2.0 "},
		{"grpc with parameters", false, 1, "application/grpc; charset=utf-8", "HTTP/2.0 "},
		{"grpc-web to a non-peer", false, 1, "application/grpc-web", "HTTP/1.1 "},
		{"grpc-web to a peer is upgraded", true, 1, "application/grpc-web", "HTTP/2.0 HTTP/1.1"},
		{"http1 to a peer is upgraded", true, 1, "", "HTTP/2.0 HTTP/1.1"},
		{"http1 to a non-peer", false, 1, "", "HTTP/1.1 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTransport(WithHint(func(*http.Request) bool { return tc.peer }))
			defer tr.h1.(*http.Transport).CloseIdleConnections()
			defer tr.h2.(*http.Transport).CloseIdleConnections()
			req, err := http.NewRequest(http.MethodPost, server.URL+"/pkg.Svc/Method", strings.NewReader("x"))
			require.NoError(t, err)
			if tc.protoMajor == 2 {
				req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/2.0", 2, 0
			}
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, tc.want, <-got)
		})
	}
}
