package authz_test

import (
	"context"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/identity"
)

func allowedRequest(t testing.TB) *http.Request {
	req, err := http.NewRequest("GET", "http://books/admin/books?x=1", nil)
	require.NoError(t, err)
	req.RemoteAddr = "10.0.0.7:40000"
	ctx := context.WithValue(req.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 8080})
	ctx = identity.WithPeer(ctx, identity.Peer{TLS: true, ID: webID})
	return req.WithContext(ctx)
}

func BenchmarkAllow(b *testing.B) {
	h, err := authz.New(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		authz.WithDefault(booksServer()), authz.WithMeterProvider(noop.NewMeterProvider()), authz.WithLogger(quiet))
	require.NoError(b, err)
	defer h.Close()
	req := allowedRequest(b)
	w := &nopWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, req)
	}
}
