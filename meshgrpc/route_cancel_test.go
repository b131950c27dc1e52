package meshgrpc_test

import (
	"context"
	"io"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// headedApp answers StreamingOutputCall as its fields say: response
// headers first (headers), then one message and OK (end), or nothing more
// until its client goes away; EmptyCall waits for its client to go away.
// arrived says a call is being answered.
type headedApp struct {
	testgrpc.UnimplementedTestServiceServer
	headers, end bool
	arrived      chan struct{}
}

func (a *headedApp) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	a.arrived <- struct{}{}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (a *headedApp) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	if a.headers {
		if err := s.SendHeader(metadata.Pairs("paced", "yes")); err != nil {
			return err
		}
	}
	if a.end {
		return s.Send(&testgrpc.StreamingOutputCallResponse{})
	}
	a.arrived <- struct{}{}
	<-s.Context().Done()
	return s.Context().Err()
}

const headedRoute = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: paced, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches:
    - method: {service: grpc.testing.TestService, method: EmptyCall}
    - method: {service: grpc.testing.TestService, method: StreamingOutputCall}
    backendRefs: [{name: books, port: 7000}]
`

// A call the application gives up has the outbound_grpc_route_* series
// Linkerd's proxy records for it, as the router's requests have them
// (router's TestCancelledRequestHasOutboundRouteSeriesAsLinkerd, whose
// cases are those of linkerd2-proxy
// linkerd/app/outbound/src/http/logical/policy/route/metrics/tests.rs):
// none, on the route and on its backend, for a call given up before its
// response headers (the backend's request stays counted); grpc_status
// and error UNKNOWN for one given up after them
// (grpc_response_body_drop_early); its status for one read to its end
// (grpc_response_body_drop_on_eos). Never error="CANCEL", an HTTP/2 reset
// by the server. Each call is the first of a new channel.
func TestCancelledCallHasOutboundRouteSeriesAsLinkerd(t *testing.T) {
	for _, tc := range []struct {
		name          string
		unary         bool
		headers, read bool     // the server's headers first; a stream read to its end
		want          []string // matchers of the one status series; nil: none
	}{
		{name: "unary, before any answer", unary: true},
		{name: "stream, before its response headers"},
		{name: "grpc_response_body_drop_early", headers: true,
			want: []string{`grpc_status="UNKNOWN"`, `error="UNKNOWN"`}},
		{name: "grpc_response_body_drop_on_eos", headers: true, read: true,
			want: []string{`grpc_status="OK"`, `error=""`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &headedApp{headers: tc.headers, end: tc.read, arrived: make(chan struct{}, 1)}
			store := controlplane.NewStore()
			manifests(t, store, booksService+headedRoute)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: serveTestService(t, a)}}})
			m := testutil.NewMetrics(t)
			c := dial(t, serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider))

			ctx, cancel := context.WithCancel(callCtx(t))
			defer cancel()
			switch {
			case tc.unary:
				errc := make(chan error, 1)
				go func() {
					_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
					errc <- err
				}()
				testutil.Recv(t, a.arrived, "the call at the server")
				cancel()
				require.Equal(t, codes.Canceled, status.Code(testutil.Recv(t, errc, "the call's end")))
			case tc.read:
				s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
				require.NoError(t, err)
				_, err = s.Recv()
				require.NoError(t, err)
				_, err = s.Recv()
				require.ErrorIs(t, err, io.EOF)
			default:
				s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
				require.NoError(t, err)
				if tc.headers {
					md, err := s.Header()
					require.NoError(t, err)
					require.Equal(t, []string{"yes"}, md.Get("paced"), "the response headers")
				}
				testutil.Recv(t, a.arrived, "the call at the server")
				cancel()
				_, err = s.Recv()
				require.Equal(t, codes.Canceled, status.Code(err))
			}

			// What `linkerd viz stat-outbound` reads: the route's and the
			// backend's statuses (error!="" a failure) and latencies.
			route := `route_name="paced"`
			for _, name := range []string{"outbound_grpc_route_request_statuses_total", "outbound_grpc_route_backend_response_statuses_total"} {
				lines, sum := m.Select(t, name, route)
				if tc.want == nil {
					assert.Empty(t, lines, "%s: a response nobody received", name)
					continue
				}
				assert.Equal(t, 1.0, sum, "%s: %v", name, lines)
				_, n := m.Select(t, name, append([]string{route}, tc.want...)...)
				assert.Equal(t, 1.0, n, "%s: %v", name, lines)
			}
			for _, name := range []string{"outbound_grpc_route_request_duration_seconds_count", "outbound_grpc_route_backend_response_duration_seconds_count"} {
				lines, n := m.Select(t, name, route)
				if tc.want == nil {
					assert.Empty(t, lines, name)
				} else {
					assert.Equal(t, 1.0, n, "%s: %v", name, lines)
				}
			}
			_, sent := m.Select(t, "outbound_grpc_route_backend_requests_total", route)
			assert.Equal(t, 1.0, sent, "the call was sent to the backend")
		})
	}
}
