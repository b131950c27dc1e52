package destination_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var fastBackoff = backoff.Policy{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: 0.1}

const books = "books.default.svc.cluster.local"

func ep(addr string, h2 bool) endpoint.Endpoint {
	return endpoint.Endpoint{Addr: netip.MustParseAddrPort(addr), Weight: endpoint.DefaultWeight, H2: h2}
}

func addrs(u endpoint.Update) []string {
	if u.Set == nil {
		return nil
	}
	out := []string{}
	for _, e := range u.Set.Endpoints {
		out = append(out, e.Addr.String())
	}
	return out
}

func TestProfileUpdatesArriveInOrder(t *testing.T) {
	store := controlplane.NewStore()
	store.PutServiceProfile(serviceProfile(books, "v1"))
	store.PutEndpoints(books+":7000", nil)
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	c := newTestClient(t, cp.addr)

	rec := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", rec.update)
	require.NoError(t, err)
	defer stop()
	rec.waitFor(t, "v1", hasRoute("v1"))

	for _, v := range []string{"v2", "v3", "v4"} {
		store.PutServiceProfile(serviceProfile(books, v))
		rec.waitFor(t, v, hasRoute(v))
	}
	var order []string
	for _, u := range rec.all() {
		order = append(order, u.Profile.Routes[0].Labels["route"])
	}
	assert.Equal(t, []string{"v1", "v2", "v3", "v4"}, order, "each update once, in order")
	assert.Equal(t, books, rec.all()[0].Profile.FullyQualifiedName)
}

func TestEndpointUpdatesArriveInOrder(t *testing.T) {
	store := controlplane.NewStore()
	authority := books + ":7000"
	store.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.1:7000", true)})
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	c := newTestClient(t, cp.addr)

	rec := newRecorder[endpoint.Update]()
	stop, err := c.WatchEndpoints(context.Background(), authority, rec.update)
	require.NoError(t, err)
	defer stop()

	first := rec.waitFor(t, "first set", func(u endpoint.Update) bool { return u.Set != nil })
	assert.Equal(t, []string{"10.0.0.1:7000"}, addrs(first))
	assert.True(t, first.Set.Exists)
	assert.True(t, first.Set.Endpoints[0].H2)

	store.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.1:7000", true), ep("10.0.0.2:7000", false)})
	rec.waitFor(t, "two", func(u endpoint.Update) bool { return len(addrs(u)) == 2 })
	store.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.2:7000", false)})
	rec.waitFor(t, "only .2", func(u endpoint.Update) bool {
		a := addrs(u)
		return len(a) == 1 && a[0] == "10.0.0.2:7000"
	})
	store.PutEndpoints(authority, nil)
	rec.waitFor(t, "exists, empty", func(u endpoint.Update) bool { return u.Set != nil && u.Set.Exists && len(u.Set.Endpoints) == 0 })
	// A Service that does not exist: Linkerd's controller answers
	// NotFound, which the client delivers as no such service.
	nosuch := newRecorder[endpoint.Update]()
	stopNo, err := c.WatchEndpoints(context.Background(), "nosuch.ns.svc.cluster.local:80", nosuch.update)
	require.NoError(t, err)
	defer stopNo()
	nosuch.waitFor(t, "does not exist", func(u endpoint.Update) bool { return u.Set != nil && !u.Set.Exists })
}

func TestStreamsAreShared(t *testing.T) {
	s := newScripted()
	s.profile = func(_ int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
		if err := st.Send(destination.ProfileToProto(serviceProfile(books, "shared").ProfileFor(7000))); err != nil {
			return err
		}
		return block(st.Context())
	}
	cp := serve(t, s)
	c := newTestClient(t, cp.addr, destination.WithIdleTimeout(0))

	var stops []func()
	var recs []*recorder[profiles.Update]
	for range 5 {
		rec := newRecorder[profiles.Update]()
		stop, err := c.Watch(context.Background(), books+":7000", rec.update)
		require.NoError(t, err)
		stops, recs = append(stops, stop), append(recs, rec)
	}
	for _, rec := range recs {
		rec.waitFor(t, "profile", hasRoute("shared"))
	}
	assert.Len(t, s.callTimes(), 1, "one stream for all watchers")
	assert.Equal(t, 1, c.Stats().ProfileWatches)
	for _, stop := range stops {
		stop()
		stop() // idempotent
	}
	assert.Equal(t, 0, c.Stats().ProfileWatches, "the idle watch is evicted")

	// A watcher after eviction opens a new stream.
	rec := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", rec.update)
	require.NoError(t, err)
	defer stop()
	rec.waitFor(t, "profile again", hasRoute("shared"))
	assert.Len(t, s.callTimes(), 2)
}

