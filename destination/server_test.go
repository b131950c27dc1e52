package destination_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"

	"github.com/inmesh/inmesh/balancer/endpoint"
	pb "github.com/inmesh/inmesh/destination/destinationpb"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/google/go-cmp/cmp"
)

// rawClient talks to a server with the generated client alone, to check
// the exact messages on the wire.
func rawClient(t *testing.T, addr string) pb.DestinationClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return pb.NewDestinationClient(conn)
}

func recvTimeout[M any](t *testing.T, recv func() (M, error)) (M, error) {
	t.Helper()
	type result struct {
		m   M
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := recv()
		ch <- result{m, err}
	}()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-time.After(defaultTestTimeout):
		t.Fatal("no message")
	}
	panic("unreachable")
}

func TestServerGetProfile(t *testing.T) {
	store := controlplane.NewStore()
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	t.Run("unknown service gets the default profile at once", func(t *testing.T) {
		st, err := api.GetProfile(ctx, &pb.GetDestination{Path: "web.ns.svc.cluster.local:8080"})
		require.NoError(t, err)
		m, err := recvTimeout(t, st.Recv)
		require.NoError(t, err)
		// The refs as Linkerd's destination controller sends them
		// (controller/api/destination/profile_translator.go): the Service
		// port, and only the ServiceProfile group without a profile.
		want := &pb.DestinationProfile{
			FullyQualifiedName: "web.ns.svc.cluster.local",
			RetryBudget:        &pb.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, Ttl: durationpb.New(10 * time.Second)},
			ParentRef:          &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{Group: "core", Kind: "Service", Name: "web", Namespace: "ns", Port: 8080}}},
			ProfileRef:         &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{Group: "linkerd.io"}}},
		}
		assert.Empty(t, cmp.Diff(want, m, protocmp.Transform()))
	})
	t.Run("an IP authority has no name", func(t *testing.T) {
		st, err := api.GetProfile(ctx, &pb.GetDestination{Path: "10.1.2.3:8080"})
		require.NoError(t, err)
		m, err := recvTimeout(t, st.Recv)
		require.NoError(t, err)
		assert.Empty(t, m.GetFullyQualifiedName())
	})
	for _, bad := range []string{"", "web:", "::1", "web:0", "web:99999", "bad host:80", "-x.ns:80"} {
		t.Run("invalid authority "+bad, func(t *testing.T) {
			st, err := api.GetProfile(ctx, &pb.GetDestination{Path: bad})
			require.NoError(t, err)
			_, err = recvTimeout(t, st.Recv)
			assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			st2, err := api.Get(ctx, &pb.GetDestination{Path: bad})
			require.NoError(t, err)
			_, err = recvTimeout(t, st2.Recv)
			assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		})
	}
	t.Run("profile serves every port of its name; change is pushed", func(t *testing.T) {
		sp := serviceProfile(books, "r1")
		sp.OpaquePorts = []uint32{3306}
		sp.DstOverrides = []endpoint.WeightedDst{{Authority: "books-v2.default.svc.cluster.local", Weight: 10000}}
		store.PutServiceProfile(sp)
		st, err := api.GetProfile(ctx, &pb.GetDestination{Path: "Books.Default.svc.cluster.local.:7000"})
		require.NoError(t, err)
		m, err := recvTimeout(t, st.Recv)
		require.NoError(t, err)
		require.Len(t, m.GetRoutes(), 1)
		assert.Equal(t, "books-v2.default.svc.cluster.local:7000", m.GetDstOverrides()[0].GetAuthority(), "port of the request appended")
		assert.False(t, m.GetOpaqueProtocol())

		st3306, err := api.GetProfile(ctx, &pb.GetDestination{Path: books + ":3306"})
		require.NoError(t, err)
		m, err = recvTimeout(t, st3306.Recv)
		require.NoError(t, err)
		assert.True(t, m.GetOpaqueProtocol())

		store.PutServiceProfile(serviceProfile(books, "r1", "r2"))
		m, err = recvTimeout(t, st.Recv)
		require.NoError(t, err)
		assert.Len(t, m.GetRoutes(), 2)
		assert.Empty(t, cmp.Diff(&pb.Resource{Group: "linkerd.io", Kind: "ServiceProfile", Name: books, Namespace: "default"},
			m.GetProfileRef().GetResource(), protocmp.Transform()), "profile_ref names the ServiceProfile")
		store.DeleteServiceProfile(books)
		m, err = recvTimeout(t, st.Recv)
		require.NoError(t, err)
		assert.Empty(t, m.GetRoutes(), "back to the default profile")
	})
}

