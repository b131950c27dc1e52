package profileroute

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scripted is an upstream whose attempts follow a script, one function per
// attempt (the last one repeats), run in the caller's goroutine.
type scripted struct {
	attempts []time.Time
	script   []func(req *http.Request) (*http.Response, error)
}

func (s *scripted) RoundTrip(req *http.Request) (*http.Response, error) {
	s.attempts = append(s.attempts, time.Now())
	f := s.script[min(len(s.attempts), len(s.script))-1]
	return f(req)
}

func status(code int, req *http.Request) *http.Response {
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: req, ProtoMajor: 2}
}

// failAfter fails with a 533 after d.
func failAfter(d time.Duration) func(*http.Request) (*http.Response, error) {
	return func(req *http.Request) (*http.Response, error) {
		select {
		case <-time.After(d):
			return status(533, req), nil
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
}

// hang waits for the attempt's context and returns its error.
func hang(req *http.Request) (*http.Response, error) {
	<-req.Context().Done()
	return nil, req.Context().Err()
}

// headAtTimeout returns a response head as the attempt's context ends: the
// head and the timeout arrive together.
func headAtTimeout(req *http.Request) (*http.Response, error) {
	<-req.Context().Done()
	return status(200, req), nil
}

// ctxBody is a response body that yields nothing until its context ends.
type ctxBody struct{ ctx context.Context }

func (b ctxBody) Read([]byte) (int, error) { <-b.ctx.Done(); return 0, b.ctx.Err() }
func (b ctxBody) Close() error             { return nil }

// grpcHeadThenSilence sends a gRPC response head whose status waits on
// trailers, and then nothing until the attempt's context ends.
func grpcHeadThenSilence(req *http.Request) (*http.Response, error) {
	resp := status(200, req)
	resp.Header.Set("Content-Type", "application/grpc")
	resp.Body = ctxBody{req.Context()}
	return resp, nil
}

type timeoutHarness struct {
	router  *Router
	client  *http.Client
	metrics *testutil.Metrics
}

func newTimeoutHarness(t *testing.T, up http.RoundTripper, routes ...profiles.Route) *timeoutHarness {
	ample := &profiles.RetryBudget{RetryRatio: 1, MinRetriesPerSecond: 100, TTL: 10 * time.Second}
	src := profiles.NewStaticSource(map[string]*profiles.Profile{testAuthority: profileWith(ample, routes...)})
	m := testutil.NewMetrics(t)
	router := NewRouter(src, WithLogger(quietLogger), WithMeterProvider(m.Provider))
	t.Cleanup(router.Close)
	router.destFor(testAuthority) // start the watch
	synctest.Wait()
	require.Len(t, router.Table(testAuthority).Routes(), len(routes)+1)
	return &timeoutHarness{router: router, client: &http.Client{Transport: router.Transport(up)}, metrics: m}
}

func (h *timeoutHarness) request(t *testing.T, ctx context.Context, method, path string) (*http.Response, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://127.0.0.1:1"+path, nil)
	require.NoError(t, err)
	req.Host = testAuthority
	if method == "POST" {
		req.Header.Set("Content-Type", "application/grpc")
	}
	start := time.Now()
	resp, err := h.client.Do(req)
	if resp != nil {
		resp.Body.Close()
	}
	return resp, time.Since(start), err
}

func timedRoute(path string, timeout time.Duration) profiles.Route {
	r := retryRoute(path)
	r.Timeout = timeout
	return r
}

// The route timeout runs across the attempts: a retry gets what remains
// of it, not a new one.
func TestTimeoutCoversEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &scripted{script: []func(*http.Request) (*http.Response, error){failAfter(200 * time.Millisecond), hang}}
		h := newTimeoutHarness(t, up, timedRoute("/x", 300*time.Millisecond))
		resp, took, err := h.request(t, t.Context(), "GET", "/x")
		require.NoError(t, err)
		assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
		assert.Equal(t, 300*time.Millisecond, took, "the timeout counts from the request, not from the retry")
		assert.Len(t, up.attempts, 2)
		assert.Equal(t, "1", h.metrics.Value(t, "route_actual_response_total", `rt_route="/x"`, `status_code="533"`))
		assert.Equal(t, "1", h.metrics.Value(t, "route_response_total", `rt_route="/x"`, `error="timeout"`))
		assert.Empty(t, h.metrics.Lines(t, "route_response_total", `rt_route="/x"`, `status_code=`), "a timeout is an error with no status")
	})
}