func TestContextTokenAndScheme(t *testing.T) {
	s := newScripted()
	got := make(chan *pb.GetDestination, 1)
	s.profile = func(_ int, req *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
		got <- req
		return block(st.Context())
	}
	cp := serve(t, s)
	c := newTestClient(t, cp.addr, destination.WithContextToken(`{"ns":"default"}`), destination.WithScheme("k8s"))
	stop, err := c.Watch(context.Background(), books+":7000", func(profiles.Update) {})
	require.NoError(t, err)
	defer stop()
	select {
	case req := <-got:
		assert.Equal(t, books+":7000", req.GetPath())
		assert.Equal(t, `{"ns":"default"}`, req.GetContextToken())
		assert.Equal(t, "k8s", req.GetScheme())
	case <-time.After(defaultTestTimeout):
		t.Fatal("no call")
	}
}

// Linkerd's outbound_reconnects_if_controller_stream_ends, with a change
// made while the control plane was down.
func TestControlPlaneRestart(t *testing.T) {
	store := controlplane.NewStore()
	store.PutServiceProfile(serviceProfile(books, "before"))
	authority := books + ":7000"
	store.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.1:7000", false)})
	held := holdListener(t)
	cp := serveHeld(t, held, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	c := newTestClient(t, held.addr())

	prof := newRecorder[profiles.Update]()
	stopP, err := c.Watch(context.Background(), authority, prof.update)
	require.NoError(t, err)
	defer stopP()
	eps := newRecorder[endpoint.Update]()
	stopE, err := c.WatchEndpoints(context.Background(), authority, eps.update)
	require.NoError(t, err)
	defer stopE()
	prof.waitFor(t, "before", hasRoute("before"))
	eps.waitFor(t, "first endpoints", func(u endpoint.Update) bool { return len(addrs(u)) == 1 })

	cp.stop()
	store.PutServiceProfile(serviceProfile(books, "after"))
	store.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.9:7000", false)})
	serveHeld(t, held, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))

	prof.waitFor(t, "after", hasRoute("after"))
	eps.waitFor(t, "new endpoints", func(u endpoint.Update) bool {
		a := addrs(u)
		return len(a) == 1 && a[0] == "10.0.0.9:7000"
	})
	// While down, nothing was published: the last state stayed in force.
	assert.Len(t, prof.all(), 2)
	assert.Len(t, eps.all(), 2)
}

