package meshgrpc_test

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
)

// streamApp fails its first `fail` calls with UNAVAILABLE after reading
// one message (bidi) or every message (client streaming); later bidi
// calls echo each message, later client-streaming calls answer with the
// payload bytes received.
type streamApp struct {
	app
	fail  int64
	calls atomic.Int64
}

func (a *streamApp) FullDuplexCall(s grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	if a.calls.Add(1) <= a.fail {
		_, _ = s.Recv()
		return status.Error(codes.Unavailable, "not yet")
	}
	for {
		m, err := s.Recv()
		if err != nil {
			return nil
		}
		if err := s.Send(&testgrpc.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}

func (a *streamApp) StreamingInputCall(s grpc.ClientStreamingServer[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse]) error {
	n := a.calls.Add(1)
	var size int32
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		size += int32(len(m.GetPayload().GetBody()))
	}
	if n <= a.fail {
		return status.Error(codes.Unavailable, "not yet")
	}
	return s.SendAndClose(&testgrpc.StreamingInputCallResponse{AggregatedPayloadSize: size})
}

func startStreamApp(t *testing.T, a *streamApp) netip.AddrPort {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(g, a)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return netip.MustParseAddrPort(lis.Addr().String())
}

const retriedStreams = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: streams
  namespace: default
  annotations: {retry.linkerd.io/grpc: unavailable, retry.linkerd.io/limit: "2"}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - backendRefs: [{name: books, port: 7000}]
`

// A bidi stream sends from one goroutine while another receives, as
// grpc-go allows; the first two attempts fail while messages are being
// sent. Every message must reach the attempt that succeeds: each is
// echoed, so the receiver counts as many responses as were sent.
func TestBidiRetryConcurrentSend(t *testing.T) {
	a := &streamApp{fail: 2}
	c, _ := policyChannel(t, retriedStreams, map[string][]endpoint.Endpoint{books: {{Addr: startStreamApp(t, a)}}})
	s, err := c.FullDuplexCall(callCtx(t))
	require.NoError(t, err)
	const n = 200
	sendErr := make(chan error, 1)
	go func() {
		for range n {
			if err := s.Send(&testgrpc.StreamingOutputCallRequest{}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- s.CloseSend()
	}()
	var got int
	for {
		_, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		got++
	}
	require.NoError(t, <-sendErr)
	assert.Equal(t, n, got, "responses, one per message sent")
	assert.Equal(t, int64(3), a.calls.Load())
}

// The messages a client stream keeps for a retry are bounded by the
// retry's body limit (64 KiB by default): a stream past it is not
// retried, one under it is.
func TestStreamRetryBodyLimit(t *testing.T) {
	body := make([]byte, 30<<10)
	for _, tc := range []struct {
		name     string
		messages int
		code     codes.Code
		calls    int64
	}{
		{"under the limit is retried", 2, codes.OK, 2},
		{"past the limit is not", 3, codes.Unavailable, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &streamApp{fail: 1}
			c, _ := policyChannel(t, retriedStreams, map[string][]endpoint.Endpoint{books: {{Addr: startStreamApp(t, a)}}})
			s, err := c.StreamingInputCall(callCtx(t))
			require.NoError(t, err)
			for range tc.messages {
				require.NoError(t, s.Send(&testgrpc.StreamingInputCallRequest{Payload: &testgrpc.Payload{Body: body}}))
			}
			resp, err := s.CloseAndRecv()
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			assert.Equal(t, tc.calls, a.calls.Load())
			if tc.code == codes.OK {
				assert.Equal(t, int32(tc.messages*len(body)), resp.GetAggregatedPayloadSize())
			}
		})
	}
}

// A sender blocked by flow control does not keep the receiver from
// reading: the server echoes 8 MiB in 128 KiB messages and stops reading
// while its responses wait, so the call completes only if the client
// receives while it sends.
func TestBidiRetrySendDoesNotBlockRecv(t *testing.T) {
	a := &streamApp{}
	c, _ := policyChannel(t, retriedStreams, map[string][]endpoint.Endpoint{books: {{Addr: startStreamApp(t, a)}}})
	s, err := c.FullDuplexCall(callCtx(t))
	require.NoError(t, err)
	const n = 64
	body := make([]byte, 128<<10)
	sendErr := make(chan error, 1)
	go func() {
		for range n {
			if err := s.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: body}}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- s.CloseSend()
	}()
	var got int
	for {
		_, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		got++
	}
	require.NoError(t, <-sendErr)
	assert.Equal(t, n, got)
}
