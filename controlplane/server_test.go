package controlplane

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
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

const booksSvc = "books.default.svc.cluster.local"

func ep(addr string, h2 bool) endpoint.Endpoint {
	return endpoint.Endpoint{Addr: netip.MustParseAddrPort(addr), Weight: endpoint.DefaultWeight, H2: h2}
}

func routeNamed(name string) profiles.Route {
	return profiles.Route{Condition: profiles.PathRegex("/" + name), Labels: map[string]string{"route": name}}
}

func serviceProfile(name string, routes ...string) *profiles.ServiceProfile {
	sp := &profiles.ServiceProfile{Name: name, Namespace: "default", RetryBudget: profiles.DefaultRetryBudget()}
	for _, r := range routes {
		sp.Routes = append(sp.Routes, routeNamed(r))
	}
	return sp
}

// grpcServer is a Server registered on a gRPC server on a loopback port
// the kernel picked.
type grpcServer struct {
	addr string
	srv  *grpc.Server
	done chan struct{}
}

// serve serves s on its [Server.Listener] until the test ends.
func serve(t *testing.T, s *Server) *grpcServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return serveOn(t, s, s.Listener(lis))
}

// serveOn serves s on lis until the test ends.
func serveOn(t *testing.T, s *Server, lis net.Listener) *grpcServer {
	t.Helper()
	g := &grpcServer{addr: lis.Addr().String(), srv: grpc.NewServer(), done: make(chan struct{})}
	s.Register(g.srv)
	go func() {
		defer close(g.done)
		_ = g.srv.Serve(lis)
	}()
	t.Cleanup(func() {
		g.srv.Stop()
		<-g.done
	})
	return g
}

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
	store := NewStore()
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	t.Run("a Service without a ServiceProfile gets the default profile at once", func(t *testing.T) {
		store.PutEndpoints("web.ns.svc.cluster.local:8080", nil)
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
		sp := serviceProfile(booksSvc, "r1")
		sp.OpaquePorts = []uint32{3306}
		sp.DstOverrides = []endpoint.WeightedDst{{Authority: "books-v2.default.svc.cluster.local", Weight: 10000}}
		store.PutServiceProfile(sp)
		store.PutEndpoints(booksSvc+":7000", nil)
		store.PutEndpoints(booksSvc+":3306", nil)
		st, err := api.GetProfile(ctx, &pb.GetDestination{Path: "Books.Default.svc.cluster.local.:7000"})
		require.NoError(t, err)
		m, err := recvTimeout(t, st.Recv)
		require.NoError(t, err)
		require.Len(t, m.GetRoutes(), 1)
		assert.Equal(t, "books-v2.default.svc.cluster.local:7000", m.GetDstOverrides()[0].GetAuthority(), "port of the request appended")
		assert.False(t, m.GetOpaqueProtocol())

		st3306, err := api.GetProfile(ctx, &pb.GetDestination{Path: booksSvc + ":3306"})
		require.NoError(t, err)
		m, err = recvTimeout(t, st3306.Recv)
		require.NoError(t, err)
		assert.True(t, m.GetOpaqueProtocol())

		store.PutServiceProfile(serviceProfile(booksSvc, "r1", "r2"))
		m, err = recvTimeout(t, st.Recv)
		require.NoError(t, err)
		assert.Len(t, m.GetRoutes(), 2)
		assert.Empty(t, cmp.Diff(&pb.Resource{Group: "linkerd.io", Kind: "ServiceProfile", Name: booksSvc, Namespace: "default"},
			m.GetProfileRef().GetResource(), protocmp.Transform()), "profile_ref names the ServiceProfile")
		store.DeleteServiceProfile(booksSvc)
		m, err = recvTimeout(t, st.Recv)
		require.NoError(t, err)
		assert.Empty(t, m.GetRoutes(), "back to the default profile")
	})
}

