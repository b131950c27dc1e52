package profileroute

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An inbound request whose client gives up before the response head is
// counted in route_request_total and has no route response, as in
// response_total (classify) and in Linkerd's proxy, which records nothing
// for a response future dropped with its client: the 502 a proxy answers
// once its upstream call is cancelled reaches nobody.
func TestInboundClientGoneBeforeHeadHasNoRouteResponse(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		m := testutil.NewMetrics(t)
		router := NewRouter(profiles.NewStaticSource(nil), WithMeterProvider(m.Provider), WithLogger(quietLogger))
		defer router.Close()
		arrived := make(chan struct{})
		h := router.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(arrived)
			<-r.Context().Done()
			w.WriteHeader(http.StatusBadGateway)
		}))
		served := make(chan struct{})
		srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer close(served)
			h.ServeHTTP(w, r)
		}))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+"/", nil)
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() {
			resp, err := testutil.NewTransport(t, mode).RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		<-arrived
		cancel()
		require.Error(t, <-errc)
		<-served

		assert.Equal(t, "1", m.Value(t, "route_request_total", `direction="inbound"`))
		assert.Empty(t, m.Lines(t, "route_response_total", `direction="inbound"`), "a response nobody received")
		assert.Empty(t, m.Lines(t, "route_response_latency_ms_count", `direction="inbound"`))
	})
}

// An outbound request the application cancels has the route responses
// Linkerd's proxy records for it (linkerd/http/metrics
// src/requests/service.rs, whose route_* series come from the same
// middleware as response_total): none when it gives up before the response
// head, the response future being dropped with it; the response as its
// stream ended when it gives up while reading the body, the body being
// dropped before its end (classify.rs: the class of the head and no
// trailers). The cancellation is the application's, not a failure of the
// route.
func TestOutboundCancelHasRouteResponseAsLinkerd(t *testing.T) {
	for _, tc := range []struct {
		name      string
		headFirst bool     // the upstream sends a head before the cancel
		want      []string // the labels of the one route response, nil for none
	}{
		{name: "cancelled before the head"},
		{name: "cancelled while reading the body", headFirst: true,
			want: []string{`status_code="200"`, `classification="success"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
				m := testutil.NewMetrics(t)
				arrived := make(chan struct{})
				up := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path != "/slow" {
						return
					}
					if tc.headFirst {
						w.WriteHeader(http.StatusOK)
						w.(http.Flusher).Flush()
					}
					close(arrived)
					<-r.Context().Done()
				}))
				router := NewRouter(profiles.NewStaticSource(map[string]*profiles.Profile{testAuthority: profileWith(nil, retryRoute("/slow"))}),
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

				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, "GET", up.URL+"/slow", nil)
				require.NoError(t, err)
				req.Host = testAuthority
				head := make(chan struct{})
				errc := make(chan error, 1)
				go func() {
					resp, err := rt.RoundTrip(req)
					close(head)
					if err == nil {
						_, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
					errc <- err
				}()
				<-arrived
				if tc.headFirst {
					<-head // the caller has the head, and reads the body
				}
				cancel()
				require.ErrorIs(t, <-errc, context.Canceled)

				route := `rt_route="/slow"`
				assert.Equal(t, "1", m.Value(t, "route_request_total", `direction="outbound"`, route))
				lines := m.Lines(t, "route_response_total", `direction="outbound"`, route)
				actual := m.Lines(t, "route_actual_response_total", `direction="outbound"`, route)
				latency := m.Lines(t, "route_response_latency_ms_count", `direction="outbound"`, route)
				if tc.want == nil {
					assert.Empty(t, lines, "a response nobody received")
					assert.Empty(t, actual, "an attempt nobody received")
					assert.Empty(t, latency)
					return
				}
				require.Len(t, lines, 1, "%v", lines)
				for _, l := range tc.want {
					assert.Contains(t, lines[0], l)
				}
				assert.Len(t, actual, 1)
				assert.Len(t, latency, 1)
			})
		})
	}
}
