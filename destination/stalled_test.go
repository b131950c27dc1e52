package destination_test

import (
	"context"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/require"
)

// A client given two replicas leaves the first when it goes silent
// without closing the connection (a lost host, a frozen process): its
// keepalive ping goes unanswered, and the watches move to the second
// replica. A change made after the stall arrives there, and a name first
// watched after it is answered, neither ever arriving before.
func TestClientLeavesAStalledReplica(t *testing.T) {
	_, a := backend(t, "a")
	_, b := backend(t, "b")
	store := controlplane.NewStore()
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{a})
	first, second := servePolicies(t, holdListener(t), store), servePolicies(t, holdListener(t), store)
	proxy := testutil.StartStallProxy(t, first.addr)

	// The shortest keepalive gRPC allows, which the control plane's
	// KeepaliveOptions permit.
	c := newTestClient(t, proxy.Addr()+","+second.addr, destination.WithKeepalive(controlplane.MinClientPing, time.Second))
	rec := newRecorder[endpoint.Update]()
	stop, err := c.WatchEndpoints(context.Background(), books+":7000", rec.update)
	require.NoError(t, err)
	defer stop()
	only := func(u endpoint.Update, e endpoint.Endpoint) bool {
		return u.Set != nil && len(u.Set.Endpoints) == 1 && u.Set.Endpoints[0].Addr == e.Addr
	}
	rec.waitFor(t, "a", func(u endpoint.Update) bool { return only(u, a) })

	proxy.Stall()
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{b})
	store.PutEndpoints("late.default.svc.cluster.local:80", []endpoint.Endpoint{a})
	late := newRecorder[endpoint.Update]()
	stopLate, err := c.WatchEndpoints(context.Background(), "late.default.svc.cluster.local:80", late.update)
	require.NoError(t, err)
	defer stopLate()

	start := time.Now()
	// Within the keepalive, its timeout and a reconnect; testutil.Timeout
	// is far more.
	deadline := time.After(controlplane.MinClientPing + testutil.Timeout)
	for {
		got, gotLate := rec.all(), late.all()
		if only(got[len(got)-1], b) && len(gotLate) > 0 && only(gotLate[len(gotLate)-1], a) {
			t.Logf("on the second replica %v after the stall", time.Since(start).Round(100*time.Millisecond))
			return
		}
		select {
		case <-rec.ch:
		case <-late.ch:
		case <-deadline:
			t.Fatalf("still on the stalled replica: last %+v, late %+v", got[len(got)-1].Set, gotLate)
		}
	}
}
