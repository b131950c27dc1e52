package tap

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The events carry the paths (and chosen headers) of the requests, so the
// hub's handler serves loopback clients only unless told otherwise; a
// refused client opens no watcher. Stream serves whoever its caller
// admitted (the dashboard's own rule).
func TestHubServesLoopbackOnly(t *testing.T) {
	admitAll := func(*http.Request) bool { return true }
	for _, tc := range []struct {
		name   string
		opts   []Option
		remote string
		host   string
		serve  func(h *Hub) http.HandlerFunc
		want   int
	}{
		{"loopback", nil, "127.0.0.1:40000", "127.0.0.1:4191", func(h *Hub) http.HandlerFunc { return h.ServeHTTP }, http.StatusOK},
		{"loopback IPv6", nil, "[::1]:40000", "[::1]:4191", func(h *Hub) http.HandlerFunc { return h.ServeHTTP }, http.StatusOK},
		{"IPv4-mapped loopback", nil, "[::ffff:127.0.0.1]:40000", "localhost:4191", func(h *Hub) http.HandlerFunc { return h.ServeHTTP }, http.StatusOK},
		{"loopback, Host localhost without a port", nil, "127.0.0.1:40000", "localhost", func(h *Hub) http.HandlerFunc { return h.ServeHTTP }, http.StatusOK},
		// A page from another name that its DNS pointed at 127.0.0.1
		// (DNS rebinding) asks for its own name.
		{"loopback, Host of another name", nil, "127.0.0.1:40000", "attacker.example:4191", func(h *Hub) http.HandlerFunc { return h.ServeHTTP }, http.StatusForbidden},
		{"loopback, Host of another address", nil, "127.0.0.1:40000", "192.0.2.7:4191", func(h *Hub) http.HandlerFunc { return h.ServeHTTP }, http.StatusForbidden},
		{"another machine", nil, "192.0.2.7:40000", "127.0.0.1:4191", func(h *Hub) http.HandlerFunc { return h.ServeHTTP }, http.StatusForbidden},
		{"no address", nil, "", "127.0.0.1:4191", func(h *Hub) http.HandlerFunc { return h.ServeHTTP }, http.StatusForbidden},
		{"another machine, admitted", []Option{WithAccess(admitAll)}, "192.0.2.7:40000", "tap.example:4191", func(h *Hub) http.HandlerFunc { return h.ServeHTTP }, http.StatusOK},
		{"another machine, Stream", nil, "192.0.2.7:40000", "tap.example:4191", func(h *Hub) http.HandlerFunc { return h.Stream }, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHub(tc.opts...)
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // the client went away at once: an admitted stream ends
			req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/?direction=inbound", nil)
			req.RemoteAddr, req.Host = tc.remote, tc.host
			rec := httptest.NewRecorder()
			tc.serve(h)(rec, req)
			assert.Equal(t, tc.want, rec.Code)
			assert.Zero(t, h.Stats().Watchers, "no watcher left open")
		})
	}
}