func TestServerGet(t *testing.T) {
	store := NewStore()
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
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

	// As Linkerd's controller (controller/api/destination/server.go Get):
	// a Service that does not exist is NotFound; one with no endpoints
	// gets no message until it has some.
	st, err := api.Get(ctx, &pb.GetDestination{Path: "web.ns.svc.cluster.local:80"})
	require.NoError(t, err)
	_, err = recvTimeout(t, st.Recv)
	assert.Equal(t, codes.NotFound, status.Code(err), "%v", err)

	a, b := ep("10.0.0.1:80", true), ep("10.0.0.2:80", false)
	store.PutEndpoints("web.ns.svc.cluster.local:80", nil)
	st, err = api.Get(ctx, &pb.GetDestination{Path: "web.ns.svc.cluster.local:80"})
	require.NoError(t, err)
	store.PutEndpoints("web.ns.svc.cluster.local:80", []endpoint.Endpoint{a, b})
	expect(t, st, add(a, b))
	store.PutEndpoints("web.ns.svc.cluster.local:80", []endpoint.Endpoint{b})
	expect(t, st, remove(a))
	b2 := b
	b2.Labels = map[string]string{"pod": "web-1"}
	store.PutEndpoints("web.ns.svc.cluster.local:80", []endpoint.Endpoint{b2})
	expect(t, st, add(b2))
	store.DeleteEndpoints("web.ns.svc.cluster.local:80")
	expect(t, st, remove(b2))

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
	store := NewStore()
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	store.PutEndpoints(booksSvc+":7000", nil)
	var streams []grpc.ServerStreamingClient[pb.DestinationProfile]
	for range 50 {
		st, err := api.GetProfile(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
		require.NoError(t, err)
		_, err = recvTimeout(t, st.Recv)
		require.NoError(t, err)
		streams = append(streams, st)
	}
	store.PutServiceProfile(serviceProfile(booksSvc, "pushed"))
	for _, st := range streams {
		m, err := recvTimeout(t, st.Recv)
		require.NoError(t, err)
		want := destination.ProfileToProto(serviceProfile(booksSvc, "pushed").ProfileFor(7000))
		assert.True(t, proto.Equal(want.GetRoutes()[0], m.GetRoutes()[0]))
	}
}

// As Linkerd's controller: an authority without a port means port 80, on
// GetProfile and Get.
func TestServerAuthorityWithoutPortIsPort80(t *testing.T) {
	store := NewStore()
	sp := serviceProfile(booksSvc, "r1")
	sp.OpaquePorts = []uint32{80}
	store.PutServiceProfile(sp)
	store.PutEndpoints(booksSvc+":80", []endpoint.Endpoint{ep("10.0.0.1:8080", false)})
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	st, err := api.GetProfile(ctx, &pb.GetDestination{Path: booksSvc})
	require.NoError(t, err)
	m, err := recvTimeout(t, st.Recv)
	require.NoError(t, err)
	assert.Len(t, m.GetRoutes(), 1)
	assert.True(t, m.GetOpaqueProtocol(), "the profile for port 80")

	for path, want := range map[string]string{booksSvc: "10.0.0.1:8080"} {
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
	store := NewStore()
	store.PutEndpoints(booksSvc+":7000", []endpoint.Endpoint{ep("10.0.0.1:8080", false)})
	srv := NewServer(store, WithLogger(quietLogger))
	cp := serve(t, srv)
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	prof, err := api.GetProfile(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
	require.NoError(t, err)
	_, err = recvTimeout(t, prof.Recv)
	require.NoError(t, err)
	eps, err := api.Get(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
	require.NoError(t, err)
	_, err = recvTimeout(t, eps.Recv)
	require.NoError(t, err)

	require.NoError(t, srv.Shutdown(ctx))
	_, err = recvTimeout(t, prof.Recv)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	_, err = recvTimeout(t, eps.Recv)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	late, err := api.Get(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
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

// A ServiceProfile in a client's namespace serves the clients of that
// namespace alone, ahead of the one in the Service's namespace, which
// serves everyone else, as Linkerd's controller answers GetProfile
// (controller/api/destination/server.go profileID and
// subscribeToServicesWithContext). The tokens are those of its
// TestTokenStructure: JSON (with a trailing newline), the older "ns:NS",
// and a token that is neither.
func TestProfileByContextNamespace(t *testing.T) {
	store := NewStore()
	store.PutEndpoints(booksSvc+":7000", nil)
	store.PutServiceProfile(serviceProfile(booksSvc, "server-side"))
	client := serviceProfile(booksSvc, "client-side")
	client.Namespace = "web"
	store.PutServiceProfile(client)
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	for _, tc := range []struct{ token, want string }{
		{`{"ns":"web","nodeName":"node-1"}` + "\n", "client-side"},
		{"ns:web", "client-side"},
		{`{"ns":"other"}`, "server-side"},
		{"ns:other", "server-side"},
		{"", "server-side"},
		{"123fa-test", "server-side"},
		{"ns:web:extra", "server-side"},
	} {
		t.Run(tc.token, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()
			st, err := api.GetProfile(ctx, &pb.GetDestination{Path: booksSvc + ":7000", ContextToken: tc.token})
			require.NoError(t, err)
			m, err := recvTimeout(t, st.Recv)
			require.NoError(t, err)
			require.NotEmpty(t, m.GetRoutes())
			assert.Equal(t, tc.want, m.GetRoutes()[0].GetMetricsLabels()["route"])
		})
	}

	// The client-side profile removed: its namespace falls back to the
	// Service's, on the open stream.
	st, route := profileRoute(t, api, "ns:web")
	require.Equal(t, "client-side", route)
	store.SetServiceProfiles([]*profiles.ServiceProfile{serviceProfile(booksSvc, "server-side")})
	m, err := recvTimeout(t, st.Recv)
	require.NoError(t, err)
	assert.Equal(t, "server-side", m.GetRoutes()[0].GetMetricsLabels()["route"])
}

// Two ServiceProfiles of one name, one in the Service's namespace and one
// in a client's, load from one file as two profiles (as Linkerd keys them,
// by namespace and name), and each serves its clients.
func TestProfilesOfTwoNamespacesFromManifests(t *testing.T) {
	const doc = `apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: books.default.svc.cluster.local
  namespace: default
spec:
  routes:
  - name: server-side
    condition: {method: GET, pathRegex: /server-side}
---
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: books.default.svc.cluster.local
  namespace: web
spec:
  routes:
  - name: client-side
    condition: {method: GET, pathRegex: /client-side}
`
	path := filepath.Join(t.TempDir(), "profiles.yaml")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	store := NewStore()
	store.PutEndpoints(booksSvc+":7000", nil)
	require.NoError(t, store.LoadServiceProfiles(path), "a client namespace's profile beside the Service's")

	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	_, route := profileRoute(t, api, "ns:web")
	assert.Equal(t, "client-side", route)
	_, route = profileRoute(t, api, "")
	assert.Equal(t, "server-side", route)
}

// profileRoute opens GetProfile of books:7000 with token and returns the
// stream and the route label of its first answer's first route.
func profileRoute(t *testing.T, api pb.DestinationClient, token string) (grpc.ServerStreamingClient[pb.DestinationProfile], string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	t.Cleanup(cancel)
	st, err := api.GetProfile(ctx, &pb.GetDestination{Path: booksSvc + ":7000", ContextToken: token})
	require.NoError(t, err)
	m, err := recvTimeout(t, st.Recv)
	require.NoError(t, err)
	require.NotEmpty(t, m.GetRoutes())
	return st, m.GetRoutes()[0].GetMetricsLabels()["route"]
}
