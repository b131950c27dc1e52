package controlplane

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// A change to one Service wakes the streams that watch it and no other,
// as go-control-plane's linear cache notifies only the watchers of the
// resource that changed: with 50 Services watched by Get and GetProfile
// streams, an endpoint change, a ServiceProfile and a reload of every
// endpoint set that changes one Service each wake only that Service's
// stream; a reload that changes nothing wakes nobody.
func TestChangeWakesOnlyItsWatchers(t *testing.T) {
	store := NewStore()
	srv := NewServer(store, WithLogger(quietLogger))
	cp := serve(t, srv)
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	const n = 50
	name := func(i int) string { return fmt.Sprintf("svc-%d.default.svc.cluster.local", i) }
	sets := map[string][]endpoint.Endpoint{}
	for i := range n {
		sets[name(i)+":80"] = []endpoint.Endpoint{ep(fmt.Sprintf("10.0.0.%d:80", i+1), false)}
	}
	store.SetEndpoints(sets)
	gets := make([]grpc.ServerStreamingClient[pb.Update], n)
	profs := make([]grpc.ServerStreamingClient[pb.DestinationProfile], n)
	for i := range n {
		var err error
		gets[i], err = api.Get(ctx, &pb.GetDestination{Path: name(i) + ":80"})
		require.NoError(t, err)
		_, err = recvTimeout(t, gets[i].Recv)
		require.NoError(t, err)
		profs[i], err = api.GetProfile(ctx, &pb.GetDestination{Path: name(i) + ":80"})
		require.NoError(t, err)
		_, err = recvTimeout(t, profs[i].Recv)
		require.NoError(t, err)
	}
	// Every stream is parked on its wake-up once each watches.
	waitWatchers(t, store, 2*n)

	// expectWakes applies change, waits for what the stream that
	// watches it receives, and checks how many streams woke.
	expectWakes := func(what string, want int64, change func(), recv func() error) {
		t.Helper()
		before := srv.wakes.Load()
		change()
		if recv != nil {
			require.NoError(t, recv(), what)
		}
		// A wake-up counted after the receipt would be a stream woken
		// for nothing: it reads the store and parks again, sending
		// nothing. Give such wake-ups a moment to be counted.
		deadline := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(deadline) && srv.wakes.Load()-before <= want {
			time.Sleep(5 * time.Millisecond)
		}
		assert.Equal(t, want, srv.wakes.Load()-before, "%s: streams woken", what)
	}

	expectWakes("an endpoint change of one Service", 1, func() {
		store.PutEndpoints(name(7)+":80", []endpoint.Endpoint{ep("10.0.0.8:80", false), ep("10.0.1.8:80", false)})
	}, func() error {
		u, err := recvTimeout(t, gets[7].Recv)
		if err == nil && len(u.GetAdd().GetAddrs()) != 1 {
			err = fmt.Errorf("got %v, want one address added", u)
		}
		return err
	})
	expectWakes("a ServiceProfile of one Service", 1, func() {
		store.PutServiceProfile(serviceProfile(name(9), "r1"))
	}, func() error {
		m, err := recvTimeout(t, profs[9].Recv)
		if err == nil && len(m.GetRoutes()) != 1 {
			err = fmt.Errorf("got %v, want one route", m)
		}
		return err
	})
	sets[name(3)+":80"] = nil
	expectWakes("a reload of every endpoint set that changes one", 1, func() {
		sets[name(7)+":80"] = []endpoint.Endpoint{ep("10.0.0.8:80", false), ep("10.0.1.8:80", false)}
		store.SetEndpoints(sets)
	}, func() error {
		u, err := recvTimeout(t, gets[3].Recv)
		if err == nil && len(u.GetRemove().GetAddrs()) != 1 {
			err = fmt.Errorf("got %v, want one address removed", u)
		}
		return err
	})
	expectWakes("a reload that changes nothing", 0, func() { store.SetEndpoints(sets) }, nil)
}

// waitWatchers waits until n streams watch the store.
func waitWatchers(t *testing.T, s *Store, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		got := map[*waiter]bool{}
		for _, ws := range s.waiters {
			for w := range ws {
				got[w] = true
			}
		}
		return len(got) == n
	}, defaultTestTimeout, 5*time.Millisecond)
}