// Linkerd's outbound_destinations_reset_on_reconnect_followed_by_empty and
// _dne (linkerd/app/integration/src/tests/discovery.rs): after a reconnect
// the stale set is kept until the first update, which replaces it. A
// message that is no update is not the first update: an Add or a Remove
// with no address (linkerd/proxy/api-resolve/src/resolve.rs mk_update),
// and a Remove before any update (linkerd/proxy/resolve/src/recover.rs);
// for those rows the stream then adds 10.0.0.3, which replaces the stale
// set.
func TestEndpointsResetOnReconnect(t *testing.T) {
	other := &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{Addrs: []*pb.WeightedAddr{destination.EndpointToProto(ep("10.0.0.3:80", false))}}}}
	cases := []struct {
		name    string
		second  *pb.Update
		ignored bool // no update: the stream goes on with other
		want    []string
		exists  bool
	}{
		{"no_endpoints exists", &pb.Update{Update: &pb.Update_NoEndpoints{NoEndpoints: &pb.NoEndpoints{Exists: true}}}, false, []string{}, true},
		{"no_endpoints dne", &pb.Update{Update: &pb.Update_NoEndpoints{NoEndpoints: &pb.NoEndpoints{Exists: false}}}, false, []string{}, false},
		{"add none", &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{}}}, true, []string{"10.0.0.3:80"}, true},
		{"remove none", &pb.Update{Update: &pb.Update_Remove{Remove: &pb.AddrSet{}}}, true, []string{"10.0.0.3:80"}, true},
		{"remove first", &pb.Update{Update: &pb.Update_Remove{Remove: &pb.AddrSet{Addrs: []*pb.TcpAddress{destination.AddrToProto(netip.MustParseAddrPort("10.0.0.1:80"))}}}}, true, []string{"10.0.0.3:80"}, true},
		{"add other", other, false, []string{"10.0.0.3:80"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted()
			release := make(chan struct{})
			s.get = func(call int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.Update]) error {
				if call == 1 {
					return st.Send(&pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{Addrs: []*pb.WeightedAddr{
						destination.EndpointToProto(ep("10.0.0.1:80", false)), destination.EndpointToProto(ep("10.0.0.2:80", false)),
					}}}}) // and the stream ends
				}
				<-release // the reconnected stream is silent for a while
				if err := st.Send(tc.second); err != nil {
					return err
				}
				if tc.ignored {
					if err := st.Send(other); err != nil {
						return err
					}
				}
				return block(st.Context())
			}
			cp := serve(t, s)
			c := newTestClient(t, cp.addr)
			rec := newRecorder[endpoint.Update]()
			stop, err := c.WatchEndpoints(context.Background(), "svc.ns.svc.cluster.local:80", rec.update)
			require.NoError(t, err)
			defer stop()
			rec.waitFor(t, "two endpoints", func(u endpoint.Update) bool { return len(addrs(u)) == 2 })
			s.waitCalls(t, 2)
			assert.Len(t, rec.all(), 1, "stale set kept until the first message")
			close(release)
			rec.waitFor(t, "replaced set", func(endpoint.Update) bool { return len(rec.all()) >= 2 })
			if tc.ignored {
				rec.waitFor(t, "the added endpoint", func(u endpoint.Update) bool { return slices.Equal(addrs(u), tc.want) })
			}
			got := rec.all()
			require.Len(t, got, 2, "one update replaced the stale set")
			assert.Equal(t, tc.want, addrs(got[1]))
			assert.Equal(t, tc.exists, got[1].Set.Exists)
		})
	}
}

