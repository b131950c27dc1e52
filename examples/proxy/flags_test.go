package main

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A -workload that is not NS:POD (nor Linkerd's JSON) stops the proxy at
// start with a line that names the flag and the expected form, before it
// listens, instead of a quiet line once a watch is refused.
func TestWorkloadFlagIsChecked(t *testing.T) {
	f := flags{destination: "127.0.0.1:1", outbound: "127.0.0.1:0", inbound: "127.0.0.1:0", app: "127.0.0.1:8080",
		metrics: "127.0.0.1:0", workload: "books-0"}
	done := make(chan error, 1)
	go func() { done <- run(f, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), `-workload (or $LINKERD2_PROXY_POLICY_WORKLOAD): workload "books-0" is not of the form NS:POD (such as default:web-0)`)
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy started with -workload books-0")
	}
}

// A -trace-sampling outside 0..1 stops the proxy at start, naming the flag.
func TestTraceSamplingFlagIsChecked(t *testing.T) {
	_, _, err := startTracing(t.Context(), traceFlags{endpoint: "127.0.0.1:4317", sampling: 2, batch: time.Second})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-trace-sampling 2: not between 0 and 1")
}
