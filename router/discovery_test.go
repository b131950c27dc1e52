package router

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatedSource delivers its profile only once released, and says when a
// watch started.
type gatedSource struct {
	p        *profiles.Profile
	watching chan struct{}
	release  chan struct{}
}

func newGatedSource() *gatedSource {
	sps, _ := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local}
spec:
  routes:
  - name: GET /books
    condition: {method: GET, pathRegex: /books}
`))
	return &gatedSource{p: sps[0].ProfileFor(7000), watching: make(chan struct{}, 1), release: make(chan struct{})}
}

func (g *gatedSource) Watch(ctx context.Context, _ string, update func(profiles.Update)) (func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	g.watching <- struct{}{}
	go func() {
		select {
		case <-g.release:
			update(profiles.Update{Profile: g.p})
		case <-ctx.Done():
		}
	}()
	return cancel, nil
}

const discoveryAuthority = "books.default.svc.cluster.local:7000"

func discoveryStack(t *testing.T, src profiles.Source, opts ...Option) (*http.Client, *testutil.Metrics) {
	m := testutil.NewMetrics(t)
	app := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	r := New(append([]Option{WithProfiles(src), WithMeterProvider(m.Provider), WithLogger(quietLogger)}, opts...)...)
	t.Cleanup(r.Close)
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		req = req.Clone(req.Context())
		req.URL.Host = app.Listener.Addr().String()
		return http.DefaultTransport.RoundTrip(req)
	})
	return &http.Client{Transport: r.Transport(base), Timeout: testutil.Timeout}, m
}

// With a discovery wait, the first request to an authority whose profile
// comes later waits for it and takes its route; without one it takes the
// default route at once.
func TestDiscoveryWait(t *testing.T) {
	for _, wait := range []bool{true, false} {
		t.Run(map[bool]string{true: "wait", false: "default"}[wait], func(t *testing.T) {
			src := newGatedSource()
			var opts []Option
			if wait {
				opts = append(opts, WithDiscoveryWait(time.Hour))
			}
			hc, m := discoveryStack(t, src, opts...)
			done := make(chan error, 1)
			go func() {
				resp, err := hc.Get("http://" + discoveryAuthority + "/books")
				if err == nil {
					resp.Body.Close()
				}
				done <- err
			}()
			<-src.watching // the request started the watch
			if wait {
				close(src.release)
				require.NoError(t, <-done)
				assert.Equal(t, "1", m.Value(t, "route_request_total", `rt_route="GET /books"`), "the profile's route, on the first request")
				return
			}
			require.NoError(t, <-done)
			close(src.release)
			assert.Empty(t, m.Lines(t, "route_request_total", `rt_route="GET /books"`), "the default route, at once")
		})
	}
}

// The wait is bounded, and ends with the request.
func TestDiscoveryWaitBounds(t *testing.T) {
	src := newGatedSource() // never released
	hc, _ := discoveryStack(t, src, WithDiscoveryWait(20*time.Millisecond))
	resp, err := hc.Get("http://" + discoveryAuthority + "/books")
	require.NoError(t, err, "past the bound, the default route")
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)

	src2 := newGatedSource()
	hc2, _ := discoveryStack(t, src2, WithDiscoveryWait(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+discoveryAuthority+"/books", nil)
	done := make(chan error, 1)
	go func() {
		resp, err := hc2.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-src2.watching
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A source that never answers costs the bound once per authority: the
// request that waited it out ends the wait for those after it, which take
// the default route at once.
func TestDiscoveryWaitTimedOutOnce(t *testing.T) {
	const bound = 2 * time.Second
	src := newGatedSource() // never released
	hc, _ := discoveryStack(t, src, WithDiscoveryWait(bound))
	get := func() time.Duration {
		start := time.Now()
		resp, err := hc.Get("http://" + discoveryAuthority + "/books")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode)
		return time.Since(start)
	}
	assert.GreaterOrEqual(t, get(), bound, "the first request waits the bound")
	for i := range 3 {
		assert.Less(t, get(), bound/2, "request %d waited again", i+2)
	}
}
