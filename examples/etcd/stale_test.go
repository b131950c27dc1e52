package etcd_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/examples/internal/cpreplica"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Replicas that all lose etcd (each reads it through a connection that
// breaks) go on serving what they last read, and keep their clients: no
// replica knows better, so none hands its clients over (a control plane
// gone silent leaves traffic on what was last known). The first replica
// to read etcd again serves the changes made meanwhile; the other, still
// cut off, then hands its clients over to it. A replica whose etcd comes
// back serves again.
func TestReplicasThatLostEtcdServeTheirLastStateUntilOneReadsIt(t *testing.T) {
	const staleAfter = time.Second
	m := etcdtest.Start(t)
	admin := newClient(t, m.Endpoint)
	pxA, pxB := startProxy(t, strings.TrimPrefix(m.Endpoint, "http://")), startProxy(t, strings.TrimPrefix(m.Endpoint, "http://"))
	replicaA := startCP(t, []string{"http://" + pxA.lis.Addr().String()}, cpreplica.WithStaleAfter(staleAfter))
	replicaB := startCP(t, []string{"http://" + pxB.lis.Addr().String()}, cpreplica.WithStaleAfter(staleAfter))
	put(t, admin, etcdstore.EndpointsKey(prefix, "all"), endpointsYAML("127.0.0.1:9001"))

	got := watchThrough(t, []string{"127.0.0.1:9001"}, replicaA, replicaB)
	a, b := rawReplica(t, replicaA.Addr), rawReplica(t, replicaB.Addr)
	// Both have read the first state (the client's answer is A's alone).
	require.Eventually(t, func() bool {
		return slices.Equal(a.endpoints(), []string{"127.0.0.1"}) && slices.Equal(b.endpoints(), []string{"127.0.0.1"})
	}, timeout, 10*time.Millisecond, "both replicas serve the first state")

	// Both lose etcd; etcd itself goes on.
	pxA.setBroken(true)
	pxB.setBroken(true)
	put(t, admin, etcdstore.EndpointsKey(prefix, "all"), endpointsYAML("127.0.0.2:9002"))
	require.Eventually(t, func() bool {
		return replicaA.Server.Health() == controlplane.Stale && replicaB.Server.Health() == controlplane.Stale
	}, timeout, 10*time.Millisecond, "the replicas did not notice that they lost etcd")
	assert.Never(t, func() bool {
		return replicaA.Server.Health() != controlplane.Stale || replicaB.Server.Health() != controlplane.Stale
	}, 3*staleAfter, 10*time.Millisecond, "a replica stood by although no replica reads etcd")
	assert.Equal(t, []string{"127.0.0.1"}, a.endpoints(), "A serves its last state")
	assert.Equal(t, []string{"127.0.0.1"}, b.endpoints(), "B serves its last state")
	assert.Equal(t, []string{"127.0.0.1:9001"}, got(), "the client keeps what it had")

	// B reads etcd again: it serves the change, and A, still cut off,
	// hands its client over to it.
	pxB.setBroken(false)
	require.Eventually(t, func() bool { return replicaB.Server.Health() == controlplane.Current }, timeout, 10*time.Millisecond, "B reads etcd again")
	require.Eventually(t, func() bool { return slices.Equal(b.endpoints(), []string{"127.0.0.2"}) }, timeout, 10*time.Millisecond, "B serves the change")
	require.Eventually(t, func() bool { return replicaA.Server.Health() == controlplane.Standby }, timeout, 10*time.Millisecond, "A stands by")
	require.Eventually(t, func() bool { return slices.Equal(got(), []string{"127.0.0.2:9002"}) }, timeout, 10*time.Millisecond,
		"the client moved to B and has the change")

	// A reads etcd again and serves again.
	pxA.setBroken(false)
	require.Eventually(t, func() bool { return replicaA.Server.Health() == controlplane.Current }, timeout, 10*time.Millisecond, "A reads etcd again")
	require.Eventually(t, func() bool { return slices.Equal(a.endpoints(), []string{"127.0.0.2"}) }, timeout, 10*time.Millisecond, "A serves again")
}

// watchAddrs watches authority's endpoints on client until the test ends,
// and returns a function giving the addresses of the last update.
func watchAddrs(t *testing.T, client *destination.Client, authority string) func() []string {
	t.Helper()
	var mu sync.Mutex
	var last []string
	stop, err := client.WatchEndpoints(context.Background(), authority, func(u endpoint.Update) {
		mu.Lock()
		defer mu.Unlock()
		last = nil
		if u.Set != nil {
			for _, e := range u.Set.Endpoints {
				last = append(last, e.Addr.String())
			}
		}
	})
	require.NoError(t, err)
	t.Cleanup(stop)
	return func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(last) }
}
