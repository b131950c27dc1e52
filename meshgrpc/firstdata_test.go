package meshgrpc_test

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// streamingApp is a real gRPC server whose streams send one message and
// then hold until released; its unary calls succeed, but for the one
// after arming, which fails Trailers-Only with UNAVAILABLE.
type streamingApp struct {
	testgrpc.UnimplementedTestServiceServer
	calls, streams atomic.Int64
	armed          atomic.Bool
	release        <-chan struct{}
}

func (a *streamingApp) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	a.calls.Add(1)
	if a.armed.CompareAndSwap(true, false) {
		return nil, status.Error(codes.Unavailable, "overloaded")
	}
	return &testgrpc.Empty{}, nil
}

func (a *streamingApp) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	a.streams.Add(1)
	if err := s.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
		return err
	}
	select {
	case <-a.release:
	case <-s.Context().Done():
		return s.Context().Err()
	}
	return s.Send(&testgrpc.StreamingOutputCallResponse{})
}

func (a *streamingApp) FullDuplexCall(s grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	a.streams.Add(1)
	if _, err := s.Recv(); err != nil {
		return err
	}
	if err := s.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
		return err
	}
	select {
	case <-a.release:
	case <-s.Context().Done():
		return s.Context().Err()
	}
	return s.Send(&testgrpc.StreamingOutputCallResponse{})
}

// A server-streaming or bidi call is in flight on its endpoint until its
// first response message, as Linkerd's balancer counts a request until the
// first data frame of its response (linkerd2-proxy
// hyper-balance/src/lib.rs, PendingUntilFirstData;
// linkerd/proxy/http/src/balance.rs), not until the stream ends: a long
// stream that has begun does not keep its endpoint's load high.
//
// Two endpoints, s and q, keep a 1 s RTT estimate throughout (a one-hour
// decay; the calls' own sub-millisecond times barely move it), but q
// answers one call with UNAVAILABLE, whose 1.42 s penalty becomes its
// estimate. P2C takes the second endpoint drawn only when its load is
// below three quarters of the first's, so an endpoint clearly cheaper
// gets every call. A stream then opens and goes to s (1 s against q's
// 1.42 s) and is read past its first message. Counted to its first
// message, s still costs 1 s and every unary call goes to s; counted to
// its end, s costs 2 s and every call goes to q. (Before: every call went
// to q.)
func TestStreamPendingUntilFirstMessage(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(ctx context.Context, c testgrpc.TestServiceClient) (func() error, error) // returns Recv
	}{
		{"server-streaming", func(ctx context.Context, c testgrpc.TestServiceClient) (func() error, error) {
			st, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
			if err != nil {
				return nil, err
			}
			return func() error { _, err := st.Recv(); return err }, nil
		}},
		{"bidi", func(ctx context.Context, c testgrpc.TestServiceClient) (func() error, error) {
			st, err := c.FullDuplexCall(ctx)
			if err != nil {
				return nil, err
			}
			if err := st.Send(&testgrpc.StreamingOutputCallRequest{}); err != nil {
				return nil, err
			}
			if err := st.CloseSend(); err != nil {
				return nil, err
			}
			return func() error { _, err := st.Recv(); return err }, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var once sync.Once
			stop := func() { once.Do(func() { close(release) }) }
			t.Cleanup(stop) // before the servers stop, which wait for the streams
			s, q := &streamingApp{release: release}, &streamingApp{release: release}
			store := controlplane.NewStore()
			manifests(t, store, booksService)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: serveTestService(t, s)}, {Addr: serveTestService(t, q)}}})
			c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithPenaltyPeakEWMA(
				&balancer.PenaltyPeakEWMA{DefaultRTT: time.Second, Decay: time.Hour, Penalty: 1420 * time.Millisecond})))
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
			defer cancel()
			call := func() error {
				_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
				return err
			}
			// Both endpoints are ready once each has answered a call.
			for s.calls.Load() == 0 || q.calls.Load() == 0 {
				require.Less(t, s.calls.Load()+q.calls.Load(), int64(10_000), "an endpoint got no call")
				require.NoError(t, call())
			}
			// Calls until q answers UNAVAILABLE.
			q.armed.Store(true)
			for q.armed.Load() {
				require.Less(t, s.calls.Load(), int64(10_000), "no call reached q")
				was := q.calls.Load()
				err := call()
				if q.calls.Load() > was {
					require.Equal(t, codes.Unavailable, status.Code(err))
				} else {
					require.NoError(t, err)
				}
			}

			recv, err := tc.open(ctx, c)
			require.NoError(t, err)
			require.NoError(t, recv(), "the first message")
			require.EqualValues(t, 1, s.streams.Load(), "the stream went to s")
			require.Zero(t, q.streams.Load())

			sBefore, qBefore := s.calls.Load(), q.calls.Load()
			const n = 20
			for range n {
				require.NoError(t, call())
			}
			got := map[string]int64{"s": s.calls.Load() - sBefore, "q": q.calls.Load() - qBefore}
			assert.EqualValues(t, n, got["s"], "calls to the endpoint whose stream has begun, of %d: %v", n, got)

			stop()
			require.NoError(t, recv(), "the last message")
			require.ErrorIs(t, recv(), io.EOF)
		})
	}
}
