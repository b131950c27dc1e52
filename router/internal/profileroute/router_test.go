package profileroute

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testAuthority = "profiles.test.svc.cluster.local:80"

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// upstream is the server of Linkerd's profile tests: /0.5 fails with 533
// and succeeds on the next call, and so on.
type upstream struct {
	mu     sync.Mutex
	calls  map[string]int
	bodies map[string][]string // request bodies seen, by path
}

func newUpstream() *upstream {
	return &upstream{calls: map[string]int{}, bodies: map[string][]string{}}
}

func (u *upstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[path]
}

func (u *upstream) seen(path string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.bodies[path]...)
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.calls[r.URL.Path]++
	n := u.calls[r.URL.Path]
	u.bodies[r.URL.Path] = append(u.bodies[r.URL.Path], string(body))
	u.mu.Unlock()
	odd := n%2 == 1
	switch r.URL.Path {
	case "/load-profile":
		w.WriteHeader(http.StatusCreated)
	case "/0.5":
		if odd {
			w.WriteHeader(533)
			return
		}
		io.WriteString(w, "retried")
	case "/0.5/body": // a 503 with a body, then success
		if odd {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "failed")
			return
		}
		io.WriteString(w, "retried")
	case "/0.5/100KB":
		if odd {
			w.WriteHeader(533)
			w.Write(bytes.Repeat([]byte("x"), 100*1024))
			return
		}
		io.WriteString(w, "retried")
	case "/slow":
		select {
		case <-r.Context().Done():
		case <-time.After(testutil.Timeout):
		}
		io.WriteString(w, "too late")
	case "/grpc/headers": // trailers-only failure, then success
		w.Header().Set("Content-Type", "application/grpc")
		if odd {
			w.Header().Set("Grpc-Status", "14")
			w.WriteHeader(http.StatusOK)
			return
		}
		w.Header().Set("Trailer", "Grpc-Status")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "retried")
		w.Header().Set("Grpc-Status", "0")
	case "/grpc/empty-trailers": // no data, failure in the trailers, then success
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if odd {
			w.Header().Set("Grpc-Status", "14")
			return
		}
		io.WriteString(w, "retried")
		w.Header().Set("Grpc-Status", "0")
	case "/grpc/trailers", "/grpc/success-trailers", "/grpc/frames":
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		w.WriteHeader(http.StatusOK)
		for i := range 3 {
			fmt.Fprintf(w, "frame-%d;", i)
			w.(http.Flusher).Flush()
		}
		status := "0"
		if odd && r.URL.Path == "/grpc/trailers" {
			status = "14"
		}
		w.Header().Set("Grpc-Status", status)
	default:
		http.NotFound(w, r)
	}
}

type harness struct {
	t       *testing.T
	up      *upstream
	url     string
	client  *http.Client
	metrics *testutil.Metrics
	router  *Router
	source  *profiles.StaticSource
}

func newHarness(t *testing.T, mode testutil.Mode, p *profiles.Profile) *harness {
	up := newUpstream()
	srv := testutil.NewServer(t, up)
	m := testutil.NewMetrics(t)
	src := profiles.NewStaticSource(map[string]*profiles.Profile{testAuthority: p})
	router := NewRouter(src, WithMeterProvider(m.Provider), WithLogger(quietLogger))
	t.Cleanup(router.Close)
	h := &harness{t: t, up: up, url: srv.URL, metrics: m, router: router, source: src,
		client: &http.Client{Transport: router.Transport(testutil.NewTransport(t, mode))}}
	h.waitProfile()
	return h
}

// waitProfile waits until the router has the profile, as Linkerd's tests do
// by looping on /load-profile until its route label shows in the metrics.
func (h *harness) waitProfile() {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		h.do("GET", "/load-profile", nil)
		return len(h.metrics.Lines(h.t, "route_request_total", `rt_load_profile="test"`)) > 0
	}, testutil.Timeout, 5*time.Millisecond, "profile never arrived")
}

func (h *harness) do(method, path string, body io.Reader) (int, string) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, body)
	require.NoError(h.t, err)
	req.Host = testAuthority
	resp, err := h.client.Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	return resp.StatusCode, string(b)
}

