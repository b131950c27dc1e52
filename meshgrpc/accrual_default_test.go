package meshgrpc_test

import (
	"context"
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

// accrualBooks is books with consecutive failure accrual: an endpoint
// leaves rotation for an hour after three failures in a row.
const accrualBooks = `
apiVersion: v1
kind: Service
metadata:
  name: books
  namespace: default
  annotations:
    balancer.linkerd.io/failure-accrual: consecutive
    balancer.linkerd.io/failure-accrual-consecutive-max-failures: "3"
    balancer.linkerd.io/failure-accrual-consecutive-min-penalty: 1h
    balancer.linkerd.io/failure-accrual-consecutive-max-penalty: 1h
spec: {ports: [{port: 7000}]}
`

// A Service's failure accrual applies to the calls of a new channel
// whatever routes them: its default policy (no route at all), which
// Linkerd's policy controller answers with the accrual in the HTTP/2
// protocol that gRPC calls take (policy-controller/grpc/src/outbound/http.rs),
// an HTTPRoute, or a GRPCRoute. Of two endpoints, the one that fails every
// call with UNAVAILABLE gets three calls and no more; the other answers
// the next hundred. Load does not decide (the RTT average forgets at
// once), so that without the accrual the failing endpoint gets about half
// of them.
func TestFailureAccrualWithoutAGRPCRoute(t *testing.T) {
	for _, tc := range []struct{ name, routes string }{
		{name: "default policy"},
		{name: "HTTPRoute", routes: `
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: books, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules: [{backendRefs: [{name: books, port: 7000}]}]
`},
		{name: "GRPCRoute", routes: emptyRoute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := startApp(t, &app{handle: func(context.Context, int64) error {
				return status.Error(codes.Unavailable, "down")
			}}, nil)
			good := startApp(t, &app{}, nil)
			store := controlplane.NewStore()
			manifests(t, store, accrualBooks+tc.routes)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: bad.addr}, {Addr: good.addr}}})
			c := dial(t, serveStore(t, store), meshgrpc.WithLogger(quiet), meshgrpc.WithDiscoveryWait(testutil.Timeout),
				meshgrpc.WithBalancerOptions(balancer.WithPeakEWMA(0, time.Nanosecond)))

			for i := 0; bad.calls.Load() < 3; i++ {
				require.Less(t, i, 10_000, "the failing endpoint did not get three calls")
				_, _ = c.EmptyCall(callCtx(t), &testgrpc.Empty{})
			}
			var failed int
			for range 100 {
				if _, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{}); err != nil {
					failed++
				}
			}
			assert.Equal(t, int64(3), bad.calls.Load(), "calls that reached the failing endpoint")
			assert.Zero(t, failed, "failed calls of 100 after the third failure")
		})
	}
}
