package meshgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
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

// The first call of a new channel is a server stream on a GRPCRoute, which
// its caller ends by cancelling its context, never reading again (enough,
// as grpc-go documents): the cancellation reaches the server, and the
// route's series count the call's end, as they count a stream read to its
// end.
func TestRoutedStreamEndedByItsContext(t *testing.T) {
	a := &endlessApp{ended: make(chan error, 1)}
	addr := serveTestService(t, a)
	store := controlplane.NewStore()
	manifests(t, store, booksService+streamRoute)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: addr}}})
	m := testutil.NewMetrics(t)
	c := dial(t, serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider))

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
		return m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="stream"`, `error="CANCEL"`) == "1"
	}, testutil.Timeout, 10*time.Millisecond, "the cancelled stream is counted in the route's statuses: %v",
		m.Lines(t, "outbound_grpc_route_request_statuses_total"))
	assert.Len(t, m.Lines(t, "outbound_grpc_route_backend_response_statuses_total", `route_name="stream"`), 1, "and its backend's")
}
