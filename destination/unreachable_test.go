package destination_test

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// answering is a control plane that answers inmesh's Watches stream and
// Linkerd's GetProfile stream with one error status: it was reached, and
// said so (not ready, a gateway in front of it without a healthy backend,
// a caller it refuses).
type answering struct {
	watchespb.UnimplementedWatchesServer
	pb.UnimplementedDestinationServer
	err error
}

func (a answering) Watch(grpc.BidiStreamingServer[watchespb.WatchRequest, watchespb.WatchResponse]) error {
	return a.err
}

func (a answering) GetProfile(*pb.GetDestination, grpc.ServerStreamingServer[pb.DestinationProfile]) error {
	return a.err
}

// serveAnswering serves an answering control plane with status code and
// message msg until the test ends, and returns its address.
func serveAnswering(t *testing.T, code codes.Code, msg string) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	a := answering{err: status.Error(code, msg)}
	watchespb.RegisterWatchesServer(g, a)
	pb.RegisterDestinationServer(g, a)
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-served })
	return lis.Addr().String()
}

// firstError returns the error of the first update with one, of a profile
// watch through c.
func firstError(t *testing.T, c *destination.Client) error {
	prof := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	t.Cleanup(stop)
	return prof.waitFor(t, "the unanswered update", func(u profiles.Update) bool { return u.Err != nil }).Err
}

// An UNAVAILABLE the control plane answers itself is not ErrUnreachable,
// on the Watches stream too, where the answer comes as the stream opens
// (it was taken for an unreachable control plane, which kept gRPC calls
// waiting for their route).
func TestUnavailableAnswerIsNotUnreachable(t *testing.T) {
	err := firstError(t, newTestClient(t, serveAnswering(t, codes.Unavailable, "control plane not ready")))
	assert.Equal(t, codes.Unavailable, status.Code(err), "the control plane's status: %v", err)
	assert.False(t, errors.Is(err, destination.ErrUnreachable),
		"the control plane answered UNAVAILABLE itself, yet the update says it was not reached: %v", err)
}

// A control plane that refuses the connection is ErrUnreachable, the
// status UNAVAILABLE kept.
func TestRefusedControlPlaneIsUnreachable(t *testing.T) {
	err := firstError(t, newTestClient(t, testutil.RefusedAddr(t).String()))
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.ErrorIs(t, err, destination.ErrUnreachable)
}

// The status a control plane answers as the Watches stream opens reaches
// the update as the same status (code and message) as on Linkerd's
// per-name stream (the wrapper that keeps such an answer from being taken
// for an unreachable control plane had prefixed its message).
func TestAnsweredStatusMessageUnchanged(t *testing.T) {
	addr := serveAnswering(t, codes.PermissionDenied, "caller not authorized")
	for _, tc := range []struct {
		name string
		opts []destination.Option
	}{{"watches", nil}, {"linkerd", []destination.Option{destination.WithLinkerdStreams()}}} {
		t.Run(tc.name, func(t *testing.T) {
			err := firstError(t, newTestClient(t, addr, tc.opts...))
			assert.Equal(t, codes.PermissionDenied, status.Code(err))
			assert.Equal(t, "caller not authorized", status.Convert(err).Message(), "status message of %v", err)
			_, isStatus := err.(interface{ GRPCStatus() *status.Status })
			assert.True(t, isStatus, "the error is a gRPC status error itself (%T)", err)
		})
	}
}
