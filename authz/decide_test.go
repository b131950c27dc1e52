package authz_test

import (
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
)

// Decide and Admit, for servers that are not an http.Handler: the same
// decisions as ServeHTTP, Linkerd's message to meshed clients only, the
// limits taken by Admit and the in-flight place given back by Done.
func TestDecideAdmit(t *testing.T) {
	m := testutil.NewMetrics(t)
	now := time.Unix(1000, 0)
	srv := booksServer()
	srv.RateLimit = &authz.RateLimit{Total: 2}
	srv.MaxConcurrentRequests = 1
	h, err := authz.New(nil, authz.WithDefault(srv), authz.WithMeterProvider(m.Provider), authz.WithLogger(quiet),
		authz.WithoutLocalhost(), authz.WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	defer h.Close()
	local := netip.MustParseAddrPort("10.0.0.1:8080")
	conn := func(id string, tls bool) authz.Conn {
		return authz.Conn{Local: local, Remote: netip.MustParseAddrPort("10.0.0.7:40000"),
			Peer: identity.Peer{TLS: tls, ID: id}, HasPeer: true}
	}
	req := func(path string) *http.Request {
		r, err := http.NewRequest("GET", "http://books"+path, nil)
		require.NoError(t, err)
		return r
	}

	d := h.Decide(req("/nothing"), conn(webID, true))
	assert.Equal(t, 404, d.Status)
	assert.Equal(t, "client 10.0.0.7:40000: server: 10.0.0.1:8080: no route found for request", d.Message())
	assert.False(t, h.Admit(&d), "a refused decision is not admitted")

	d = h.Decide(req("/api"), authz.Conn{Local: local, Remote: netip.MustParseAddrPort("10.0.0.7:40000")})
	assert.Equal(t, 403, d.Status)
	assert.Empty(t, d.Message(), "no reason to a plaintext client")

	d = h.Decide(req("/api"), conn(webID, true))
	require.Equal(t, 0, d.Status)
	require.NotNil(t, d.Route)
	assert.Equal(t, "books-api", d.Route.Meta.Name)
	require.True(t, h.Admit(&d))

	d2 := h.Decide(req("/api"), conn(webID, true))
	assert.False(t, h.Admit(&d2))
	assert.Equal(t, 503, d2.Status, "the first request is still in flight")
	d.Done()
	d.Done() // the second time does nothing

	d3 := h.Decide(req("/api"), conn(webID, true))
	assert.False(t, h.Admit(&d3), "the total of 2 was taken by the first two")
	assert.Equal(t, 429, d3.Status)
	assert.Equal(t, "client 10.0.0.7:40000: server: 10.0.0.1:8080: total rate limit exceeded: 2rps", d3.Message())

	assert.Equal(t, "3", m.Value(t, "inbound_http_authz_allow_total"))
	assert.Equal(t, "1", m.Value(t, "inbound_http_concurrency_limit_total"))
	assert.Equal(t, "1", m.Value(t, "inbound_http_local_ratelimit_total"))
}
