package router

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingSource counts the watches of a source that are still open.
type countingSource struct {
	policy.Source
	open atomic.Int64
}

func (c *countingSource) Watch(ctx context.Context, authority string, update func(policy.Update)) (func(), error) {
	stop, err := c.Source.Watch(ctx, authority, update)
	if err != nil {
		return nil, err
	}
	c.open.Add(1)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			stop()
			c.open.Add(-1)
		}
	}, nil
}

// Policy watches are bounded (the least recently used one is released past
// the bound) and released once no request used them for the idle timeout;
// a later request watches its authority anew and is routed by its policy
// again.
func TestPolicyWatchesBoundedAndReleased(t *testing.T) {
	up := newUpstream(t, nil)
	static := policy.NewStaticSource(nil)
	static.Set(authority, httpPolicy(policy.HTTPRule{Backends: to(up.backend("web"))}))
	src := &countingSource{Source: static}
	r := New(WithPolicies(src), WithMaxAuthorities(3), WithIdleTimeout(100*time.Millisecond))
	t.Cleanup(r.Close)

	for i := range 10 {
		r.Explain(httptest.NewRequest("GET", fmt.Sprintf("http://host-%d.test/", i), nil))
		assert.LessOrEqual(t, src.open.Load(), int64(3), "watches past the bound")
	}
	require.Eventually(t, func() bool { return src.open.Load() == 0 }, testutil.Timeout, 10*time.Millisecond,
		"idle watches released")

	req := httptest.NewRequest("GET", "http://svc.test/", nil)
	require.Eventually(t, func() bool { return r.Explain(req).Model == ModelPolicy }, testutil.Timeout, 10*time.Millisecond)
	assert.Equal(t, int64(1), src.open.Load())
}
