package main

import (
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain lets a scenario run this test binary as its child.
func TestMain(m *testing.M) {
	runChild()
	os.Exit(m.Run())
}

// Every scenario runs to a figure in its smallest form: the bench must not
// rot while the library changes under it. The figures themselves are not
// asserted (they are measured, not tested); a scenario that errors, or
// produces no ratio where it should, fails. host_flood's full size is left
// to the bench itself.
func TestScenariosRun(t *testing.T) {
	if testing.Short() {
		t.Skip("the scenarios take about a minute")
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(stopAll)
	o := options{rounds: 1, short: true}
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			r, err := s.run(o)
			require.NoError(t, err)
			require.NotNil(t, r)
			if r.Skipped != "" {
				if os.Getenv("CI") != "" && (s.name == "sidecar_hop" || s.name == "sidecar_pair") {
					t.Fatalf("skipped in CI: %s", r.Skipped)
				}
				t.Skip(r.Skipped)
			}
			if r.Goal.Max == 0 {
				// A count whose goal is zero (failover's failed
				// requests): zero is the figure hoped for.
				require.NotNil(t, r.Candidate)
				assert.NotZero(t, r.Candidate.Requests, "no requests")
				return
			}
			assert.NotZero(t, r.Ratio, "no ratio")
		})
	}
}
