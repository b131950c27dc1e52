package destination_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Authorities outside the search path are answered at once, without a
// stream: whatever Hosts an application sends cannot fill the watch bound.
func TestSearchPathKeepsOtherNamesOffTheControlPlane(t *testing.T) {
	store := controlplane.NewStore()
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{ep("10.0.0.1:7000", true)})
	store.PutEndpoints("10.1.2.3:80", []endpoint.Endpoint{ep("10.1.2.3:80", false)})
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	c := newTestClient(t, cp.addr, destination.WithMaxWatches(1),
		destination.WithSearchNetworks(netip.MustParsePrefix("10.1.0.0/16")))
	ctx := context.Background()

	for _, a := range []string{"example.com:80", "books.default.svc.cluster.local.evil.com:80", "192.168.1.1:80", "[2001:db8::1]:80"} {
		prof := newRecorder[profiles.Update]()
		stop, err := c.Watch(ctx, a, prof.update)
		require.NoError(t, err, a)
		defer stop()
		got := prof.waitFor(t, a+": no profile", func(profiles.Update) bool { return true })
		assert.Nil(t, got.Profile, a)
		assert.NoError(t, got.Err, a)

		eps := newRecorder[endpoint.Update]()
		stop, err = c.WatchEndpoints(ctx, a, eps.update)
		require.NoError(t, err, a)
		defer stop()
		set := eps.waitFor(t, a+": no such service", func(u endpoint.Update) bool { return u.Set != nil })
		assert.False(t, set.Set.Exists, a)

		pol := newRecorder[policy.Update]()
		stop, err = c.WatchPolicy(ctx, destination.TrafficSpec{Authority: a}, pol.update)
		require.NoError(t, err, a)
		defer stop()
		pu := pol.waitFor(t, a+": no policy", func(policy.Update) bool { return true })
		assert.Nil(t, pu.Policy, a)
	}
	assert.Equal(t, destination.Stats{}, c.Stats(), "no stream opened, no room taken")

	// A cluster name (with a trailing dot too, any case) and an address in
	// a search network are looked up.
	eps := newRecorder[endpoint.Update]()
	stop, err := c.WatchEndpoints(ctx, "Books.Default.svc.cluster.local.:7000", eps.update)
	require.NoError(t, err)
	defer stop()
	assert.Equal(t, 1, c.Stats().EndpointWatches)

	ip := newRecorder[endpoint.Update]()
	stopIP, err := c.WatchEndpoints(ctx, "10.1.2.3:80", ip.update)
	assert.ErrorIs(t, err, profiles.ErrTooManyWatches, "an in-network address takes room under the bound")
	if err == nil {
		stopIP()
	}
}

func TestSearchSuffixes(t *testing.T) {
	store := controlplane.NewStore()
	store.PutEndpoints("web.corp.svc.cluster.local:80", []endpoint.Endpoint{ep("10.0.0.9:80", false)})
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))

	c := newTestClient(t, cp.addr, destination.WithSearchSuffixes("Corp.svc.cluster.local."))
	rec := newRecorder[endpoint.Update]()
	stop, err := c.WatchEndpoints(context.Background(), "web.corp.svc.cluster.local:80", rec.update)
	require.NoError(t, err)
	defer stop()
	got := rec.waitFor(t, "web.corp's endpoints", func(u endpoint.Update) bool { return u.Set != nil })
	assert.True(t, got.Set.Exists)
	assert.Equal(t, []string{"10.0.0.9:80"}, addrs(got))

	_, err = c.WatchEndpoints(context.Background(), books+":7000", func(endpoint.Update) {})
	require.NoError(t, err)
	assert.Equal(t, 1, c.Stats().EndpointWatches, "the default suffix was replaced")

	all := newTestClient(t, cp.addr, destination.WithSearchSuffixes("."))
	stop, err = all.WatchEndpoints(context.Background(), "anything.at.all:80", func(endpoint.Update) {})
	require.NoError(t, err)
	defer stop()
	assert.Equal(t, 1, all.Stats().EndpointWatches, `"." looks up every name`)
}
