package meshgrpc_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// biasApp is a real gRPC server whose call after arming ends with code:
// a unary call's as a unary error (Trailers-Only), a streaming call's
// after one message (in the trailers). Every other call succeeds.
type biasApp struct {
	testgrpc.UnimplementedTestServiceServer
	calls atomic.Int64
	armed atomic.Bool
	code  codes.Code
}

func (a *biasApp) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	a.calls.Add(1)
	if a.armed.CompareAndSwap(true, false) {
		return nil, status.Error(a.code, "answered "+a.code.String())
	}
	return &testgrpc.Empty{}, nil
}

func (a *biasApp) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s testgrpc.TestService_StreamingOutputCallServer) error {
	a.calls.Add(1)
	if err := s.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
		return err
	}
	if a.armed.CompareAndSwap(true, false) {
		return status.Error(a.code, "answered "+a.code.String())
	}
	return nil
}

// meshgrpc's balancer penalizes an endpoint's load for the status of a
// call as linkerd2-proxy's load biaser does (linkerd/load-biaser/src/
// lib.rs, failure_hint; rows named after its tests are their cases): a
// RESOURCE_EXHAUSTED, UNAVAILABLE, UNKNOWN, DEADLINE_EXCEEDED, INTERNAL or
// DATA_LOSS that a real grpc-go server answered Trailers-Only (a unary
// error) sets the penalty, and the endpoint gets none of the next calls;
// the other codes, and a status in the trailers after a message, set none,
// and the endpoint keeps its share. Both endpoints start at a default RTT
// (1 s) that the calls' own sub-millisecond times barely move, so their
// loads are alike but for a penalty, the estimate's new 5 s peak.
func TestLoadPenaltyAsLinkerd(t *testing.T) {
	type row struct {
		name         string
		code         codes.Code
		afterMessage bool
		penalized    bool
	}
	var rows []row
	for _, code := range []codes.Code{codes.ResourceExhausted, codes.Unavailable, codes.Internal, codes.Unknown, codes.DeadlineExceeded, codes.DataLoss} {
		rows = append(rows, row{name: "test_grpc_server_errors_record_effective_rtt (" + code.String() + ")", code: code, penalized: true})
	}
	for _, code := range []codes.Code{codes.Canceled, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.Aborted, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated} {
		rows = append(rows, row{name: "test_grpc_client_errors_record_low_rtt (" + code.String() + ")", code: code})
	}
	rows = append(rows,
		row{name: "test_grpc_ok_records_low_rtt", code: codes.OK},
		row{name: "failure_hint: RESOURCE_EXHAUSTED in the trailers after a message", code: codes.ResourceExhausted, afterMessage: true},
		row{name: "failure_hint: INTERNAL in the trailers after a message", code: codes.Internal, afterMessage: true})
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			a, b := &biasApp{code: tc.code}, &biasApp{}
			store := controlplane.NewStore()
			manifests(t, store, booksService)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: serveTestService(t, a)}, {Addr: serveTestService(t, b)}}})
			c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithPenaltyPeakEWMA(
				&balancer.PenaltyPeakEWMA{DefaultRTT: time.Second, Decay: 10 * time.Second})))
			call := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
				defer cancel()
				if !tc.afterMessage {
					_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
					return err
				}
				s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
				require.NoError(t, err)
				_, err = s.Recv()
				require.NoError(t, err, "the message")
				for err == nil {
					_, err = s.Recv()
				}
				if err == io.EOF {
					err = nil
				}
				return err
			}
			// Both endpoints are ready once each has answered a call.
			for a.calls.Load() == 0 || b.calls.Load() == 0 {
				require.Less(t, a.calls.Load()+b.calls.Load(), int64(10_000), "an endpoint got no call")
				require.NoError(t, call())
			}
			// Calls until a answers tc's status.
			a.armed.Store(true)
			for a.armed.Load() {
				require.Less(t, b.calls.Load(), int64(10_000), "no call reached the endpoint")
				was := a.calls.Load()
				err := call()
				if a.calls.Load() > was {
					require.Equal(t, tc.code, status.Code(err))
				}
			}
			before := a.calls.Load()
			const n = 100
			for range n {
				ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
				_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
				cancel()
				require.NoError(t, err)
			}
			got := a.calls.Load() - before
			if tc.penalized {
				assert.Zero(t, got, "calls to the penalized endpoint, of %d", n)
			} else {
				assert.Positive(t, got, "calls to the endpoint, of %d", n)
			}
		})
	}
}
