package meshgrpc_test

import (
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
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// A call that no endpoint took within the failfast timeout ends with
// DEADLINE_EXCEEDED, as Linkerd's proxy answers a request in fail-fast
// (linkerd2-proxy linkerd/app/outbound/src/http/server.rs ServerRescue:
// a FailFastError is a gateway timeout, grpc-status DEADLINE_EXCEEDED),
// and so do the backend's later calls, at once, streams too; load shed is
// UNAVAILABLE there, and meshgrpc sheds no calls (grpc-go holds the
// waiting ones). A call that waits for ready is not failed fast: it is
// answered once an endpoint is up. Each case is the first call on a new
// channel, made before its discovery answers.
func TestFailFastIsDeadlineExceeded(t *testing.T) {
	for _, tc := range []struct {
		name string
		// start returns the target's endpoints and a function that
		// brings a up to serve.
		start   func(t *testing.T, a *app, store *controlplane.Store) ([]endpoint.Endpoint, func())
		message string
	}{
		{name: "empty endpoint set", start: func(t *testing.T, a *app, store *controlplane.Store) ([]endpoint.Endpoint, func()) {
			return []endpoint.Endpoint{}, func() {
				startApp(t, a, nil)
				store.PutEndpoints(books, []endpoint.Endpoint{{Addr: a.addr}})
			}
		}, message: "meshgrpc: failing fast: no endpoints for " + books + " within 300ms"},
		{name: "endpoint refusing connections", start: func(t *testing.T, a *app, _ *controlplane.Store) ([]endpoint.Endpoint, func()) {
			addr, listen := testutil.RefusedUntilListen(t)
			return []endpoint.Endpoint{{Addr: addr}}, func() { serveOn(t, a, listen()) }
		}, message: "meshgrpc: failing fast: no endpoint of " + books + " ready within 300ms (last connection error: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &app{}
			store := controlplane.NewStore()
			eps, serve := tc.start(t, a, store)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: eps})
			failfast := testutil.ShortTimeout
			// A Get of a Service port without endpoints is silent, as
			// Linkerd's controller is: that silence soon means an empty set.
			dst := serveStore(t, store, destination.WithFirstMessageTimeout(testutil.ShortTimeout))
			cc, err := grpc.NewClient(booksTarget, meshgrpc.DialOptions(dst,
				meshgrpc.WithBalancerOptions(balancer.WithQueue(0, failfast)))...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = cc.Close() })
			c := testgrpc.NewTestServiceClient(cc)
			ctx := callCtx(t)

			start := time.Now()
			_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
			assert.GreaterOrEqual(t, time.Since(start), failfast, "the call failed before the failfast timeout")
			require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), tc.message)
			require.NoError(t, ctx.Err(), "the call's own deadline ended it")

			_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
			require.Equal(t, codes.DeadlineExceeded, status.Code(err), "a call made in failfast: %v", err)
			s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
			if err == nil {
				_, err = s.Recv()
			}
			require.Equal(t, codes.DeadlineExceeded, status.Code(err), "a stream opened in failfast: %v", err)

			waited := make(chan error, 1)
			go func() {
				_, err := c.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
				waited <- err
			}()
			serve()
			require.NoError(t, <-waited, "the call waiting for ready")
			_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
			require.NoError(t, err, "a call once an endpoint is up")
			assert.Equal(t, int64(2), a.calls.Load())
		})
	}
}

// A call of a GRPCRoute that fails fast has Linkerd's FAIL_FAST error in
// its route series, with no gRPC status from upstream (UNKNOWN)
// (linkerd/app/outbound/src/http/logical/policy/route/metrics/labels.rs),
// and ends DEADLINE_EXCEEDED. The policy's backend has the default
// failfast timeout.
func TestFailFastRouteSeries(t *testing.T) {
	store := controlplane.NewStore()
	manifests(t, store, booksService+`
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: all, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService}}]
    backendRefs: [{name: books, port: 7000}]
`)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: testutil.RefusedAddr(t)}}})
	m := testutil.NewMetrics(t)
	c := dial(t, serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider))
	_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "meshgrpc: failing fast: no endpoint of "+books+" ready within 3s")
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="all"`, `error="FAIL_FAST"`, `grpc_status="UNKNOWN"`))
}
