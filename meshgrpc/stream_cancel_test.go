package meshgrpc_test

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// endlessApp streams StreamingOutputCall until its client goes away, and
// says when it saw that.
type endlessApp struct {
	testgrpc.UnimplementedTestServiceServer
	ended chan error
}

func (a *endlessApp) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	for {
		if err := s.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			a.ended <- err
			return err
		}
		select {
		case <-s.Context().Done():
			a.ended <- s.Context().Err()
			return s.Context().Err()
		case <-time.After(time.Millisecond): // the stream's pace, not a wait for an event
		}
	}
}

const streamRoute = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: stream, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: StreamingOutputCall}}]
    backendRefs: [{name: books, port: 7000}]
`

// endlessStream serves an endlessApp as books, whose StreamingOutputCall
// has a GRPCRoute, and returns it, a client of it on a new channel and
// the client's metrics.
func endlessStream(t *testing.T) (*endlessApp, testgrpc.TestServiceClient, *testutil.Metrics) {
	a := &endlessApp{ended: make(chan error, 1)}
	addr := serveTestService(t, a)
	store := controlplane.NewStore()
	manifests(t, store, booksService+streamRoute)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: addr}}})
	m := testutil.NewMetrics(t)
	return a, dial(t, serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider)), m
}

// The first call of a new channel is a server stream on a GRPCRoute, which
// its caller ends by cancelling its context, never reading again (enough,
// as grpc-go documents): the cancellation reaches the server, and the
// route's series count the call's end, as they count a stream read to its
// end: a response body dropped, grpc_status="UNKNOWN" and error="UNKNOWN"
// as Linkerd's proxy records it (linkerd2-proxy
// linkerd/app/outbound/src/http/logical/policy/route/metrics/tests.rs,
// grpc_response_body_drop_early).
func TestRoutedStreamEndedByItsContext(t *testing.T) {
	a, c, m := endlessStream(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
	require.NoError(t, err)
	_, err = s.Recv()
	require.NoError(t, err)
	assert.Len(t, m.Lines(t, "outbound_grpc_route_backend_requests_total", `route_name="stream"`), 1, "the stream is on the route")
	cancel()
	select {
	case err := <-a.ended:
		assert.Error(t, err, "the server saw its client go away")
	case <-time.After(testutil.Timeout):
		t.Fatal("the cancellation never reached the server")
	}
	require.Eventually(t, func() bool {
		return m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="stream"`, `grpc_status="UNKNOWN"`, `error="UNKNOWN"`) == "1"
	}, testutil.Timeout, 10*time.Millisecond, "the cancelled stream is counted in the route's statuses: %v",
		m.Lines(t, "outbound_grpc_route_request_statuses_total"))
	assert.Len(t, m.Lines(t, "outbound_grpc_route_backend_response_statuses_total", `route_name="stream"`), 1, "and its backend's")
}

// A routed stream whose SendMsg fails (a message past the call's send
// limit) is ended by grpc-go, and its caller has nothing to read: the
// route's series count it then, with its status. Before, they counted
// nothing until the caller's context ended, and then a CANCEL.
func TestRoutedStreamSendMsgErrorCounted(t *testing.T) {
	_, c, m := endlessStream(t)

	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	_, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{ResponseType: testgrpc.PayloadType_COMPRESSABLE,
		Payload: &testgrpc.Payload{Body: make([]byte, 1024)}}, grpc.MaxCallSendMsgSize(10))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="stream"`, `grpc_status="RESOURCE_EXHAUSTED"`),
		"counted when the stream ended: %v", m.Lines(t, "outbound_grpc_route_request_statuses_total"))
}

// gateCodec is the proto codec whose Unmarshal, while armed, says it has
// the message and waits to be released: it holds a RecvMsg that already
// has its message.
type gateCodec struct {
	encoding.CodecV2
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (c *gateCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if c.armed.CompareAndSwap(true, false) {
		c.entered <- struct{}{}
		<-c.release
	}
	return c.CodecV2.Unmarshal(data, v)
}

// afterFuncsRunning counts goroutines running the mesh's stream
// watch (context.AfterFunc of meshgrpc.(*mesh).stream).
func afterFuncsRunning() int {
	buf := make([]byte, 1<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "meshgrpc.(*mesh).stream.func") {
			n++
		}
	}
	return n
}

// A caller reads a routed server stream on one goroutine and cancels its
// context on another; the RecvMsg under way at that moment already has
// its message and returns it, and the caller then stops reading (its
// context is over). The call ended by its context must be counted once in
// the route's statuses, as TestRoutedStreamEndedByItsContext has it.
// Before, the watch of its context left it to the RecvMsg under way,
// which returned its message without counting anything.
func TestRoutedStreamCancelledDuringRecvCounted(t *testing.T) {
	a, c, m := endlessStream(t)

	codec := &gateCodec{CodecV2: encoding.GetCodecV2("proto"), entered: make(chan struct{}), release: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{}, grpc.ForceCodecV2(codec))
	require.NoError(t, err)
	_, err = s.Recv()
	require.NoError(t, err)

	codec.armed.Store(true)
	recvd := make(chan error, 1)
	go func() { _, err := s.Recv(); recvd <- err }()
	<-codec.entered // this RecvMsg has its message
	cancel()        // the stream's watch starts now, synchronously
	require.Eventually(t, func() bool { return afterFuncsRunning() == 0 }, testutil.Timeout, time.Millisecond)
	close(codec.release)
	require.NoError(t, <-recvd, "the RecvMsg under way returns its message")
	// The caller reads no more: its context is over.
	select {
	case <-a.ended:
	case <-time.After(testutil.Timeout):
		t.Fatal("the cancellation never reached the server")
	}
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="stream"`, `grpc_status="UNKNOWN"`, `error="UNKNOWN"`),
		"the cancelled stream is counted: %v", m.Lines(t, "outbound_grpc_route_request_statuses_total"))
	assert.Len(t, m.Lines(t, "outbound_grpc_route_backend_response_statuses_total", `route_name="stream"`), 1, "and its backend's")
}
