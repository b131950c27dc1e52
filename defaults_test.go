package inmesh

import (
	"testing"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/registry"
	"github.com/inmesh/inmesh/router"
	"github.com/stretchr/testify/assert"
)

// TestDefaultsAreDefinedOnce: the authority bound and the idle time of the
// layers that keep per-authority state are the one default the registry
// defines, not copies that drift apart (classify once allowed 1,000
// authorities for 5 minutes while the router allowed 2,000 for 1).
func TestDefaultsAreDefinedOnce(t *testing.T) {
	for name, n := range map[string]int{
		"router":      router.DefaultMaxAuthorities,
		"balancer":    balancer.DefaultMaxAuthorities,
		"classify":    classify.DefaultMaxAuthorities,
		"destination": destination.DefaultMaxWatches,
	} {
		assert.Equal(t, registry.DefaultMaxEntries, n, "%s's authority bound", name)
	}
	// The control plane's default bound on one Watches stream (and on a
	// peer's Linkerd streams) holds every watch of a client at the 10,000
	// names the library aims for, its headroom included: n + n/16 watches
	// of each of three kinds (destination.WithMaxWatches). At 30,000, a
	// client at 10,000 names had 4% of its new names' first answers
	// refused by the control plane under a churn past its full table.
	assert.GreaterOrEqual(t, controlplane.DefaultMaxSubscriptions, 3*(10000+10000/16))
	assert.GreaterOrEqual(t, controlplane.DefaultMaxStreamsPerPeer, 3*(10000+10000/16))
	for name, d := range map[string]any{
		"router":   router.DefaultIdleTimeout,
		"balancer": balancer.DefaultIdleTimeout,
		"classify": classify.DefaultIdleTimeout,
	} {
		assert.EqualValues(t, registry.DefaultIdle, d, "%s's idle time", name)
	}
}
