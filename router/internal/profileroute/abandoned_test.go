package profileroute

import (
	"context"
	"net/http"
	"testing"

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