var loadProfile = profiles.Route{Condition: profiles.PathRegex("/load-profile"), Labels: map[string]string{"load_profile": "test"}}

func profileWith(budget *profiles.RetryBudget, routes ...profiles.Route) *profiles.Profile {
	return &profiles.Profile{FullyQualifiedName: "profiles.test.svc.cluster.local", RetryBudget: budget, Routes: append([]profiles.Route{loadProfile}, routes...)}
}

func retryRoute(path string) profiles.Route {
	return profiles.Route{Condition: profiles.PathRegex(path), Retryable: true, Labels: map[string]string{"route": path}}
}

var budget10s = &profiles.RetryBudget{RetryRatio: 0.1, MinRetriesPerSecond: 1, TTL: 10 * time.Second}

func TestRetryIfProfileAllows(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		h := newHarness(t, mode, profileWith(budget10s, retryRoute("/0.5")))
		status, body := h.do("GET", "/0.5", nil)
		assert.Equal(t, 200, status)
		assert.Equal(t, "retried", body)
		assert.Equal(t, 2, h.up.count("/0.5"))
		assert.Equal(t, "1", h.metrics.Value(t, "route_actual_response_total", `rt_route="/0.5"`, `status_code="533"`, `classification="failure"`))
		assert.Equal(t, "1", h.metrics.Value(t, "route_actual_response_total", `rt_route="/0.5"`, `status_code="200"`, `classification="success"`))
		assert.Equal(t, "2", h.metrics.Value(t, "route_actual_request_total", `rt_route="/0.5"`))
		assert.Equal(t, "1", h.metrics.Value(t, "route_request_total", `rt_route="/0.5"`))
		assert.Equal(t, "1", h.metrics.Value(t, "route_response_total", `rt_route="/0.5"`, `status_code="200"`))
		assert.Equal(t, "1", h.metrics.Value(t, "route_retryable_total", `rt_route="/0.5"`, `direction="outbound"`, `dst="profiles.test.svc.cluster.local:80"`))
	})
}

func TestRetryUsesBudget(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		h := newHarness(t, mode, profileWith(&profiles.RetryBudget{RetryRatio: 0.1, MinRetriesPerSecond: 1, TTL: time.Second}, retryRoute("/0.5")))
		status, _ := h.do("GET", "/0.5", nil)
		assert.Equal(t, 200, status, "the first failure is retried")
		status, _ = h.do("GET", "/0.5", nil)
		assert.Equal(t, 533, status, "the budget is spent")
		assert.Equal(t, "1", h.metrics.Value(t, "route_retryable_total",
			`direction="outbound"`, `dst="profiles.test.svc.cluster.local:80"`, `rt_route="/0.5"`, `skipped="no_budget"`))
	})
}

// TestNonRetryableRoutesEarnNoBudget: only a profile's retryable routes
// earn its retry budget, as in linkerd2-proxy, where only they have a
// retry policy (linkerd/service-profiles/src/proto.rs;
// linkerd/app/outbound/src/http/retry.rs). With no minimum per second, a
// failure on the retryable route is not retried on budget earned by the
// traffic of another route.
func TestNonRetryableRoutesEarnNoBudget(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		h := newHarness(t, mode, profileWith(&profiles.RetryBudget{RetryRatio: 0.5, MinRetriesPerSecond: 0, TTL: time.Minute},
			retryRoute("/0.5")))
		for range 20 {
			status, _ := h.do("GET", "/load-profile", nil)
			require.Equal(t, http.StatusCreated, status)
		}
		status, _ := h.do("GET", "/0.5", nil)
		assert.Equal(t, 533, status, "retried on budget earned by another route")
		assert.Equal(t, 1, h.up.count("/0.5"))

		// Its own answers earn it, each answer not retried depositing: of
		// three more requests, answered, failing (refused, depositing
		// nothing) and answered, the two answers make a whole retry for
		// the next failure.
		for range 3 {
			h.do("GET", "/0.5", nil)
		}
		status, _ = h.do("GET", "/0.5", nil)
		assert.Equal(t, 200, status, "retried on the route's own budget")
		assert.Equal(t, 6, h.up.count("/0.5"))
	})
}