// A failure that arrives after the timeout fired is not retried: the caller
// gets the 504.
func TestTimeoutStopsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &scripted{script: []func(*http.Request) (*http.Response, error){failAfter(100 * time.Millisecond)}}
		h := newTimeoutHarness(t, up, timedRoute("/x", 250*time.Millisecond))
		resp, took, err := h.request(t, t.Context(), "GET", "/x")
		require.NoError(t, err)
		assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
		assert.Equal(t, 250*time.Millisecond, took, "the attempt under way is cut short")
		assert.Len(t, up.attempts, 3)
		assert.Equal(t, "2", h.metrics.Value(t, "route_actual_response_total", `rt_route="/x"`, `status_code="533"`))
	})
}

// The timeout firing as a response head arrives wins: 504, whatever the
// head said.
func TestTimeoutAsHeadArrives(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &scripted{script: []func(*http.Request) (*http.Response, error){headAtTimeout}}
		h := newTimeoutHarness(t, up, timedRoute("/x", 100*time.Millisecond))
		resp, took, err := h.request(t, t.Context(), "GET", "/x")
		require.NoError(t, err)
		assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
		assert.Contains(t, resp.Header.Get("l5d-proxy-error"), "timed out")
		assert.Equal(t, 100*time.Millisecond, took)
		assert.Equal(t, "1", h.metrics.Value(t, "route_response_total", `rt_route="/x"`, `error="timeout"`))
		assert.Empty(t, h.metrics.Lines(t, "route_response_total", `rt_route="/x"`, `status_code=`), "a timeout is an error with no status")
	})
}

// A response held to read its trailers is held under the timeout: a head
// followed by silence gives the timeout's answer when it fires, to this
// gRPC request in gRPC's form (DEADLINE_EXCEEDED, trailers-only).
func TestTimeoutBoundsTrailerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &scripted{script: []func(*http.Request) (*http.Response, error){grpcHeadThenSilence}}
		h := newTimeoutHarness(t, up, timedRoute("/x", 200*time.Millisecond))
		resp, took, err := h.request(t, t.Context(), "POST", "/x")
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "4", resp.Header.Get("Grpc-Status"))
		assert.Contains(t, resp.Header.Get("l5d-proxy-error"), "timed out")
		assert.Equal(t, 200*time.Millisecond, took)
		assert.Len(t, up.attempts, 1)
	})
}

// A caller that cancels between attempts gets its cancellation back, never
// a 504 timeout, and the request has no route response (the failed
// attempt before it has its route_actual_ one), as in Linkerd's proxy.
func TestCallerCancelBetweenAttemptsIsNotATimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancelThenFail := func(req *http.Request) (*http.Response, error) {
			cancel()
			return status(533, req), nil
		}
		up := &scripted{script: []func(*http.Request) (*http.Response, error){cancelThenFail, failAfter(0)}}
		h := newTimeoutHarness(t, up, timedRoute("/x", time.Second))
		_, took, err := h.request(t, ctx, "GET", "/x")
		require.Error(t, err)
		assert.True(t, errors.Is(err, context.Canceled), "the caller's cancellation: %v", err)
		assert.Zero(t, took)
		assert.Len(t, up.attempts, 1, "no attempt after the caller gave up")
		assert.Empty(t, h.metrics.Lines(t, "route_response_total", `error="timeout"`))
		assert.Empty(t, h.metrics.Lines(t, "route_response_total", `status_code="504"`))
		assert.Empty(t, h.metrics.Lines(t, "route_response_total", `rt_route="/x"`), "a request its caller gave up")
		assert.Equal(t, "1", h.metrics.Value(t, "route_actual_response_total", `rt_route="/x"`, `status_code="533"`))
	})
}

// A caller that cancels during an attempt gets the error, not a 504, and
// neither the request nor the attempt has a route response.
func TestCallerCancelDuringAttemptIsNotATimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		up := &scripted{script: []func(*http.Request) (*http.Response, error){hang}}
		h := newTimeoutHarness(t, up, timedRoute("/x", time.Second))
		time.AfterFunc(100*time.Millisecond, cancel)
		_, took, err := h.request(t, ctx, "GET", "/x")
		require.Error(t, err)
		assert.True(t, errors.Is(err, context.Canceled), "%v", err)
		assert.Equal(t, 100*time.Millisecond, took)
		assert.Empty(t, h.metrics.Lines(t, "route_response_total", `rt_route="/x"`), "a request its caller gave up")
		assert.Empty(t, h.metrics.Lines(t, "route_actual_response_total", `rt_route="/x"`), "an attempt its caller gave up")
	})
}
