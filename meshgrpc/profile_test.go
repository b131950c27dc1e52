package meshgrpc_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// A ServiceProfile with a gRPC route (/pkg.Service/Method) routes the
// calls as the HTTP stack does: the route's failures are retried under the
// profile's budget, route_* counts the call, route_actual_* each attempt.
func TestServiceProfileRoute(t *testing.T) {
	a := startApp(t, &app{handle: func(_ context.Context, n int64) error {
		if n%2 == 1 {
			return status.Error(codes.Unavailable, "every other call")
		}
		return nil
	}}, nil)
	c, m := retryableEmptyCall(t, a, "")
	route := []string{`direction="outbound"`, `dst="` + books + `"`, `rt_route="EmptyCall"`}
	value := func(name string, labels ...string) int {
		v := m.Value(t, name, append(route, labels...)...)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	require.Eventually(t, func() bool {
		_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
		return err == nil && value("route_response_total", `classification="success"`) > 0
	}, testutil.Timeout, 10*time.Millisecond)

	okBefore := value("route_response_total", `classification="success"`)
	failedBefore := value("route_actual_response_total", `classification="failure"`, `grpc_status="14"`)
	for range 4 {
		_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
		require.NoError(t, err, "the route's failure was retried")
	}
	assert.Equal(t, okBefore+4, value("route_response_total", `classification="success"`))
	assert.Equal(t, failedBefore+4, value("route_actual_response_total", `classification="failure"`, `grpc_status="14"`))
	assert.Zero(t, value("route_response_total", `classification="failure"`))
}

// retryableEmptyCall dials books, served by a, with a ServiceProfile whose
// one route, EmptyCall, is retryable under a generous budget (and takes
// the route's further YAML lines, extra), and returns the client and its
// metrics.
func retryableEmptyCall(t *testing.T, a *app, extra string) (testgrpc.TestServiceClient, *testutil.Metrics) {
	t.Helper()
	store := controlplane.NewStore()
	setProfiles(t, store, `
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  retryBudget: {retryRatio: 1, minRetriesPerSecond: 100, ttl: 10s}
  routes:
  - name: EmptyCall
    condition: {method: POST, pathRegex: /grpc\.testing\.TestService/EmptyCall}
    isRetryable: true
`+extra)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	m := testutil.NewMetrics(t)
	c := dial(t, serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider))
	return c, m
}

// A route's response classes match the call's HTTP status, 200, before
// its grpc-status, as Linkerd's proxy classifies a profile route
// (linkerd2-proxy linkerd/app/core/src/classify.rs Response::Profile:
// match_class on the response head first) and as the router does for HTTP:
// a class that makes 200 a success makes an UNAVAILABLE call a success,
// which is not retried.
func TestServiceProfileRouteClassesMatchStatus200First(t *testing.T) {
	var failNext atomic.Bool
	a := startApp(t, &app{handle: func(context.Context, int64) error {
		if failNext.CompareAndSwap(true, false) {
			return status.Error(codes.Unavailable, "once")
		}
		return nil
	}}, nil)
	c, m := retryableEmptyCall(t, a, `    responseClasses:
    - condition: {status: {min: 200, max: 299}}
      isFailure: false
`)
	count := func(name, class string) int {
		v := m.Value(t, name, `direction="outbound"`, `dst="`+books+`"`, `rt_route="EmptyCall"`, `classification="`+class+`"`)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	require.Eventually(t, func() bool {
		_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
		return err == nil && count("route_response_total", "success") > 0
	}, testutil.Timeout, 10*time.Millisecond, "the profile's route applies")

	calls, ok := a.calls.Load(), count("route_response_total", "success")
	failNext.Store(true)
	_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	assert.Equal(t, codes.Unavailable, status.Code(err), "a success by the route's class is not retried")
	assert.Equal(t, calls+1, a.calls.Load(), "one attempt")
	assert.Equal(t, ok+1, count("route_response_total", "success"))
	assert.Zero(t, count("route_response_total", "failure"))
	assert.Zero(t, count("route_actual_response_total", "failure"))
}