// Linkerd's outbound_error_reconnects_after_backoff: the control plane is
// not listening at first; with a 100ms delay from the environment the client
// keeps trying at that pace, and reaches it once it listens.
func TestReconnectsAfterBackoffFromEnv(t *testing.T) {
	t.Setenv("INMESH_CONTROL_BACKOFF_DELAY", "100ms")
	policy, err := backoff.FromEnv("INMESH_CONTROL", backoff.DefaultPolicy())
	require.NoError(t, err)
	require.Equal(t, backoff.Policy{Min: 100 * time.Millisecond, Max: 100 * time.Millisecond}, policy)

	// The port is held by the test; until a server serves it, dials are
	// refused as by a port nothing listens on.
	held := holdListener(t)
	dials := make(chan time.Time, 1000)
	var nd net.Dialer
	countingDial := func(ctx context.Context, network, a string) (net.Conn, error) {
		dials <- time.Now()
		if !held.serving() {
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		}
		return nd.DialContext(ctx, network, a)
	}
	c := newTestClient(t, held.addr(), destination.WithBackoff(policy), destination.WithDialFunc(countingDial))
	rec := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", rec.update)
	require.NoError(t, err)
	defer stop()

	// Three refused dials, each at least the delay after the one before.
	var at []time.Time
	for len(at) < 3 {
		select {
		case d := <-dials:
			at = append(at, d)
		case <-time.After(defaultTestTimeout):
			t.Fatal("the client stopped dialling")
		}
	}
	for i := 1; i < len(at); i++ {
		assert.GreaterOrEqual(t, at[i].Sub(at[i-1]), 100*time.Millisecond, "dial %d came too soon", i)
	}

	store := controlplane.NewStore()
	store.PutServiceProfile(serviceProfile(books, "reached"))
	store.PutEndpoints(books+":7000", nil)
	serveHeld(t, held, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	rec.waitFor(t, "profile after the control plane came up", hasRoute("reached"))
}

func TestStatusCodes(t *testing.T) {
	retried := []codes.Code{codes.Unavailable, codes.Internal, codes.NotFound, codes.Unknown, codes.ResourceExhausted}
	for _, code := range retried {
		t.Run(code.String()+" is retried with backoff", func(t *testing.T) {
			s := newScripted()
			s.profile = func(call int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
				if call <= 3 {
					return status.Error(code, "not now")
				}
				if err := st.Send(destination.ProfileToProto(serviceProfile(books, "ok").ProfileFor(7000))); err != nil {
					return err
				}
				return block(st.Context())
			}
			cp := serve(t, s)
			policy := backoff.Policy{Min: 30 * time.Millisecond, Max: 100 * time.Millisecond}
			c := newTestClient(t, cp.addr, destination.WithBackoff(policy))
			rec := newRecorder[profiles.Update]()
			stop, err := c.Watch(context.Background(), books+":7000", rec.update)
			require.NoError(t, err)
			defer stop()
			rec.waitFor(t, "profile after retries", hasRoute("ok"))
			calls := s.callTimes()
			require.Len(t, calls, 4)
			for i := 1; i < len(calls); i++ {
				assert.GreaterOrEqual(t, calls[i].Sub(calls[i-1]), policy.Min, "attempt %d too soon", i)
			}
		})
	}
	for _, code := range []codes.Code{codes.InvalidArgument, codes.FailedPrecondition} {
		t.Run(code.String()+" stops with no profile", func(t *testing.T) {
			s := newScripted()
			s.profile = func(int, *pb.GetDestination, grpc.ServerStreamingServer[pb.DestinationProfile]) error {
				return status.Error(code, "no")
			}
			s.get = func(int, *pb.GetDestination, grpc.ServerStreamingServer[pb.Update]) error {
				return status.Error(code, "no")
			}
			cp := serve(t, s)
			c := newTestClient(t, cp.addr)
			rec := newRecorder[profiles.Update]()
			stop, err := c.Watch(context.Background(), books+":7000", rec.update)
			require.NoError(t, err)
			defer stop()
			u := rec.waitFor(t, "no profile", func(profiles.Update) bool { return true })
			assert.Nil(t, u.Profile)
			assert.ErrorIs(t, u.Err, profiles.ErrNoProfile)
			assert.ErrorIs(t, u.Err, destination.ErrRejected)
			assert.Equal(t, code, status.Code(u.Err))

			erec := newRecorder[endpoint.Update]()
			stopE, err := c.WatchEndpoints(context.Background(), books+":7000", erec.update)
			require.NoError(t, err)
			defer stopE()
			eu := erec.waitFor(t, "rejected", func(endpoint.Update) bool { return true })
			assert.ErrorIs(t, eu.Err, destination.ErrRejected)

			// Several times the longest delay: no further call.
			time.Sleep(defaultTestShortTimeout)
			assert.Len(t, s.callTimes(), 2, "one GetProfile and one Get, never retried")
		})
	}
}

func TestFirstMessageDeadline(t *testing.T) {
	s := newScripted()
	cancelled := make(chan struct{})
	s.profile = func(call int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
		if call == 1 {
			<-st.Context().Done() // accept the stream, never send
			close(cancelled)
			return nil
		}
		if err := st.Send(destination.ProfileToProto(serviceProfile(books, "second").ProfileFor(7000))); err != nil {
			return err
		}
		return block(st.Context())
	}
	cp := serve(t, s)
	c := newTestClient(t, cp.addr, destination.WithFirstMessageTimeout(200*time.Millisecond))
	rec := newRecorder[profiles.Update]()
	start := time.Now()
	stop, err := c.Watch(context.Background(), books+":7000", rec.update)
	require.NoError(t, err)
	defer stop()
	rec.waitFor(t, "profile from the second stream", hasRoute("second"))
	select {
	case <-cancelled:
	case <-time.After(defaultTestTimeout):
		t.Fatal("the silent stream was not cancelled")
	}
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	assert.Len(t, s.callTimes(), 2)
}

// The client watches at most the bound plus its headroom (1,000 + 62)
// authorities of a kind at once, refuses the rest, and has room again once
// they stop.
func TestWatchCap(t *testing.T) {
	const accepted = 1000 + 1000/16
	store := controlplane.NewStore()
	services := make(map[string][]endpoint.Endpoint, 2000)
	for i := range 2000 {
		services[fmt.Sprintf("svc-%d.ns.svc.cluster.local:80", i)] = nil
	}
	store.SetEndpoints(services)
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	c := newTestClient(t, cp.addr, destination.WithMaxWatches(1000), destination.WithIdleTimeout(0))

	runtime.GC()
	baseGoroutines := runtime.NumGoroutine()
	// delivered counts the watches that got a profile, once each: under
	// load a stream may be re-established and deliver its profile again.
	var delivered atomic.Int64
	var stops []func()
	var rejected int
	for i := range 2000 {
		var got atomic.Bool
		stop, err := c.Watch(context.Background(), fmt.Sprintf("svc-%d.ns.svc.cluster.local:80", i), func(u profiles.Update) {
			if u.Profile != nil && !got.Swap(true) {
				delivered.Add(1)
			}
		})
		if err != nil {
			require.ErrorIs(t, err, profiles.ErrTooManyWatches)
			rejected++
			continue
		}
		stops = append(stops, stop)
	}
	assert.Equal(t, accepted, len(stops))
	assert.Equal(t, 2000-accepted, rejected)
	// 1,062 streams under -race on a loaded machine: a generous wait.
	require.Eventually(t, func() bool { return delivered.Load() == accepted }, 6*defaultTestTimeout, 10*time.Millisecond,
		"every accepted watch gets its default profile")
	st := c.Stats()
	assert.Equal(t, accepted, st.ProfileWatches)
	assert.Equal(t, uint64(2000-accepted), st.RejectedWatches)

	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	perWatch := (runtime.NumGoroutine() - baseGoroutines) / accepted
	t.Logf("goroutines per watch (client and server in one process): %d; heap in use %d MiB", perWatch, ms.HeapInuse>>20)
	assert.LessOrEqual(t, perWatch, 8, "goroutines per watch")
	assert.Less(t, ms.HeapInuse, uint64(512<<20))

	for _, stop := range stops {
		stop()
	}
	assert.Equal(t, 0, c.Stats().ProfileWatches)
	stop, err := c.Watch(context.Background(), "again.ns.svc.cluster.local:80", func(profiles.Update) {})
	require.NoError(t, err, "room again after eviction")
	stop()
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= baseGoroutines+20 }, defaultTestTimeout, 20*time.Millisecond,
		"goroutines return to the baseline")
}

