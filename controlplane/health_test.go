package controlplane

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// defaultTestShortTimeout bounds a wait for something that must not
// happen.
const defaultTestShortTimeout = 300 * time.Millisecond

// healthOf returns the status a replica's health service answers for
// service, or the error of the check.
func healthOf(t *testing.T, addr, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return resp.GetStatus(), err
}

// A replica that lost its source goes on serving its last state while no
// other replica is known to follow it (Stale), and its clients stay. On
// Standby it ends its streams, refuses connections, and its clients move
// to the next replica of their list, keeping what they had meanwhile.
// Back to Current it serves again; the clients that moved stay where they
// are.
func TestStandbyMovesClientsToTheNextReplica(t *testing.T) {
	const authority = booksSvc + ":7000"
	storeA, storeB := NewStore(), NewStore()
	storeA.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.1:8080", false)})
	storeB.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.2:8080", false)})
	a, b := NewServer(storeA, WithLogger(quietLogger)), NewServer(storeB, WithLogger(quietLogger))
	cpA, cpB := serve(t, a), serve(t, b)

	fast, err := backoff.Fixed(20 * time.Millisecond)
	require.NoError(t, err)
	client, err := destination.Dial(cpA.addr+","+cpB.addr, destination.WithLogger(quietLogger), destination.WithBackoff(fast))
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	var mu sync.Mutex
	var got []string
	stop, err := client.WatchEndpoints(context.Background(), authority, func(u endpoint.Update) {
		mu.Lock()
		defer mu.Unlock()
		got = nil
		if u.Set != nil {
			for _, e := range u.Set.Endpoints {
				got = append(got, e.Addr.String())
			}
		}
	})
	require.NoError(t, err)
	t.Cleanup(stop)
	answer := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), got...) }
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual([]string{"10.0.0.1:8080"}, answer()) },
		defaultTestTimeout, 5*time.Millisecond, "the client is on the first replica")

	for service, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
		"": healthpb.HealthCheckResponse_SERVING, CurrentHealthService: healthpb.HealthCheckResponse_SERVING} {
		st, err := healthOf(t, cpA.addr, service)
		require.NoError(t, err)
		assert.Equal(t, want, st, "current, %q", service)
	}
	_, err = healthOf(t, cpA.addr, "unknown")
	assert.Equal(t, codes.NotFound, status.Code(err), "%v", err)

	a.SetHealth(Stale)
	assert.Equal(t, Stale, a.Health())
	for service, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
		"": healthpb.HealthCheckResponse_SERVING, CurrentHealthService: healthpb.HealthCheckResponse_NOT_SERVING} {
		st, err := healthOf(t, cpA.addr, service)
		require.NoError(t, err)
		assert.Equal(t, want, st, "stale, %q", service)
	}
	assert.Never(t, func() bool { return !assert.ObjectsAreEqual([]string{"10.0.0.1:8080"}, answer()) },
		defaultTestShortTimeout, 5*time.Millisecond, "a stale replica keeps its clients")

	a.SetHealth(Standby)
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual([]string{"10.0.0.2:8080"}, answer()) },
		defaultTestTimeout, 5*time.Millisecond, "the client moved to the second replica")
	_, err = healthOf(t, cpA.addr, "")
	assert.Equal(t, codes.Unavailable, status.Code(err), "a replica on standby refuses connections: %v", err)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	st, err := rawClient(t, cpA.addr).Get(ctx, &pb.GetDestination{Path: authority})
	if err == nil {
		_, err = recvTimeout(t, st.Recv)
	}
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	a.SetHealth(Current)
	st, err = rawClient(t, cpA.addr).Get(ctx, &pb.GetDestination{Path: authority})
	require.NoError(t, err)
	u, err := recvTimeout(t, st.Recv)
	require.NoError(t, err, "back to current, the replica serves")
	require.Len(t, u.GetAdd().GetAddrs(), 1)
	assert.Never(t, func() bool { return !assert.ObjectsAreEqual([]string{"10.0.0.2:8080"}, answer()) },
		defaultTestShortTimeout, 5*time.Millisecond, "the clients that moved stay")
}

// Standby ends the open streams with Unavailable and refuses new ones,
// as Shutdown does, but only until the Server is Current or Stale again;
// Shutdown is for good. A health Watch follows every change.
func TestStandbyEndsStreamsUntilServingAgain(t *testing.T) {
	store := NewStore()
	store.PutEndpoints(booksSvc+":7000", []endpoint.Endpoint{ep("10.0.0.1:8080", false)})
	srv := NewServer(store, WithLogger(quietLogger))
	// Served without Server.Listener: the streams end, the connection
	// stays.
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := serveOn(t, srv, plain).addr
	api := rawClient(t, addr)
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	watch, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{Service: CurrentHealthService})
	require.NoError(t, err)
	h, err := recvTimeout(t, watch.Recv)
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.GetStatus())
	eps, err := api.Get(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
	require.NoError(t, err)
	_, err = recvTimeout(t, eps.Recv)
	require.NoError(t, err)

	srv.SetHealth(Stale)
	h, err = recvTimeout(t, watch.Recv)
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, h.GetStatus(), "stale is not current")

	srv.SetHealth(Standby)
	_, err = recvTimeout(t, eps.Recv)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "another replica follows it")
	_, err = recvTimeout(t, watch.Recv)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	late, err := api.Get(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
	require.NoError(t, err)
	_, err = recvTimeout(t, late.Recv)
	assert.Equal(t, codes.Unavailable, status.Code(err), "a new stream is refused on standby: %v", err)

	srv.SetHealth(Current)
	again, err := api.Get(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
	require.NoError(t, err)
	_, err = recvTimeout(t, again.Recv)
	require.NoError(t, err, "served again")

	require.NoError(t, srv.Shutdown(ctx))
	_, err = recvTimeout(t, again.Recv)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "shutting down")
	srv.SetHealth(Stale)
	srv.SetHealth(Current)
	late, err = api.Get(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
	require.NoError(t, err)
	_, err = recvTimeout(t, late.Recv)
	assert.Equal(t, codes.Unavailable, status.Code(err), "shut down for good: %v", err)
}
