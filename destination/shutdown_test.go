package destination_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/inmesh/inmesh/controlplane"

	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// A client watching a Server that shuts down re-subscribes at once to the
// replacement, which here serves a changed state, over the same connection
// target.
func TestClientFollowsShutdownToReplacement(t *testing.T) {
	oldStore, newStore := controlplane.NewStore(), controlplane.NewStore()
	oldStore.PutServiceProfile(serviceProfile(books, "old"))
	newStore.PutServiceProfile(serviceProfile(books, "new"))
	oldStore.PutEndpoints(books+":7000", nil)
	newStore.PutEndpoints(books+":7000", nil)
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