func TestDoesNotRetryIfRequestDoesNotMatch(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		h := newHarness(t, mode, profileWith(budget10s, retryRoute("/wont/match/anything")))
		status, _ := h.do("GET", "/0.5", nil)
		assert.Equal(t, 533, status)
		assert.Equal(t, 1, h.up.count("/0.5"))
		assert.Equal(t, "1", h.metrics.Value(t, "route_response_total", `status_code="533"`, `classification="failure"`),
			"recorded on the default route")
		assert.Empty(t, h.metrics.Lines(t, "route_response_total", `status_code="533"`, `rt_`))
	})
}

func TestDoesNotRetryIfEarlierResponseClassIsSuccess(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		r := retryRoute("/0.5")
		r.ResponseClasses = []profiles.ResponseClass{
			{Condition: profiles.StatusRange{Min: 533, Max: 533}, IsFailure: false},
			{Condition: profiles.StatusRange{Min: 500, Max: 599}, IsFailure: true},
		}
		h := newHarness(t, mode, profileWith(budget10s, r))
		status, _ := h.do("GET", "/0.5", nil)
		assert.Equal(t, 533, status)
		assert.Equal(t, "1", h.metrics.Value(t, "route_response_total", `rt_route="/0.5"`, `status_code="533"`, `classification="success"`))
	})
}

func TestRetryWithSmallBody(t *testing.T) {
	for _, method := range []string{"POST", "PUT"} {
		t.Run(method, func(t *testing.T) {
			testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
				h := newHarness(t, mode, profileWith(budget10s, retryRoute("/0.5")))
				status, body := h.do(method, "/0.5", strings.NewReader("request body"))
				assert.Equal(t, 200, status)
				assert.Equal(t, "retried", body)
				assert.Equal(t, []string{"request body", "request body"}, h.up.seen("/0.5"), "the body is replayed whole")
			})
		})
	}
}

// streamingBody is a body without a length, sent in chunks.
type streamingBody struct {
	chunks [][]byte
}

func (b *streamingBody) Read(p []byte) (int, error) {
	if len(b.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.chunks[0])
	b.chunks[0] = b.chunks[0][n:]
	if len(b.chunks[0]) == 0 {
		b.chunks = b.chunks[1:]
	}
	return n, nil
}

func chunks(n, size int) *streamingBody {
	b := &streamingBody{}
	for i := range n {
		b.chunks = append(b.chunks, bytes.Repeat([]byte{byte('a' + i%26)}, size))
	}
	return b
}

func TestRetryWithoutContentLength(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		h := newHarness(t, mode, profileWith(budget10s, retryRoute("/0.5")))
		status, _ := h.do("POST", "/0.5", chunks(4, 1024))
		assert.Equal(t, 200, status)
		seen := h.up.seen("/0.5")
		require.Len(t, seen, 2)
		assert.Equal(t, 4096, len(seen[1]))
		assert.Equal(t, seen[0], seen[1], "the replay is byte-identical, nothing sent twice")
	})
}

func TestDoesNotRetryIfBodyIsTooLong(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		h := newHarness(t, mode, profileWith(budget10s, retryRoute("/0.5")))
		body := bytes.Repeat([]byte("x"), MaxRetryBodyBytes+1)
		status, _ := h.do("POST", "/0.5", bytes.NewReader(body))
		assert.Equal(t, 533, status)
		assert.Equal(t, []string{string(body)}, h.up.seen("/0.5"))
	})
}

func TestDoesNotRetryIfStreamingBodyExceedsMaxLength(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		h := newHarness(t, mode, profileWith(budget10s, retryRoute("/0.5")))
		body := chunks(17, 4096) // 68 KiB, no length
		var want bytes.Buffer
		for _, c := range body.chunks {
			want.Write(c)
		}
		status, _ := h.do("POST", "/0.5", body)
		assert.Equal(t, 533, status)
		seen := h.up.seen("/0.5")
		require.Len(t, seen, 1)
		assert.Equal(t, sha256.Sum256(want.Bytes()), sha256.Sum256([]byte(seen[0])), "the body arrives whole, once")
	})
}

