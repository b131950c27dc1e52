package inmesh

import (
	"testing"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/classify"
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
	for name, d := range map[string]any{
		"router":   router.DefaultIdleTimeout,
		"balancer": balancer.DefaultIdleTimeout,
		"classify": classify.DefaultIdleTimeout,
	} {
		assert.EqualValues(t, registry.DefaultIdle, d, "%s's idle time", name)
	}
}
