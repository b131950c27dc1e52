package authz_test

import (
	"context"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/classify"
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

// With WithLabelledNext an allowed request goes, unchanged and with no
// allocation, to the handler made once for its series, which carries the
// series' labels; requests of another series get another handler.
func TestLabelledNext(t *testing.T) {
	type labelled struct {
		http.Handler
		labels *classify.Labels
	}
	var made []*labelled
	var got *http.Request
	var reached *labelled
	h, err := authz.New(nil, authz.WithDefault(booksServer()), authz.WithMeterProvider(noop.NewMeterProvider()),
		authz.WithLogger(quiet), authz.WithLabelledNext(func(l *classify.Labels) http.Handler {
			lh := &labelled{labels: l}
			lh.Handler = http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got, reached = r, lh })
			made = append(made, lh)
			return lh
		}))
	require.NoError(t, err)
	defer h.Close()
	req := allowedRequest(t)
	w := &nopWriter{h: http.Header{}}
	for range 3 {
		h.ServeHTTP(w, req)
	}
	require.Len(t, made, 1, "one handler for the series")
	assert.Same(t, req, got, "the request passes with no new context")
	assert.Same(t, made[0], reached)
	assert.Zero(t, testing.AllocsPerRun(100, func() { h.ServeHTTP(w, req) }))

	// Another target address is another series.
	other := req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 8080}))
	h.ServeHTTP(w, other)
	require.Len(t, made, 2)
	assert.Same(t, made[1], reached)
	assert.NotEqual(t, made[0].labels, made[1].labels)
}
