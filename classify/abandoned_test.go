package classify

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request whose client gives up before any response head is counted in
// request_total and has no response: Linkerd's proxy records a response
// when its inner future resolves or its body ends
// (linkerd/http/metrics/src/requests/service.rs), and a response future
// dropped because the client reset the stream or closed the connection
// records nothing. A response nobody received is neither the server's
// failure (a proxy's 502 once its upstream call is cancelled) nor its
// success (the implicit 200 of an application that returns on the
// cancellation without writing). A head that went out before the client
// left is a response, classified as it ended, even when the handler then
// aborts its copy (http.ErrAbortHandler): Linkerd records a response body
// dropped with its client as it ended.
func TestClientGoneBeforeHeadHasNoResponse(t *testing.T) {
	for _, tc := range []struct {
		name string
		// app answers once its client has gone (gone is closed then);
		// headFirst apps write a head before the client goes.
		app       func(w http.ResponseWriter, gone <-chan struct{})
		headFirst bool
		want      []string // the labels of the one response, nil for none
	}{
		{name: "502 after the client left", app: func(w http.ResponseWriter, gone <-chan struct{}) {
			<-gone
			w.WriteHeader(http.StatusBadGateway)
		}},
		{name: "nothing written", app: func(w http.ResponseWriter, gone <-chan struct{}) { <-gone }},
		{name: "head, then the client left", headFirst: true, app: func(w http.ResponseWriter, gone <-chan struct{}) {
			<-gone
		}, want: []string{`status_code="200"`, `classification="success"`, `error=""`}},
		{name: "head, then the copy aborted", headFirst: true, app: func(w http.ResponseWriter, gone <-chan struct{}) {
			<-gone
			panic(http.ErrAbortHandler)
		}, want: []string{`status_code="200"`, `classification="success"`, `error=""`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
				m := testutil.NewMetrics(t)
				arrived := make(chan struct{})
				app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if tc.headFirst {
						w.WriteHeader(http.StatusOK)
						w.(http.Flusher).Flush()
					}
					close(arrived)
					tc.app(w, r.Context().Done())
				})
				served := make(chan struct{})
				h := NewHandler(app, WithMeterProvider(m.Provider))
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
						_, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
					errc <- err
				}()
				<-arrived
				cancel()
				require.Error(t, <-errc)
				<-served

				assert.Equal(t, "1", m.Value(t, "request_total", `direction="inbound"`), "the request is counted")
				responses := m.Lines(t, "response_total", `direction="inbound"`)
				latencies := m.Lines(t, "response_latency_ms_count", `direction="inbound"`)
				if tc.want == nil {
					assert.Empty(t, responses, "a response nobody received")
					assert.Empty(t, latencies, "the latency of a response nobody received")
					return
				}
				assert.Equal(t, "1", m.Value(t, "response_total", append([]string{`direction="inbound"`}, tc.want...)...), "%v", responses)
				assert.Len(t, latencies, 1)
			})
		})
	}
}

// A request the application cancels before the response head has no
// response on the outbound side either: Linkerd's proxy drops the response
// future with the application's stream. A response body the application
// gives up on is classified by its head, as Linkerd classifies a body
// dropped with the application's stream, not as a failure of the
// exchange.
func TestApplicationCancelHasNoResponse(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		m := testutil.NewMetrics(t)
		arrived := make(chan struct{}, 1)
		srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/head" {
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
			}
			arrived <- struct{}{}
			<-r.Context().Done()
		}))
		client := &http.Client{Transport: NewTransport(testutil.NewTransport(t, mode), WithMeterProvider(m.Provider))}

		// Before the head: no response.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+"/hang", nil)
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() {
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		<-arrived
		cancel()
		require.ErrorIs(t, <-errc, context.Canceled)
		assert.Equal(t, "1", m.Value(t, "request_total", `direction="outbound"`))
		assert.Empty(t, m.Lines(t, "response_total", `direction="outbound"`), "a response the application never waited for")
		assert.Empty(t, m.Lines(t, "response_latency_ms_count", `direction="outbound"`))

		// After the head: the response, as its head classifies it.
		ctx, cancel = context.WithCancel(context.Background())
		defer cancel()
		req, err = http.NewRequestWithContext(ctx, "GET", srv.URL+"/head", nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		<-arrived
		cancel()
		_, err = io.Copy(io.Discard, resp.Body)
		require.True(t, errors.Is(err, context.Canceled), "the body's read ends with the cancellation: %v", err)
		resp.Body.Close()
		assert.Equal(t, "2", m.Value(t, "request_total", `direction="outbound"`))
		assert.Equal(t, "1", m.Value(t, "response_total", `direction="outbound"`, `status_code="200"`, `classification="success"`, `error=""`),
			"%v", m.Lines(t, "response_total"))
		assert.Len(t, m.Lines(t, "response_total", `direction="outbound"`), 1)
	})
}

// A timeout of the mesh cancels a request with classify.ErrTimeout as its
// cause: that request was not given up by its caller.
func TestAbandoned(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	assert.False(t, Abandoned(ctx))
	cancel()
	assert.True(t, Abandoned(ctx), "cancelled")

	ctx, cancelCause := context.WithCancelCause(context.Background())
	cancelCause(ErrTimeout)
	assert.False(t, Abandoned(ctx), "a timeout's cancellation")

	ctx, cancel = context.WithTimeout(context.Background(), -1)
	defer cancel()
	assert.False(t, Abandoned(ctx), "a deadline")
}