func TestServerGet(t *testing.T) {
	store := controlplane.NewStore()
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	noEndpoints := func(exists bool) *pb.Update {
		return &pb.Update{Update: &pb.Update_NoEndpoints{NoEndpoints: &pb.NoEndpoints{Exists: exists}}}
	}
	add := func(eps ...endpoint.Endpoint) *pb.Update {
		var ws []*pb.WeightedAddr
		for _, e := range eps {
			ws = append(ws, destination.EndpointToProto(e))
		}
		// The set-level labels Linkerd's destination controller sends
		// (controller/api/destination/watcher/port_publisher.go).
		labels := map[string]string{"namespace": "ns", "service": "web"}
		return &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{Addrs: ws, MetricLabels: labels}}}
	}
	remove := func(eps ...endpoint.Endpoint) *pb.Update {
		var as []*pb.TcpAddress
		for _, e := range eps {
			as = append(as, destination.AddrToProto(e.Addr))
		}
		return &pb.Update{Update: &pb.Update_Remove{Remove: &pb.AddrSet{Addrs: as}}}
	}
	expect := func(t *testing.T, st grpc.ServerStreamingClient[pb.Update], want *pb.Update) {
		t.Helper()
		m, err := recvTimeout(t, st.Recv)
		require.NoError(t, err)
		assert.Empty(t, cmp.Diff(want, m, protocmp.Transform()))
	}

	st, err := api.Get(ctx, &pb.GetDestination{Path: "web.ns.svc.cluster.local:80"})
	require.NoError(t, err)
	expect(t, st, noEndpoints(false))

	a, b := ep("10.0.0.1:80", true), ep("10.0.0.2:80", false)
	store.PutEndpoints("web.ns.svc.cluster.local:80", nil)
	expect(t, st, noEndpoints(true))
	store.PutEndpoints("web.ns.svc.cluster.local:80", []endpoint.Endpoint{a, b})
	expect(t, st, add(a, b))
	store.PutEndpoints("web.ns.svc.cluster.local:80", []endpoint.Endpoint{b})
	expect(t, st, remove(a))
	b2 := b
	b2.Labels = map[string]string{"pod": "web-1"}
	store.PutEndpoints("web.ns.svc.cluster.local:80", []endpoint.Endpoint{b2})
	expect(t, st, add(b2))
	store.DeleteEndpoints("web.ns.svc.cluster.local:80")
	expect(t, st, noEndpoints(false))

	// A new subscription starts with the whole state.
	store.PutEndpoints("web.ns.svc.cluster.local:80", []endpoint.Endpoint{a, b})
	st2, err := api.Get(ctx, &pb.GetDestination{Path: "web.ns.svc.cluster.local:80"})
	require.NoError(t, err)
	expect(t, st2, add(a, b))
	// An unrelated change sends nothing: the next message is the real one.
	store.PutEndpoints("other.ns.svc.cluster.local:80", []endpoint.Endpoint{a})
	store.PutEndpoints("web.ns.svc.cluster.local:80", []endpoint.Endpoint{a})
	expect(t, st2, remove(b))
}

func TestStoreUpdateReachesStream(t *testing.T) {
	// Many streams, one change: every stream gets it without polling.
	store := controlplane.NewStore()
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	var streams []grpc.ServerStreamingClient[pb.DestinationProfile]
	for range 50 {
		st, err := api.GetProfile(ctx, &pb.GetDestination{Path: books + ":7000"})
		require.NoError(t, err)
		_, err = recvTimeout(t, st.Recv)
		require.NoError(t, err)
		streams = append(streams, st)
	}
	store.PutServiceProfile(serviceProfile(books, "pushed"))
	for _, st := range streams {
		m, err := recvTimeout(t, st.Recv)
		require.NoError(t, err)
		want := destination.ProfileToProto(serviceProfile(books, "pushed").ProfileFor(7000))
		assert.True(t, proto.Equal(want.GetRoutes()[0], m.GetRoutes()[0]))
	}
}