// At the bound, a stream kept only for its idle timeout (no watcher left)
// gives way to a new watch instead of refusing it; streams with watchers
// are never taken.
func TestWatchCapTakesIdleStreams(t *testing.T) {
	store := controlplane.NewStore()
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	c := newTestClient(t, cp.addr, destination.WithMaxWatches(2), destination.WithIdleTimeout(time.Hour))
	ctx := context.Background()

	held, err := c.Watch(ctx, "held.ns.svc.cluster.local:80", func(profiles.Update) {})
	require.NoError(t, err)
	defer held()
	idle, err := c.Watch(ctx, "idle.ns.svc.cluster.local:80", func(profiles.Update) {})
	require.NoError(t, err)
	idle()
	// The stop above returns before its mailbox has left the stream.
	var fresh func()
	require.Eventually(t, func() bool {
		fresh, err = c.Watch(ctx, "new.ns.svc.cluster.local:80", func(profiles.Update) {})
		return err == nil
	}, defaultTestTimeout, 10*time.Millisecond, "the idle stream never made room")
	defer fresh()
	assert.Equal(t, 2, c.Stats().ProfileWatches, "the held watch and the new one")
	_, err = c.Watch(ctx, "third.ns.svc.cluster.local:80", func(profiles.Update) {})
	assert.ErrorIs(t, err, profiles.ErrTooManyWatches, "a stream with a watcher is never taken")
}

