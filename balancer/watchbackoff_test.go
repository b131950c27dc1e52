package balancer

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/registry"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// warnCounter counts the records logged at warning level or above.
type warnCounter struct{ n atomic.Int64 }

func (h *warnCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *warnCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h *warnCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *warnCounter) WithGroup(string) slog.Handler      { return h }

// An endpoint watch the control-plane client refuses at its bound is
// remembered for the registry's retry delay: 200 requests make one watch attempt and
// one log line and are answered at once (503, cannot resolve); after the
// delay one request tries again, and once the client has room the
// authority's endpoints serve requests (the failure's answer stays until
// the new stream's first message).
func TestFailedEndpointWatchBacksOff(t *testing.T) {
	const held = "held.default.svc.cluster.local:80"
	store := controlplane.NewStore()
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{backend(t, "a")})
	dst := controlPlane(t, store, destination.WithMaxWatches(1), destination.WithIdleTimeout(0))
	stopHeld, err := dst.WatchEndpoints(t.Context(), held, func(endpoint.Update) {})
	require.NoError(t, err)

	logs := &warnCounter{}
	clock := &fakeClock{}
	_, client := newClient(t, dst, WithFallback(false), WithLogger(slog.New(logs)), withClock(clock.read))
	for range 200 {
		status, _, h := fetch(t, client, "http://"+books+":7000/")
		require.Equal(t, 503, status)
		require.Contains(t, h.Get("l5d-proxy-error"), "too many watched authorities")
	}
	assert.Equal(t, uint64(1), dst.Stats().RejectedWatches, "watch attempts for 200 requests")
	assert.Equal(t, int64(1), logs.n.Load(), "log lines for 200 requests")

	clock.now.Add(int64(registry.DefaultRetry.Max))
	for range 50 {
		status, _, _ := fetch(t, client, "http://"+books+":7000/")
		require.Equal(t, 503, status)
	}
	assert.Equal(t, uint64(2), dst.Stats().RejectedWatches, "one attempt after the delay")
	assert.LessOrEqual(t, logs.n.Load(), int64(2))

	// The slot frees; the attempt after the next delay watches.
	stopHeld()
	require.Eventually(t, func() bool { return dst.Stats().EndpointWatches == 0 }, testutil.Timeout, 10*time.Millisecond)
	clock.now.Add(int64(registry.DefaultRetry.Max))
	require.Eventually(t, func() bool {
		status, body, _ := fetch(t, client, "http://"+books+":7000/")
		return status == 200 && strings.HasPrefix(body, "a ")
	}, testutil.Timeout, 10*time.Millisecond, "the endpoints arrive once the watch starts")
	assert.Equal(t, uint64(2), dst.Stats().RejectedWatches)
	assert.Equal(t, 1, dst.Stats().EndpointWatches)
}