func TestDoesNotRetryWithoutValidBudget(t *testing.T) {
	budgets := map[string]*profiles.RetryBudget{
		"missing":        nil,
		"ttl 1000s":      {RetryRatio: 0.1, MinRetriesPerSecond: 1, TTL: 1000 * time.Second},
		"ratio 10000":    {RetryRatio: 10000, MinRetriesPerSecond: 1, TTL: 10 * time.Second},
		"negative ratio": {RetryRatio: -1, MinRetriesPerSecond: 1, TTL: 10 * time.Second},
	}
	for name, b := range budgets {
		t.Run(name, func(t *testing.T) {
			testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
				h := newHarness(t, mode, profileWith(b, retryRoute("/0.5")))
				status, _ := h.do("GET", "/0.5", nil)
				assert.Equal(t, 533, status)
				assert.Equal(t, 1, h.up.count("/0.5"))
			})
		})
	}
}

// On a route with response classes that match none of its answers, an
// answer's class waits on its trailers; an HTTP/1 response's trailers are
// not waited for, so its head decides, and a 503 with a body is retried as
// Linkerd's proxy retries it (linkerd/http/retry/src/peek_trailers.rs,
// PeekTrailersBody::map_response, which peeks on HTTP/2 only, and
// linkerd/app/core/src/classify.rs, whose unmatched profile class is the
// status's). Before, its first chunk was waited for, and a response with
// data went to the caller unretried.
func TestRetryUnmatchedFailureOverHTTP1(t *testing.T) {
	r := retryRoute("/0.5/body")
	r.ResponseClasses = []profiles.ResponseClass{{Condition: profiles.StatusRange{Min: 418, Max: 418}, IsFailure: true}}
	h := newHarness(t, testutil.H1, profileWith(budget10s, r))
	status, body := h.do("GET", "/0.5/body", nil)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "retried", body)
	assert.Equal(t, 2, h.up.count("/0.5/body"))
	assert.Equal(t, "1", h.metrics.Value(t, "route_actual_response_total", `rt_route="/0.5/body"`, `status_code="503"`, `classification="failure"`))
}

func TestTimeout(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		r := retryRoute("/slow")
		r.Timeout = 100 * time.Millisecond
		h := newHarness(t, mode, profileWith(budget10s, r))
		req, err := http.NewRequest("GET", h.url+"/slow", nil)
		require.NoError(t, err)
		req.Host = testAuthority
		resp, err := h.client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
		assert.Contains(t, resp.Header.Get("l5d-proxy-error"), "timed out")
		assert.Equal(t, "1", h.metrics.Value(t, "route_response_total",
			`direction="outbound"`, `dst="profiles.test.svc.cluster.local:80"`, `rt_route="/slow"`,
			`classification="failure"`, `error="timeout"`))
		// Linkerd's route metrics sit outside its timeout: they see the
		// error, not the 504 the proxy answers with
		// (linkerd/app/outbound/src/http/logical/profile.rs), and record
		// no status (linkerd/http/metrics/src/requests/service.rs).
		assert.Empty(t, h.metrics.Lines(t, "route_response_total", `rt_route="/slow"`, `status_code=`), "a timeout is an error with no status")
	})
}