// A watch that gives way to a new one at the bound is freed then, not
// when its idle timeout would have ended: a churn of new names past the
// bound must not keep every evicted watch, with its last state, alive for
// the idle timeout (30 s by default, some 20,000 watches of a proxy's
// names at the churn of examples/faults TestWatchTableFits).
//
// The test keeps the stopped idle timer, as the runtime may keep a stopped
// timer in its heap until the timer's deadline: the watch must not be
// reachable from it. (Beside a second copy of the test suite, a watch
// evicted here stayed referenced for the 10 s the test waits, while the
// timer holding it had an hour to run.)
func TestEvictedWatchIsFreed(t *testing.T) {
	store := controlplane.NewStore()
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	c := newTestClient(t, cp.addr, destination.WithMaxWatches(1), destination.WithIdleTimeout(time.Hour))
	ctx := context.Background()
	const old = "old.ns.svc.cluster.local:80"
	rec := newRecorder[profiles.Update]()
	stop, err := c.Watch(ctx, old, rec.update)
	require.NoError(t, err)
	rec.waitFor(t, "the first answer", func(profiles.Update) bool { return true })
	freed := destination.ProfileWatchCollected(c, old)
	require.False(t, freed(), "a watch in use is kept")
	stop()
	var idle *time.Timer
	require.Eventually(t, func() bool {
		idle = destination.ProfileWatchIdleTimer(c, old)
		return idle != nil
	}, defaultTestTimeout, 10*time.Millisecond, "the watch never became idle")
	var fresh func()
	require.Eventually(t, func() bool {
		fresh, err = c.Watch(ctx, "new.ns.svc.cluster.local:80", func(profiles.Update) {})
		return err == nil
	}, defaultTestTimeout, 10*time.Millisecond, "the idle watch never made room")
	defer fresh()
	require.Eventually(t, freed, defaultTestTimeout, 10*time.Millisecond, "the evicted watch is still referenced")
	runtime.KeepAlive(idle)
}

func TestClosedClient(t *testing.T) {
	store := controlplane.NewStore()
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	c := newTestClient(t, cp.addr)
	_, err := c.Watch(context.Background(), books+":80", func(profiles.Update) {})
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	_, err = c.Watch(context.Background(), books+":80", func(profiles.Update) {})
	assert.ErrorIs(t, err, destination.ErrClosed)
}

func TestWatchEndsWithContext(t *testing.T) {
	store := controlplane.NewStore()
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	c := newTestClient(t, cp.addr, destination.WithIdleTimeout(0))
	store.PutEndpoints(books+":80", nil)
	ctx, cancel := context.WithCancel(context.Background())
	rec := newRecorder[profiles.Update]()
	_, err := c.Watch(ctx, books+":80", rec.update)
	require.NoError(t, err)
	rec.waitFor(t, "default profile", func(u profiles.Update) bool { return u.Profile != nil })
	cancel()
	require.Eventually(t, func() bool { return c.Stats().ProfileWatches == 0 }, defaultTestTimeout, 5*time.Millisecond)
}

// A route of a profile message that does not convert (here one without a
// condition) is left out, as Linkerd's proxy leaves it out; the profile
// with the rest of its routes is delivered, and the stream goes on.
func TestProfileRouteThatDoesNotConvertIsLeftOut(t *testing.T) {
	s := newScripted()
	next := make(chan *pb.DestinationProfile)
	s.profile = func(_ int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
		for {
			select {
			case m := <-next:
				if err := st.Send(m); err != nil {
					return err
				}
			case <-st.Context().Done():
				return nil
			}
		}
	}
	cp := serve(t, s)
	c := newTestClient(t, cp.addr)
	rec := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", rec.update)
	require.NoError(t, err)
	defer stop()

	send := func(m *pb.DestinationProfile) {
		select {
		case next <- m:
		case <-time.After(defaultTestTimeout):
			t.Fatal("stream not open")
		}
	}
	send(destination.ProfileToProto(serviceProfile(books, "good").ProfileFor(7000)))
	rec.waitFor(t, "good", hasRoute("good"))
	partial := destination.ProfileToProto(serviceProfile(books, "kept").ProfileFor(7000))
	partial.Routes = append([]*pb.Route{{MetricsLabels: map[string]string{"route": "no condition"}}}, partial.Routes...)
	send(partial)
	rec.waitFor(t, "the rest of the profile", hasRoute("kept"))
	last := rec.all()[len(rec.all())-1]
	require.NotNil(t, last.Profile)
	assert.Len(t, last.Profile.Routes, 1, "the route without a condition is left out")
	send(destination.ProfileToProto(serviceProfile(books, "good2").ProfileFor(7000)))
	rec.waitFor(t, "good2", hasRoute("good2"))
	assert.Len(t, s.callTimes(), 1, "a bad message does not break the stream")
}

func TestDialRefusesAnInvalidBackoff(t *testing.T) {
	_, err := destination.Dial("127.0.0.1:1", destination.WithBackoff(backoff.Policy{Min: 0, Max: time.Second}))
	assert.ErrorContains(t, err, "WithBackoff: backoff: min 0s must be positive")
}