// As Linkerd's controller: an authority without a port means port 80, on
// GetProfile and Get.
func TestServerAuthorityWithoutPortIsPort80(t *testing.T) {
	store := controlplane.NewStore()
	sp := serviceProfile(books, "r1")
	sp.OpaquePorts = []uint32{80}
	store.PutServiceProfile(sp)
	store.PutEndpoints(books+":80", []endpoint.Endpoint{ep("10.0.0.1:8080", false)})
	store.PutEndpoints("[fd00::1]:80", []endpoint.Endpoint{ep("10.0.0.2:8080", false)})
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	st, err := api.GetProfile(ctx, &pb.GetDestination{Path: books})
	require.NoError(t, err)
	m, err := recvTimeout(t, st.Recv)
	require.NoError(t, err)
	assert.Len(t, m.GetRoutes(), 1)
	assert.True(t, m.GetOpaqueProtocol(), "the profile for port 80")

	for path, want := range map[string]string{books: "10.0.0.1:8080", "[fd00::1]": "10.0.0.2:8080"} {
		eps, err := api.Get(ctx, &pb.GetDestination{Path: path})
		require.NoError(t, err)
		u, err := recvTimeout(t, eps.Recv)
		require.NoError(t, err)
		require.Len(t, u.GetAdd().GetAddrs(), 1, path)
		addr, err := destination.AddrFromProto(u.GetAdd().GetAddrs()[0].GetAddr())
		require.NoError(t, err)
		assert.Equal(t, want, addr.String(), path)
	}
}

// Shutdown ends every open stream at once (GracefulStop alone would wait
// for them forever), refuses new ones, and lets GracefulStop return.
func TestServerShutdownEndsStreams(t *testing.T) {
	store := controlplane.NewStore()
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{ep("10.0.0.1:8080", false)})
	srv := controlplane.NewServer(store, controlplane.WithLogger(quietLogger))
	cp := serve(t, srv)
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	prof, err := api.GetProfile(ctx, &pb.GetDestination{Path: books + ":7000"})
	require.NoError(t, err)
	_, err = recvTimeout(t, prof.Recv)
	require.NoError(t, err)
	eps, err := api.Get(ctx, &pb.GetDestination{Path: books + ":7000"})
	require.NoError(t, err)
	_, err = recvTimeout(t, eps.Recv)
	require.NoError(t, err)

	require.NoError(t, srv.Shutdown(ctx))
	_, err = recvTimeout(t, prof.Recv)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	_, err = recvTimeout(t, eps.Recv)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	late, err := api.Get(ctx, &pb.GetDestination{Path: books + ":7000"})
	require.NoError(t, err)
	_, err = recvTimeout(t, late.Recv)
	assert.Equal(t, codes.Unavailable, status.Code(err), "a new stream is refused: %v", err)

	stopped := make(chan struct{})
	go func() {
		cp.srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(defaultTestTimeout):
		t.Fatal("GracefulStop did not return after Shutdown")
	}
	require.NoError(t, srv.Shutdown(ctx), "a second Shutdown is fine")
}

// A client watching a Server that shuts down re-subscribes at once to the
// replacement, which here serves a changed state, over the same connection
// target.
func TestClientFollowsShutdownToReplacement(t *testing.T) {
	oldStore, newStore := controlplane.NewStore(), controlplane.NewStore()
	oldStore.PutServiceProfile(serviceProfile(books, "old"))
	newStore.PutServiceProfile(serviceProfile(books, "new"))
	oldSrv := controlplane.NewServer(oldStore, controlplane.WithLogger(quietLogger))
	newSrv := controlplane.NewServer(newStore, controlplane.WithLogger(quietLogger))

	// One gRPC server, two Destination services behind a switch: the
	// client's connection and its target stay the same, as when a
	// replacement process takes over the port.
	sw := &switchable{}
	sw.cur.Store(oldSrv)
	cp := serve(t, sw)
	c := newTestClient(t, cp.addr)
	rec := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", rec.update)
	require.NoError(t, err)
	defer stop()
	rec.waitFor(t, "the old profile", hasRoute("old"))

	sw.cur.Store(newSrv)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	require.NoError(t, oldSrv.Shutdown(ctx))
	rec.waitFor(t, "the new profile", hasRoute("new"))
	require.NoError(t, newSrv.Shutdown(ctx))
}

// switchable forwards each call to the current Destination service.
type switchable struct {
	pb.UnimplementedDestinationServer
	cur atomic.Pointer[controlplane.Server]
}

func (s *switchable) GetProfile(req *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
	return s.cur.Load().GetProfile(req, st)
}

func (s *switchable) Get(req *pb.GetDestination, st grpc.ServerStreamingServer[pb.Update]) error {
	return s.cur.Load().Get(req, st)
}
