package destination_test

import (
	"context"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Service that does not exist is answered as Linkerd's controllers answer
// it (Get: NotFound "Service X not found"; GetProfile: Unknown `service "X"
// not found`; OutboundPolicies: NotFound "unknown target"): every watch
// says at once that there is no such service, no profile and no policy,
// as for a name outside the search path, and keeps asking, so that the
// Service's state arrives once it exists.
func TestNotFoundIsNoSuchTarget(t *testing.T) {
	store := controlplane.NewStore()
	cp := servePolicies(t, holdListener(t), store)
	c := newTestClient(t, cp.addr)
	ctx := context.Background()
	const authority = "late.default.svc.cluster.local:7000"

	eps := newRecorder[endpoint.Update]()
	stop, err := c.WatchEndpoints(ctx, authority, eps.update)
	require.NoError(t, err)
	defer stop()
	prof := newRecorder[profiles.Update]()
	stop, err = c.Watch(ctx, authority, prof.update)
	require.NoError(t, err)
	defer stop()
	pol := newRecorder[policy.Update]()
	stop, err = c.WatchPolicy(ctx, destination.TrafficSpec{Authority: authority}, pol.update)
	require.NoError(t, err)
	defer stop()

	u := eps.waitFor(t, "no such service", func(u endpoint.Update) bool { return u.Set != nil })
	assert.False(t, u.Set.Exists)
	assert.NoError(t, u.Err)
	p := prof.waitFor(t, "no profile", func(profiles.Update) bool { return true })
	assert.Nil(t, p.Profile)
	assert.NoError(t, p.Err, "not a rejection: the watch goes on")
	q := pol.waitFor(t, "no policy", func(policy.Update) bool { return true })
	assert.Nil(t, q.Policy)
	assert.NoError(t, q.Err)

	store.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.1:7000", false)})
	eps.waitFor(t, "the endpoints once the Service exists", func(u endpoint.Update) bool { return len(addrs(u)) == 1 })
	prof.waitFor(t, "the default profile once the Service exists", func(u profiles.Update) bool { return u.Profile != nil })
	pol.waitFor(t, "the default policy once the Service exists", func(u policy.Update) bool { return u.Policy != nil })
}

// A Service answered "not found" that then comes to exist without
// endpoints is a Service with no endpoints: the control plane accepts the
// new stream and stays silent, as Linkerd's controller does, and past the
// first-message deadline the watch says "exists, no endpoints" (a
// balancer queues its requests, then fails them fast) rather than keeping "no such
// service" (which a balancer with a fallback sends past the mesh).
func TestNotFoundThenSilentIsExistsWithoutEndpoints(t *testing.T) {
	store := controlplane.NewStore()
	cp := servePolicies(t, holdListener(t), store)
	c := newTestClient(t, cp.addr, destination.WithFirstMessageTimeout(200*time.Millisecond))
	const authority = "late.default.svc.cluster.local:7000"

	eps := newRecorder[endpoint.Update]()
	stop, err := c.WatchEndpoints(context.Background(), authority, eps.update)
	require.NoError(t, err)
	defer stop()
	u := eps.waitFor(t, "no such service", func(u endpoint.Update) bool { return u.Set != nil })
	require.False(t, u.Set.Exists)

	store.PutEndpoints(authority, nil)
	eps.waitFor(t, "a Service that exists with no endpoints", func(u endpoint.Update) bool {
		return u.Set != nil && u.Set.Exists && len(u.Set.Endpoints) == 0
	})
}
