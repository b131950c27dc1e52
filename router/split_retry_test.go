package router

import (
	"sync/atomic"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
)

// A retry of a policy route draws its backend from the rule's
// random-available distribution again, as Linkerd's proxy retries a route
// above the distribution over its backends
// (linkerd/app/outbound/src/http/logical/policy/route.rs,
// Route::layer: NewHttpRetry wraps NewDistribute). With one backend that
// always answers 503 and one that answers 200, evenly weighted, and up to
// 5 retries, a request fails only when all six attempts draw the broken
// backend.
func TestPolicyRetryDrawsItsBackendAgain(t *testing.T) {
	const requests = 200
	var fail, ok atomic.Int64
	fail.Store(503)
	ok.Store(200)
	var nA, nB atomic.Int64
	eps := map[string][]endpoint.Endpoint{
		"a.ns.svc.cluster.local:80": {countingEndpoint(t, "a", &fail, &nA)},
		"b.ns.svc.cluster.local:80": {countingEndpoint(t, "b", &ok, &nB)},
	}
	p := httpPolicy(policy.HTTPRule{
		Backends: policy.Distribution{Kind: policy.DistributionRandomAvailable, Backends: []policy.RouteBackend{
			balancerBackend("a", "a.ns.svc.cluster.local:80"), balancerBackend("b", "b.ns.svc.cluster.local:80")}},
		Retry: &policy.Retry{MaxRetries: 5, StatusRanges: fiveXX}})
	f := newHealthFixture(t, p, eps)
	succeeded := 0
	for range requests {
		if resp, _ := f.get(t); resp.StatusCode == 200 {
			succeeded++
		}
	}
	// Drawn per attempt, about 3 in 200 fail; drawn once, about 100 would.
	assert.GreaterOrEqual(t, succeeded, requests*9/10, "requests that succeeded of %d", requests)
	assert.Positive(t, nA.Load(), "the broken backend was drawn")
}
