package authz_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/inmesh/inmesh/authz"
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
