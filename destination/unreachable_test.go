package destination_test

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// unavailableWatches is a control plane that serves inmesh's Watches
// service and answers it UNAVAILABLE (not ready, or a gateway in front of
// it without a healthy backend): it was reached, and said so.
type unavailableWatches struct {
	watchespb.UnimplementedWatchesServer
}

func (unavailableWatches) Watch(grpc.BidiStreamingServer[watchespb.WatchRequest, watchespb.WatchResponse]) error {
	return status.Error(codes.Unavailable, "control plane not ready")
}

// An UNAVAILABLE the control plane answers itself is not ErrUnreachable,
// on the Watches stream too, where the answer comes as the stream opens
// (it was taken for an unreachable control plane, which kept gRPC calls
// waiting for their route).
func TestUnavailableAnswerIsNotUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	watchespb.RegisterWatchesServer(g, unavailableWatches{})
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-served })

	c := newTestClient(t, lis.Addr().String())
	prof := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	defer stop()
	u := prof.waitFor(t, "the unanswered update", func(u profiles.Update) bool { return u.Err != nil })
	assert.Equal(t, codes.Unavailable, status.Code(u.Err), "the control plane's status: %v", u.Err)
	assert.False(t, errors.Is(u.Err, destination.ErrUnreachable),
		"the control plane answered UNAVAILABLE itself, yet the update says it was not reached: %v", u.Err)
}

// A control plane that refuses the connection is ErrUnreachable, the
// status UNAVAILABLE kept.
func TestRefusedControlPlaneIsUnreachable(t *testing.T) {
	c := newTestClient(t, testutil.RefusedAddr(t).String())
	prof := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	defer stop()
	u := prof.waitFor(t, "the unanswered update", func(u profiles.Update) bool { return u.Err != nil })
	assert.Equal(t, codes.Unavailable, status.Code(u.Err), "%v", u.Err)
	assert.ErrorIs(t, u.Err, destination.ErrUnreachable)
}
