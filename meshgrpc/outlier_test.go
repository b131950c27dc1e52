package meshgrpc_test

import (
	"context"
	"strings"
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

// outlierBooks is books with failure-percentage ejection (the annotations
// of examples/e2e's outlier scenario, over 500ms intervals): an endpoint
// failing more than 10% of at least 10 calls in an interval, among at
// least 5, is ejected for 60s (longer than the test), at most 20% of the
// endpoints (one of five) at once. A GRPCRoute makes books the backend of
// every call, which carries the Service's outlier detection.
const outlierBooks = `
apiVersion: v1
kind: Service
metadata:
  name: books
  namespace: default
  annotations:
    outlier.inmesh.io/interval: 500ms
    outlier.inmesh.io/base-ejection-time: 60s
    outlier.inmesh.io/max-ejection-percent: "20"
    outlier.inmesh.io/failure-percentage-ejection: "true"
    outlier.inmesh.io/failure-percentage-threshold: "10"
    outlier.inmesh.io/failure-percentage-enforcement-percentage: "100"
    outlier.inmesh.io/failure-percentage-minimum-hosts: "5"
    outlier.inmesh.io/failure-percentage-request-volume: "10"
spec: {ports: [{port: 7000}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: all, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - backendRefs: [{name: books, port: 7000}]
`

// outlierBooksHedged is outlierBooks with its GRPCRoute hedged after 10s:
// no hedge is sent in a test, but every call carries the hedger's tried
// set, so that its picks go through balancer.Pool.PickExcluding.
var outlierBooksHedged = strings.Replace(outlierBooks, "metadata: {name: all, namespace: default}",
	`metadata: {name: all, namespace: default, annotations: {hedge.inmesh.io/delay: 10s, hedge.inmesh.io/idempotent: "true"}}`, 1)

// Outlier detection through meshgrpc (gRFC A50's failure percentage, as
// router TestPolicyOutlierDetection and examples/e2e
// TestOutlierEjectionThroughMeshClient do it over HTTP): five real gRPC
// servers, the first failing 30% of its calls (those whose sequence
// number on it is 0, 1 or 2 mod 10). Once the first interval has passed
// and the failing endpoint has stopped getting calls, every call
// succeeds, the failing endpoint gets none, and each of the other four
// still gets calls: no more than the cap (one of five) is ejected. So
// whatever the route does with its calls: a hedged route's are picked
// with the endpoints the call tried, and run the intervals' checks too.
func TestOutlierEjection(t *testing.T) {
	for _, tc := range []struct{ name, manifests string }{
		{"route not hedged", outlierBooks},
		{"hedged route", outlierBooksHedged},
	} {
		t.Run(tc.name, func(t *testing.T) { testOutlierEjection(t, tc.manifests) })
	}
}

func testOutlierEjection(t *testing.T, objects string) {
	var apps []*app
	var eps []endpoint.Endpoint
	for i := range 5 {
		a := &app{}
		if i == 0 {
			a.handle = func(_ context.Context, n int64) error {
				if (n-1)%10 < 3 {
					return status.Error(codes.Internal, "failing")
				}
				return nil
			}
		}
		startApp(t, a, nil)
		apps = append(apps, a)
		eps = append(eps, endpoint.Endpoint{Addr: a.addr})
	}
	store := controlplane.NewStore()
	manifests(t, store, objects)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: eps})
	// Load is held equal (the RTT average forgets at once, see
	// TestWeights): only the ejection keeps the failing endpoint out, not
	// the penalty of its errors.
	c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithPeakEWMA(0, time.Nanosecond)))

	const interval = 500 * time.Millisecond
	start := time.Now()
	calls, failed, quiet := 0, 0, 0
	for quiet < 200 || time.Since(start) < interval {
		require.Less(t, time.Since(start), 3*testutil.Timeout, "the failing endpoint still gets calls after %d", calls)
		before := apps[0].calls.Load()
		if _, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{}); err != nil {
			assert.Equal(t, codes.Internal, status.Code(err))
			failed++
		}
		calls++
		if apps[0].calls.Load() == before {
			quiet++
		} else {
			quiet = 0
		}
	}
	t.Logf("the failing endpoint's last call was %d calls before %v (%d of %d calls failed)", quiet, time.Since(start), failed, calls)
	assert.GreaterOrEqual(t, apps[0].calls.Load(), int64(10), "the failing endpoint served the request volume before its ejection")

	var was [5]int64
	for i, a := range apps {
		was[i] = a.calls.Load()
	}
	const n = 1000
	for i := range n {
		_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
		require.NoError(t, err, "call %d after the ejection", i)
	}
	assert.Equal(t, was[0], apps[0].calls.Load(), "the ejected endpoint got calls")
	for i := 1; i < 5; i++ {
		assert.Greater(t, apps[i].calls.Load(), was[i], "endpoint %d gets calls: at most one of five is ejected", i)
	}
}
