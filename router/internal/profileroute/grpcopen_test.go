package profileroute

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A gRPC call on a ServiceProfile route without response classes whose
// response ends without any grpc-status has the route_* labels of
// Linkerd's proxy: Eos::GrpcOpen ends as Grpc(Ok(Unknown)) (linkerd2-proxy
// linkerd/app/core/src/classify.rs), written classification="success",
// grpc_status="2" (linkerd/app/core/src/metrics.rs), on the route and on
// its attempt. It is a success, so the retryable route does not retry it.
func TestGRPCWithoutStatusHasRouteResponseAsLinkerd(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		m := testutil.NewMetrics(t)
		var calls int
		up := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/pkg.Svc/Call" {
				return
			}
			calls++ // one handler at a time: the test's requests are sequential
			w.Header().Set("Content-Type", "application/grpc")
			_, _ = io.WriteString(w, "\x00\x00\x00\x00\x00")
			w.(http.Flusher).Flush() // data, then the end without trailers
		}))
		router := NewRouter(profiles.NewStaticSource(map[string]*profiles.Profile{testAuthority: profileWith(budget10s, retryRoute("/pkg.Svc/Call"))}),
			WithMeterProvider(m.Provider), WithLogger(quietLogger))
		defer router.Close()
		rt := router.Transport(testutil.NewTransport(t, mode))
		require.Eventually(t, func() bool {
			req, err := http.NewRequest("GET", up.URL+"/load-profile", nil)
			require.NoError(t, err)
			req.Host = testAuthority
			resp, err := rt.RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
			return len(m.Lines(t, "route_request_total", `rt_load_profile="test"`)) > 0
		}, testutil.Timeout, 5*time.Millisecond, "the router has the profile")

		req, err := http.NewRequest(http.MethodPost, up.URL+"/pkg.Svc/Call", nil)
		require.NoError(t, err)
		req.Host = testAuthority
		req.Header.Set("Content-Type", "application/grpc")
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())

		route := []string{`direction="outbound"`, `rt_route="/pkg.Svc/Call"`}
		for _, name := range []string{"route_response_total", "route_actual_response_total"} {
			lines, n := m.Select(t, name, route...)
			require.Equal(t, 1.0, n, "%s: %v", name, lines)
			_, n = m.Select(t, name, append(route, `status_code="200"`, `classification="success"`, `grpc_status="2"`, `error=""`)...)
			assert.Equal(t, 1.0, n, "%s: %v", name, lines)
		}
		assert.Equal(t, 1, calls, "a success is not retried")
	})
}
