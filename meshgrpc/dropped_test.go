package meshgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// droppingApp fails every EmptyCall UNAVAILABLE, answers UnaryCall, and
// streams one message on StreamingOutputCall, then holds the stream open
// without a status until its client goes away.
type droppingApp struct {
	testgrpc.UnimplementedTestServiceServer
}

func (droppingApp) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return nil, status.Error(codes.Unavailable, "down")
}

func (droppingApp) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{}, nil
}

func (droppingApp) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	if err := s.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
		return err
	}
	<-s.Context().Done()
	return s.Context().Err()
}

// cancelledEnds is a client stats handler that says when a call cancelled
// by its caller has ended; grpc-go calls it after the pick's Done.
type cancelledEnds chan struct{}

func (c cancelledEnds) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c cancelledEnds) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (c cancelledEnds) HandleConn(context.Context, stats.ConnStats) {}
func (c cancelledEnds) HandleRPC(_ context.Context, s stats.RPCStats) {
	if e, ok := s.(*stats.End); ok && status.Code(e.Error) == codes.Canceled {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// A server stream its caller cancels after the first message, before any
// status, counts in failure accrual as a success, as Linkerd's breaker
// counts a gRPC response body dropped before its status (linkerd2-proxy
// linkerd/http/classify/src/channel.rs sends eos(None) when the body is
// dropped, which linkerd/app/core/src/classify.rs ends as
// Grpc(Ok(UNKNOWN)), not a failure): it breaks a run of failures. Two
// failures around it do not trip an endpoint that needs two in a row.
// Before, the dropped stream said nothing, and the two failures tripped
// the endpoint.
func TestDroppedStreamBreaksFailureRun(t *testing.T) {
	addr := serveTestService(t, droppingApp{})
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: addr}}})
	ends := make(cancelledEnds, 1)
	opts := meshgrpc.DialOptions(serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithFailureAccrual(&balancer.FailureAccrual{
		ConsecutiveFailures: &balancer.ConsecutiveFailures{MaxFailures: 2, Backoff: balancer.Backoff{MinBackoff: time.Hour}}})))
	cc, err := grpc.NewClient(booksTarget, append(opts, grpc.WithStatsHandler(ends))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	c := testgrpc.NewTestServiceClient(cc)
	ctx := callCtx(t)

	_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	sctx, cancel := context.WithCancel(ctx)
	s, err := c.StreamingOutputCall(sctx, &testgrpc.StreamingOutputCallRequest{})
	require.NoError(t, err)
	_, err = s.Recv()
	require.NoError(t, err)
	cancel()
	testutil.Recv(t, ends, "the end of the cancelled stream")

	_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	_, err = c.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	assert.NoError(t, err, "the endpoint is in rotation: one failure in a row")
}