func TestGRPCRetry(t *testing.T) {
	cases := []struct {
		path       string
		wantCalls  int
		wantStatus string
		// h1: an HTTP/1 response's trailers are not waited for
		// (linkerd/http/retry/src/peek_trailers.rs,
		// PeekTrailersBody::map_response): its failure in them stands.
		h1Calls  int
		h1Status string
	}{
		{"/grpc/headers", 2, "0", 0, ""},          // retries_failure_in_headers (trailers-only)
		{"/grpc/empty-trailers", 2, "0", 1, "14"}, // no data, then a failure in the trailers
		{"/grpc/trailers", 1, "14", 0, ""},        // data went to the caller: the failure in its trailers stands
		{"/grpc/success-trailers", 1, "0", 0, ""}, // does_not_retry_success_in_trailers
		{"/grpc/frames", 1, "0", 0, ""},           // does_not_eat_multiple_data_frame_body
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
				tc := tc
				if mode == testutil.H1 && tc.h1Calls != 0 {
					tc.wantCalls, tc.wantStatus = tc.h1Calls, tc.h1Status
				}
				h := newHarness(t, mode, profileWith(budget10s, retryRoute(tc.path)))
				req, err := http.NewRequest("POST", h.url+tc.path, strings.NewReader("call"))
				require.NoError(t, err)
				req.Host = testAuthority
				req.Header.Set("Content-Type", "application/grpc")
				resp, err := h.client.Do(req)
				require.NoError(t, err)
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, tc.wantCalls, h.up.count(tc.path))
				assert.Equal(t, tc.wantStatus, resp.Trailer.Get("Grpc-Status"))
				switch {
				case tc.wantCalls == 2:
					assert.Equal(t, "retried", string(body))
				case tc.path == "/grpc/empty-trailers":
					assert.Empty(t, body, "the failure passes through")
				default:
					assert.Equal(t, "frame-0;frame-1;frame-2;", string(body), "every frame passes through")
				}
				class := "success"
				if tc.wantStatus != "0" {
					class = "failure"
				}
				assert.Equal(t, "1", h.metrics.Value(t, "route_response_total", `rt_route="`+tc.path+`"`, `grpc_status="`+tc.wantStatus+`"`, `classification="`+class+`"`))
			})
		})
	}
}

// Linkerd's http2_failures_dont_leak_connection_window: a failed response
// with a 100 KB body is retried and the success is still readable.
func TestFailuresDontLeakConnectionWindow(t *testing.T) {
	h := newHarness(t, testutil.H2C, profileWith(&profiles.RetryBudget{RetryRatio: 1, MinRetriesPerSecond: 100, TTL: 10 * time.Second}, retryRoute("/0.5/100KB")))
	for range 20 { // 20 × 100 KB of discarded failures is far past the 64 KiB window
		status, body := h.do("GET", "/0.5/100KB", nil)
		require.Equal(t, 200, status)
		require.Equal(t, "retried", body)
	}
}

// slowSource holds every watch's first update until released.
type slowSource struct {
	*profiles.StaticSource
	release chan struct{}
}

func (s *slowSource) Watch(ctx context.Context, authority string, update func(profiles.Update)) (func(), error) {
	return s.StaticSource.Watch(ctx, authority, func(u profiles.Update) {
		select {
		case <-s.release:
		case <-ctx.Done():
			return
		}
		update(u)
	})
}

func TestFirstRequestDoesNotWaitForProfile(t *testing.T) {
	up := newUpstream()
	srv := testutil.NewServer(t, up)
	m := testutil.NewMetrics(t)
	src := &slowSource{StaticSource: profiles.NewStaticSource(map[string]*profiles.Profile{testAuthority: profileWith(budget10s, retryRoute("/0.5"))}), release: make(chan struct{})}
	router := NewRouter(src, WithMeterProvider(m.Provider), WithLogger(quietLogger))
	defer router.Close()
	client := &http.Client{Transport: router.Transport(testutil.NewTransport(t, testutil.H1)), Timeout: testutil.Timeout}

	req, _ := http.NewRequest("GET", srv.URL+"/0.5", nil)
	req.Host = testAuthority
	resp, err := client.Do(req) // the profile is held back: this must not wait for it
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 533, resp.StatusCode, "default route: no retry")
	assert.Empty(t, m.Lines(t, "route_request_total", `rt_route`), "no route labels on the default route")

	close(src.release)
	require.Eventually(t, func() bool {
		return router.Table(testAuthority) != nil && len(router.Table(testAuthority).Routes()) == 2
	}, testutil.Timeout, 5*time.Millisecond)
	req, _ = http.NewRequest("GET", srv.URL+"/0.5", nil)
	req.Host = testAuthority
	resp, err = client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "533 retried once the profile arrived")
}

