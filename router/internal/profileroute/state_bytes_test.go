package profileroute

import (
	"math"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestTableStateBytes bounds what the state of an authority without a
// profile, or with one without routes, costs before its first request: a
// proxy holds one for each of the thousands of names it watches.
func TestTableStateBytes(t *testing.T) {
	r := NewRouter(nil, WithLogger(quietLogger))
	defer r.Close()
	// What the builds allocate, the least of a few tries: other
	// goroutines can only add to the count.
	const n = 2000
	perState := math.Inf(1)
	for range 3 {
		states := make([]*tableState, n)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range states {
			states[i] = r.build("books.ns.svc.cluster.local:8080", nil)
		}
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(states)
		perState = min(perState, float64(after.TotalAlloc-before.TotalAlloc)/n)
	}
	t.Logf("%.0f bytes a state", perState)
	assert.LessOrEqual(t, perState, 160.0)
}
