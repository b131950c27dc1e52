package authz_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/identity"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWithoutLocalhostAndWithTarget: a deny Server still admits requests
// from the loopback (Linkerd's localhost authorization), unless the
// handler is made WithoutLocalhost, for a process that shares its machine
// with callers it must not trust; WithTarget makes a sidecar's policy that
// of the application's port, whatever port the request came in on.
func TestWithoutLocalhostAndWithTarget(t *testing.T) {
	deny, err := authz.DefaultServer(authz.Deny, authz.DefaultOptions{})
	require.NoError(t, err)
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	// Port 1 is never a kernel-chosen port, so the listener never has it.
	appPort := netip.MustParseAddrPort("127.0.0.1:1")
	get := func(h http.Handler) int {
		t.Helper()
		srv := httptest.NewServer(h)
		defer srv.Close()
		resp, err := http.Get(srv.URL)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name string
		opts []authz.Option
		want int
	}{
		{"deny, from loopback: the localhost authorization admits", []authz.Option{authz.WithDefault(deny)}, 200},
		{"deny, without localhost", []authz.Option{authz.WithDefault(deny), authz.WithoutLocalhost()}, 403},
		{"the application port's Server denies, as the target", []authz.Option{authz.WithoutLocalhost(),
			authz.WithSource(authz.StaticSource{appPort.Port(): deny}), authz.WithTarget(appPort)}, 403},
		{"the application port's Server, without the target: the listener's port's default", []authz.Option{authz.WithoutLocalhost(),
			authz.WithSource(authz.StaticSource{appPort.Port(): deny})}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := authz.New(app, tc.opts...)
			require.NoError(t, err)
			defer h.Close()
			assert.Equal(t, tc.want, get(h))
		})
	}
}

// TestExplain: Explain says which Server, route and authorization decide a
// request, without serving it.
func TestExplain(t *testing.T) {
	srv := &authz.Server{
		Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-http"},
		Authorizations: []authz.Authz{{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "pods"},
			Networks: []authz.Network{{Net: netip.MustParsePrefix("10.0.0.0/8")}}}},
		RateLimit: &authz.RateLimit{Total: 20},
	}
	h, err := authz.New(http.NotFoundHandler(), authz.WithSource(authz.StaticSource{7000: srv}), authz.WithoutLocalhost())
	require.NoError(t, err)
	defer h.Close()
	req := httptest.NewRequest("GET", "http://books/", nil)
	e := h.Explain(7000, req, netip.MustParseAddr("10.1.2.3"), identity.Peer{})
	assert.Equal(t, "allow", e.Decision)
	assert.Equal(t, "books-http", e.Server.Name)
	require.NotNil(t, e.Route)
	assert.Equal(t, "default", e.Route.Name)
	require.NotNil(t, e.Authorization)
	assert.Equal(t, "pods", e.Authorization.Name)
	assert.Equal(t, uint32(20), e.RateLimit.Total)
	e = h.Explain(7000, req, netip.MustParseAddr("192.168.1.1"), identity.Peer{})
	assert.Equal(t, "deny", e.Decision)
	assert.Nil(t, e.Authorization)
}