// A profile that does not compile at all (more routes than the bound)
// keeps the last good table; one with a part that does not compile
// applies without that part, as Linkerd's proxy does.
func TestBadUpdateKeepsLastGoodTable(t *testing.T) {
	h := newHarness(t, testutil.H1, profileWith(budget10s, retryRoute("/0.5")))
	good := h.router.Table(testAuthority)
	tooMany := make([]profiles.Route, profiles.MaxRoutes+1)
	for i := range tooMany {
		tooMany[i] = profiles.Route{Condition: profiles.Method("GET")}
	}
	h.source.Set(testAuthority, &profiles.Profile{Routes: tooMany})
	// A later good update proves the bad one was processed first.
	h.source.Set(testAuthority, profileWith(budget10s, retryRoute("/0.5"), retryRoute("/x")))
	require.Eventually(t, func() bool { return len(h.router.Table(testAuthority).Routes()) == 3 }, testutil.Timeout, 5*time.Millisecond)
	assert.NotSame(t, good, h.router.Table(testAuthority))

	// With only a bad update, the good table stays.
	cur := h.router.Table(testAuthority)
	h.source.Set(testAuthority, &profiles.Profile{Routes: tooMany})
	time.Sleep(testutil.ShortTimeout)
	assert.Same(t, cur, h.router.Table(testAuthority))
	status, _ := h.do("GET", "/0.5", nil)
	assert.Equal(t, 200, status)

	// A route whose regex does not compile is left out; the rest applies.
	partial := profileWith(budget10s, profiles.Route{Condition: profiles.MatchAny{profiles.PathRegex("**")}}, retryRoute("/0.5"))
	h.source.Set(testAuthority, partial)
	require.Eventually(t, func() bool { return h.router.Table(testAuthority).Profile() == partial }, testutil.Timeout, 5*time.Millisecond)
	assert.Len(t, h.router.Table(testAuthority).Routes(), 3, "the any left empty matches nothing, and stays")
	assert.Equal(t, "/0.5", h.router.Table(testAuthority).SelectPath("GET", "/0.5").Labels["route"])
}

func TestProfileSwapKeepsRouteInFlight(t *testing.T) {
	src := profiles.NewStaticSource(map[string]*profiles.Profile{testAuthority: versioned(0)})
	router := NewRouter(src, WithLogger(quietLogger), WithLocalAuthorities(testAuthority))
	defer router.Close()
	release := make(chan struct{})
	var started sync.WaitGroup
	var mismatches, served atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first := RouteFromContext(r.Context())
		if r.URL.Path == "/warm" {
			return
		}
		started.Done()
		<-release
		if RouteFromContext(r.Context()) != first || first.ResponseClassifier() != classify.FromContext(r.Context()) {
			mismatches.Add(1)
		}
		served.Add(1)
		io.WriteString(w, first.Labels["version"])
	})
	srv := testutil.NewServer(t, router.Handler(app))
	tr := testutil.NewTransport(t, testutil.H1)
	tr.MaxConnsPerHost = 0
	client := &http.Client{Transport: tr}

	// Let the first version arrive.
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest("GET", srv.URL+"/warm", nil)
		req.Host = testAuthority
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
		return router.Table(testAuthority) != nil && len(router.Table(testAuthority).Routes()) == 1
	},
		testutil.Timeout, 5*time.Millisecond)
	const inflight = 1000
	started.Add(inflight)
	var wg sync.WaitGroup
	versions := make([]string, inflight)
	errs := make(chan error, inflight)
	for i := range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", srv.URL+"/work", nil)
			req.Host = testAuthority
			resp, err := client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 {
				errs <- fmt.Errorf("status %d", resp.StatusCode)
			}
			versions[i] = string(b)
		}()
	}
	started.Wait() // every request holds a route of version 0
	for v := 1; v <= 100; v++ {
		src.Set(testAuthority, versioned(v))
	}
	require.Eventually(t, func() bool {
		return router.Table(testAuthority).Routes()[0].Labels["version"] == "100"
	}, testutil.Timeout, 5*time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Equal(t, int32(inflight), served.Load())
	assert.Zero(t, mismatches.Load())
	for _, v := range versions {
		assert.Equal(t, "0", v, "each request kept the route it started with")
	}
}

func versioned(v int) *profiles.Profile {
	return &profiles.Profile{Routes: []profiles.Route{{Condition: profiles.PathRegex("/.*"), Labels: map[string]string{"version": fmt.Sprint(v)}}}}
}
