package meshgrpc_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
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

// rawCodec passes messages as the bytes they are, as gRPC proxies do
// (named "proto" as the calls they forward); its messages are *[]byte.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: %T is not *[]byte", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: %T is not *[]byte", v)
	}
	*b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// The retry's body limit holds for every codec: a client stream of raw
// bytes (a codec that is not protobuf's, as a gRPC proxy forwards calls)
// is measured by what its codec encodes. 32 messages of 1 MiB are far past
// the 64 KiB limit: the stream is not retried (before, their size counted
// as 0 and all 32 MiB were kept and replayed); two of 20 KiB fit and are
// replayed.
func TestStreamRetryBodyLimitRawCodec(t *testing.T) {
	for _, tc := range []struct {
		name          string
		messages, len int
		code          codes.Code
		calls         int64
	}{
		{"32 x 1 MiB is not retried", 32, 1 << 20, codes.Unavailable, 1},
		{"2 x 20 KiB is retried", 2, 20 << 10, codes.OK, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &streamApp{fail: 1}
			store := controlplane.NewStore()
			manifests(t, store, booksService+retriedStreams+probeRoute)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: startStreamApp(t, a)}}})
			m := testutil.NewMetrics(t)
			cc, err := grpc.NewClient(booksTarget, meshgrpc.DialOptions(serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider))...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = cc.Close() })
			routed(t, testgrpc.NewTestServiceClient(cc), m)

			msg, err := proto.Marshal(&testgrpc.StreamingInputCallRequest{Payload: &testgrpc.Payload{Body: make([]byte, tc.len)}})
			require.NoError(t, err)
			s, err := cc.NewStream(callCtx(t), &grpc.StreamDesc{ClientStreams: true},
				"/grpc.testing.TestService/StreamingInputCall", grpc.ForceCodecV2(rawCodec{}))
			require.NoError(t, err)
			for range tc.messages {
				require.NoError(t, s.SendMsg(&msg))
			}
			require.NoError(t, s.CloseSend())
			var resp []byte
			err = s.RecvMsg(&resp)
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			assert.Equal(t, tc.calls, a.calls.Load(), "attempts")
			if tc.code == codes.OK {
				var got testgrpc.StreamingInputCallResponse
				require.NoError(t, proto.Unmarshal(resp, &got))
				assert.Equal(t, int32(tc.messages*tc.len), got.GetAggregatedPayloadSize(), "every message replayed")
			}
		})
	}
}

// headersThenFail sends its response headers (its call number in them)
// and then fails its first call with UNAVAILABLE; later calls answer with
// a message and a trailer.
type headersThenFail struct{ app }

func (h *headersThenFail) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	n := h.calls.Add(1)
	if err := s.SendHeader(metadata.Pairs("attempt", strconv.FormatInt(n, 10))); err != nil {
		return err
	}
	if n == 1 {
		return status.Error(codes.Unavailable, "after the headers")
	}
	s.SetTrailer(metadata.Pairs("attempt-trailer", strconv.FormatInt(n, 10)))
	return s.Send(&testgrpc.StreamingOutputCallResponse{})
}

// A stream is committed once it has response headers (gRFC A6: only a
// Trailers-Only answer is retried; grpc-go's own retry reads the
// transport stream's TrailersOnly, and its Header commits): the route
// retries UNAVAILABLE, yet a stream whose attempt sent its headers and
// then failed so is not run again, whether or not the caller read the
// headers before the failure, and its caller gets the failure.
func TestStreamNotRetriedAfterHeaders(t *testing.T) {
	for _, readHeaders := range []bool{true, false} {
		t.Run(map[bool]string{true: "headers read", false: "headers not read"}[readHeaders], func(t *testing.T) {
			h := &headersThenFail{}
			h.addr = serveTestService(t, h)
			c, _ := policyChannel(t, retriedStreams, map[string][]endpoint.Endpoint{books: {{Addr: h.addr}}})
			s, err := c.StreamingOutputCall(callCtx(t), &testgrpc.StreamingOutputCallRequest{})
			require.NoError(t, err)
			if readHeaders {
				md, err := s.Header()
				require.NoError(t, err)
				require.Equal(t, []string{"1"}, md.Get("attempt"))
			}
			_, err = s.Recv()
			assert.Equal(t, codes.Unavailable, status.Code(err), "%v (trailer %v)", err, s.Trailer())
			assert.Equal(t, int64(1), h.calls.Load(), "the handler ran once")
			md, err := s.Header()
			require.NoError(t, err)
			assert.Equal(t, []string{"1"}, md.Get("attempt"), "the headers are the attempt's that failed")
		})
	}
}
