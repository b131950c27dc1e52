package destination_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client given two replicas ("a,b") moves to the second when the first
// dies while watches are open (Get and OutboundPolicies) and requests
// flow: each watch keeps its last state (no update without endpoints or
// policy, no error), changes written after the kill arrive through the
// live replica, and no request fails.
func TestClientFailsOverToAnotherReplica(t *testing.T) {
	_, a := backend(t, "a")
	_, b := backend(t, "b")
	store := controlplane.NewStore()
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{a})
	store.SetManifests(resources(t, authorsServiceYAML))
	// Two replicas serving every API of one store.
	first, second := servePolicies(t, holdListener(t), store), servePolicies(t, holdListener(t), store)

	c := newTestClient(t, first.addr+","+second.addr)
	rec := newRecorder[endpoint.Update]()
	stop, err := c.WatchEndpoints(context.Background(), books+":7000", rec.update)
	require.NoError(t, err)
	defer stop()
	policies := newRecorder[policy.Update]()
	stopPolicy, err := c.Policies().Watch(context.Background(), authorsAuthority, policies.update)
	require.NoError(t, err)
	defer stopPolicy()
	policies.waitFor(t, "the default route", routeNamedP("http"))
	_, client := balancedClient(t, c, balancer.WithFallback(false))

	// The first request on the fresh client, then traffic all along.
	status, body, _ := fetch(t, client, "http://"+books+":7000/")
	require.Equal(t, 200, status)
	require.Equal(t, "a HTTP/1.1 "+books+":7000", body)
	var sent, failed atomic.Int64
	var sawB atomic.Bool
	trafficCtx, stopTraffic := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for trafficCtx.Err() == nil {
			sent.Add(1)
			resp, err := client.Get("http://" + books + ":7000/")
			if err != nil {
				failed.Add(1)
				t.Logf("request failed: %v", err)
				continue
			}
			var buf [64]byte
			n, _ := resp.Body.Read(buf[:])
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				failed.Add(1)
				t.Logf("request answered %d: %s", resp.StatusCode, buf[:n])
				continue
			}
			if string(buf[:1]) == "b" {
				sawB.Store(true)
			}
		}
	}()
	defer func() {
		stopTraffic()
		wg.Wait()
	}()

	// The replica in use (the first of the list) dies.
	first.stop()
	require.Eventually(t, func() bool { return sent.Load() > 20 }, defaultTestTimeout, time.Millisecond,
		"traffic after the kill")

	// A change written after the kill reaches the watch and the requests:
	// only the second replica can have carried it.
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{b})
	store.SetManifests(resources(t, authorsServiceYAML, authorsRouteYAML))
	policies.waitFor(t, "the HTTPRoute written after the kill", routeNamedP("authors-get"))
	require.Eventually(t, func() bool {
		got := rec.all()
		last := got[len(got)-1]
		return last.Set != nil && len(last.Set.Endpoints) == 1 && last.Set.Endpoints[0].Addr == b.Addr
	}, defaultTestTimeout, 5*time.Millisecond, "the change after the kill never arrived: %v", rec.all())
	require.Eventually(t, sawB.Load, defaultTestTimeout, 5*time.Millisecond, "no request reached b")
	stopTraffic()
	wg.Wait()

	for i, u := range rec.all() {
		assert.NoError(t, u.Err, "update %d", i)
		if assert.NotNil(t, u.Set, "update %d", i) {
			// The change from a to b may pass through {a, b} (the control
			// plane sends the add before the remove), never through an
			// empty set.
			assert.NotEmpty(t, u.Set.Endpoints, "update %d: the last state was dropped", i)
		}
	}
	for i, u := range policies.all() {
		assert.NotNil(t, u.Policy, "policy update %d: the last policy was dropped (%v)", i, u.Err)
	}
	assert.Zero(t, failed.Load(), "requests failed out of %d", sent.Load())
	t.Logf("%d requests during the failover, %d failed", sent.Load(), failed.Load())
}

// A malformed list of replicas is refused by Dial, naming the address.
func TestDialRefusesBadReplicaList(t *testing.T) {
	for _, target := range []string{"127.0.0.1:1,", "127.0.0.1:1,127.0.0.1", "127.0.0.1:1, 127.0.0.1:1"} {
		c, err := destination.Dial(target)
		if !assert.Error(t, err, "%q", target) {
			c.Close()
		}
	}
}
