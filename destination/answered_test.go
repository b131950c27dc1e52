package destination_test

import (
	"context"
	"net"
	"testing"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type deniedWatches struct {
	watchespb.UnimplementedWatchesServer
}

func (deniedWatches) Watch(grpc.BidiStreamingServer[watchespb.WatchRequest, watchespb.WatchResponse]) error {
	return status.Error(codes.PermissionDenied, "caller not authorized")
}

type deniedDest struct {
	pb.UnimplementedDestinationServer
}

func (deniedDest) GetProfile(*pb.GetDestination, grpc.ServerStreamingServer[pb.DestinationProfile]) error {
	return status.Error(codes.PermissionDenied, "caller not authorized")
}

// The status a control plane answers as the Watches stream opens reaches
// the update as the same status (code and message) as on Linkerd's
// per-name stream (the wrapper that keeps such an answer from being taken
// for an unreachable control plane had prefixed its message).
func TestAnsweredStatusMessageUnchanged(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	watchespb.RegisterWatchesServer(g, deniedWatches{})
	pb.RegisterDestinationServer(g, deniedDest{})
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-served })

	for _, tc := range []struct {
		name string
		opts []destination.Option
	}{{"watches", nil}, {"linkerd", []destination.Option{destination.WithLinkerdStreams()}}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestClient(t, lis.Addr().String(), tc.opts...)
			prof := newRecorder[profiles.Update]()
			stop, err := c.Watch(context.Background(), books+":7000", prof.update)
			require.NoError(t, err)
			defer stop()
			u := prof.waitFor(t, "the unanswered update", func(u profiles.Update) bool { return u.Err != nil })
			assert.Equal(t, codes.PermissionDenied, status.Code(u.Err))
			assert.Equal(t, "caller not authorized", status.Convert(u.Err).Message(), "status message of %v", u.Err)
			_, isStatus := u.Err.(interface{ GRPCStatus() *status.Status })
			assert.True(t, isStatus, "u.Err is a gRPC status error itself (%T)", u.Err)
		})
	}
}
