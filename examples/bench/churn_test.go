package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every workload of registration_churn is accepted and leaves, and every
// watcher of its Service sees it come and go: nothing is lost while
// registrations and departures overlap on the control plane.
//
// A Get stream is sent the difference between what it was last sent and
// the set now: a workload that comes and goes while a stream is still
// sending an earlier update is never sent to it, by design. So each
// workload lives 1 s, far longer than a stream lags; with 100 ms, beside
// a second copy of the suite under the race detector, one watcher of 80
// missed one workload.
func TestRegistrationChurnSeesEverything(t *testing.T) {
	cfg := churnConfig{workloads: 40, services: 4, watchers: 8, rate: 200, life: time.Second}
	rep, cpu, err := runChurn(cfg)
	require.NoError(t, err)
	assert.Equal(t, cfg.workloads, rep.Registered)
	assert.Equal(t, cfg.workloads, rep.Deregistered)
	want := cfg.workloads * cfg.watchers / cfg.services
	assert.Equal(t, want, rep.Expected)
	assert.Equal(t, want, rep.Adds, "registrations a watcher never saw")
	assert.Equal(t, want, rep.Removes, "departures a watcher never saw")
	assert.Positive(t, rep.AddP99)
	assert.Positive(t, rep.RemoveP99)
	assert.Positive(t, cpu)
}
