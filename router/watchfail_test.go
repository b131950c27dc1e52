package router

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/registry"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refusingPolicies is a policy source at its watch cap: every Watch fails.
type refusingPolicies struct{ calls atomic.Int64 }

func (s *refusingPolicies) Watch(context.Context, string, func(policy.Update)) (func(), error) {
	s.calls.Add(1)
	return nil, policy.ErrTooManyWatches
}

// countingHandler counts log records.
type countingHandler struct{ n atomic.Int64 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (h *countingHandler) Handle(context.Context, slog.Record) error { h.n.Add(1); return nil }
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h *countingHandler) WithGroup(string) slog.Handler             { return h }

// TestFailedWatchIsNotRetriedPerRequest: a policy watch refused (at the
// control-plane client's cap) is attempted again only after the
// registry's retry delay, not on every request, and is logged as often;
// the requests meanwhile take the default route at once.
func TestFailedWatchIsNotRetriedPerRequest(t *testing.T) {
	up := newUpstream(t, nil)
	src := &refusingPolicies{}
	logs := &countingHandler{}
	r := New(WithPolicies(src), WithLogger(slog.New(logs)))
	t.Cleanup(r.Close)
	client := &http.Client{Transport: r.Transport(testutil.NewTransport(t, testutil.H1))}

	start := time.Now()
	for range 200 {
		resp, err := client.Get("http://" + up.srv.Listener.Addr().String() + "/")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, "the default route")
	}
	elapsed := time.Since(start)
	// One attempt, then at most one per retry delay (1 s, less 20%
	// jitter, and growing) while the requests went on.
	bound := 1 + int64(elapsed/(registry.DefaultRetry.Min*8/10))
	assert.LessOrEqual(t, src.calls.Load(), bound, "Watch calls for 200 requests in %v", elapsed)
	assert.LessOrEqual(t, logs.n.Load(), bound, "log records for 200 requests in %v", elapsed)
	assert.Equal(t, int64(200), up.n.Load())
}
