package destination_test

import (
	"context"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// The control plane goes away until the client's backoff has reached its
// maximum (its port refuses connections, as a stopped process's does) and comes back with a profile changed meanwhile:
// the client routes by the new profile within the backoff's maximum plus
// one second of the return, with one backoff policy governing both the
// reconnection and the streams.
func TestRecoveryAfterControlPlaneReturns(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out an outage of some seconds")
	}
	t.Parallel()
	policy := backoff.Policy{Min: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.2}
	store := controlplane.NewStore()
	store.SetServiceProfiles([]*profiles.ServiceProfile{serviceProfile(books, "before")})
	store.PutEndpoints(books+":7000", nil)
	held := holdListener(t)
	up := func() *grpc.Server {
		srv := grpc.NewServer()
		controlplane.NewServer(store, controlplane.WithLogger(quietLogger)).Register(srv)
		lis := held.generation()
		go srv.Serve(lis)
		return srv
	}
	srv := up()
	var down atomic.Bool
	refused := make(chan time.Time, 64)
	refuse := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if down.Load() {
			select {
			case refused <- time.Now():
			default:
			}
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	c := newTestClient(t, held.addr(), destination.WithBackoff(policy), destination.WithDialFunc(refuse))
	prof := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	defer stop()
	prof.waitFor(t, "the first profile", hasRoute("before"))

	down.Store(true)
	wentDown := time.Now()
	srv.Stop() // every stream ends; new connections are refused
	// The outage lasts until the client's redials are spaced by the
	// backoff's maximum (less its jitter), and then three redials more,
	// so that every backoff has reached its maximum.
	last, atMax := time.Time{}, 0
	for atMax < 4 {
		select {
		case at := <-refused:
			if !last.IsZero() && at.Sub(last) >= time.Duration(float64(policy.Max)*(1-policy.Jitter)) {
				atMax++
			} else if atMax > 0 {
				atMax++
			}
			last = at
		case <-time.After(time.Minute):
			t.Fatal("the client stopped redialling the control plane")
		}
	}
	t.Logf("outage of %v", time.Since(wentDown).Round(time.Millisecond))
	store.SetServiceProfiles([]*profiles.ServiceProfile{serviceProfile(books, "after")})
	down.Store(false)
	srv = up()
	defer srv.Stop()
	back := time.Now()
	prof.waitFor(t, "the profile changed during the outage", hasRoute("after"))
	took := time.Since(back)
	t.Logf("routing by the new profile %v after the control plane returned", took.Round(time.Millisecond))
	assert.LessOrEqual(t, took, policy.Max+time.Second)
}

// A control-plane address whose connections are accepted and closed at
// once (a TCP load balancer without a ready backend, a replica shutting
// down) is redialled under the client's backoff, not each time the last
// connection closed. With the default policy (100 ms doubling to 10 s), 3
// s hold about 5 connections; a machine slower than this one only makes
// fewer. Before, the client made about 2,000.
func TestNoReconnectStormOnAcceptAndClose(t *testing.T) {
	addr, accepted := testutil.AcceptAndClose(t)
	c, err := destination.Dial(addr.String(), destination.WithLogger(quietLogger))
	require.NoError(t, err)
	defer c.Close()
	stop, err := c.WatchEndpoints(context.Background(), books+":7000", func(endpoint.Update) {})
	require.NoError(t, err)
	defer stop()
	// A window to count in, not a wait for an event.
	window := time.NewTimer(3 * time.Second)
	defer window.Stop()
	<-window.C
	n := accepted.Load()
	t.Logf("%d connections in 3 s", n)
	assert.LessOrEqual(t, n, int64(12), "connections in 3 s")
}
