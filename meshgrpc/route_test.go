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

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// probeRoute routes UnaryCall, which the test apps do not implement: a
// probe call shows (by its series) that the policy is in force.
const probeRoute = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: probe, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: UnaryCall}}]
    backendRefs: [{name: books, port: 7000}]
`

// routed waits until the channel routes by the policy.
func routed(t testing.TB, c testgrpc.TestServiceClient, m *testutil.Metrics) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, _ = c.UnaryCall(callCtx(t), &testgrpc.SimpleRequest{})
		return len(m.Lines(t, "outbound_grpc_route_request_statuses_total", `route_name="probe"`)) > 0
	}, testutil.Timeout, 10*time.Millisecond)
}

// policyChannel serves yaml and the apps as the endpoints of books (and
// of the other authorities in eps) and dials books with metrics.
func policyChannel(t *testing.T, yaml string, eps map[string][]endpoint.Endpoint) (testgrpc.TestServiceClient, *testutil.Metrics) {
	t.Helper()
	store := controlplane.NewStore()
	manifests(t, store, booksService+yaml+probeRoute)
	store.SetEndpoints(eps)
	m := testutil.NewMetrics(t)
	c := dial(t, serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider))
	routed(t, c, m)
	return c, m
}

const retryRoute = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: empty
  namespace: default
  annotations: {retry.linkerd.io/grpc: unavailable, retry.linkerd.io/limit: "2"}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: books, port: 7000}]
`

// emptyRoute routes EmptyCall to books, with no retry.
const emptyRoute = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: empty, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: books, port: 7000}]
`

// Counted retries: a method failing twice with UNAVAILABLE succeeds under
// limit 2, and the route's series say so, series by series.
func TestCountedRetries(t *testing.T) {
	a := startApp(t, &app{handle: func(_ context.Context, n int64) error {
		if n <= 2 {
			return status.Error(codes.Unavailable, "not yet")
		}
		return nil
	}}, nil)
	c, m := policyChannel(t, retryRoute, map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	require.NoError(t, err)
	assert.Equal(t, int64(3), a.calls.Load())

	route := []string{`route_name="empty"`, `route_kind="GRPCRoute"`, `parent_name="books"`, `parent_port="7000"`}
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", append(route, `grpc_status="OK"`, `error=""`)...))
	assert.Len(t, m.Lines(t, "outbound_grpc_route_request_statuses_total", route...), 1, "one logical call")
	assert.Equal(t, "2", m.Value(t, "outbound_grpc_route_retry_requests_total", route...))
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_retry_successes_total", route...))
	assert.Equal(t, "", m.Value(t, "outbound_grpc_route_retry_limit_exceeded_total", route...))
	backend := append(route, `backend_name="books"`, `backend_port="7000"`)
	assert.Equal(t, "3", m.Value(t, "outbound_grpc_route_backend_requests_total", backend...))
	assert.Equal(t, "2", m.Value(t, "outbound_grpc_route_backend_response_statuses_total", append(backend, `grpc_status="UNAVAILABLE"`)...))
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_backend_response_statuses_total", append(backend, `grpc_status="OK"`)...))
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_duration_seconds_count", route...))
	// The legacy families see each attempt, labelled by the endpoint.
	legacy := []string{`direction="outbound"`, `authority="` + books + `"`, `tls="disabled"`}
	assert.Equal(t, "2", m.Value(t, "response_total", append(legacy, `grpc_status="14"`, `classification="failure"`)...))
	assert.Equal(t, "1", m.Value(t, "response_total", append(legacy, `grpc_status="0"`, `classification="success"`)...))

	// Past the limit, the last failure is the call's.
	a.calls.Store(-10)
	_, err = c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, int64(-7), a.calls.Load(), "three attempts")
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_retry_limit_exceeded_total", route...))
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", append(route, `grpc_status="UNAVAILABLE"`)...))
}

// A streaming call is retried the same way before its response headers
// (the app fails Trailers-Only).
func TestCountedRetriesStreaming(t *testing.T) {
	a := startApp(t, &app{handle: func(_ context.Context, n int64) error {
		if n <= 2 {
			return status.Error(codes.Unavailable, "not yet")
		}
		return nil
	}}, nil)
	c, _ := policyChannel(t, `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: stream
  namespace: default
  annotations: {retry.linkerd.io/grpc: unavailable, retry.linkerd.io/limit: "2"}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: StreamingOutputCall}}]
    backendRefs: [{name: books, port: 7000}]
`, map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	s, err := c.StreamingOutputCall(callCtx(t), &testgrpc.StreamingOutputCallRequest{})
	require.NoError(t, err)
	_, err = s.Recv()
	require.NoError(t, err)
	assert.Equal(t, int64(3), a.calls.Load())
}

// A 200 ms route timeout ends a slow call with DEADLINE_EXCEEDED, and the
// server sees its context cancelled.
func TestRouteTimeout(t *testing.T) {
	for _, annotations := range []string{
		`{timeout.linkerd.io/request: 200ms}`,
		`{timeout.linkerd.io/response: 200ms}`,
		// The earlier wins (linkerd/http/stream-timeouts/src/lib.rs).
		`{timeout.linkerd.io/request: 1h, timeout.linkerd.io/response: 200ms}`,
		`{timeout.linkerd.io/request: 200ms, timeout.linkerd.io/response: 1h}`,
	} {
		t.Run(annotations, func(t *testing.T) {
			cancelled := make(chan struct{}, 1)
			a := startApp(t, &app{handle: func(ctx context.Context, _ int64) error {
				<-ctx.Done()
				cancelled <- struct{}{}
				return ctx.Err()
			}}, nil)
			c, m := policyChannel(t, `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: slow
  namespace: default
  annotations: `+annotations+`
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: books, port: 7000}]
`, map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
			ctx := callCtx(t)
			_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
			assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
			assert.NoError(t, ctx.Err(), "the caller's own deadline did not end it")
			select {
			case <-cancelled:
			case <-time.After(testutil.Timeout):
				t.Fatal("the server never saw the call cancelled")
			}
			// A call that ended in an error has no status of its own: Linkerd's
			// proxy writes UNKNOWN (GrpcRsp's labels in
			// linkerd/app/outbound/src/http/logical/policy/route/metrics/labels.rs).
			assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="slow"`, `grpc_status="UNKNOWN"`, `error="REQUEST_TIMEOUT"`))
		})
	}
}

// A backend without a Service is a failure injector (INTERNAL): calls fail
// with its code and message and reach no endpoint.
func TestFailureInjector(t *testing.T) {
	a := startApp(t, &app{}, nil)
	c, _ := policyChannel(t, `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: nowhere, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: missing, port: 7000}]
`, map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	before := a.calls.Load()
	_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	assert.Equal(t, codes.Internal, status.Code(err), "%v", err)
	assert.NotEmpty(t, status.Convert(err).Message())
	assert.Equal(t, before, a.calls.Load())
}

// Weighted backends, each its own authority with its own endpoints: the
// calls split by the backend weights.
func TestBackendDistribution(t *testing.T) {
	a := startApp(t, &app{}, nil)
	b := startApp(t, &app{}, nil)
	probe := startApp(t, &app{}, nil)
	c, _ := policyChannel(t, `
---
apiVersion: v1
kind: Service
metadata: {name: books-v1, namespace: default}
spec: {ports: [{port: 7000}]}
---
apiVersion: v1
kind: Service
metadata: {name: books-v2, namespace: default}
spec: {ports: [{port: 7000}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: split, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: books-v1, port: 7000, weight: 1}, {name: books-v2, port: 7000, weight: 3}]
`, map[string][]endpoint.Endpoint{
		books: {{Addr: probe.addr}},
		"books-v1.default.svc.cluster.local:7000": {{Addr: a.addr}},
		"books-v2.default.svc.cluster.local:7000": {{Addr: b.addr}},
	})
	const n = 2000
	for range n {
		// A deadline per call: 2,000 calls under -race on a loaded machine
		// may take longer than one deadline for all of them.
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		cancel()
		require.NoError(t, err)
	}
	assert.InDelta(t, 0.25, float64(a.calls.Load())/n, 0.05, "v1: %d, v2: %d", a.calls.Load(), b.calls.Load())
	assert.Equal(t, int64(n), a.calls.Load()+b.calls.Load())
	assert.Zero(t, probe.calls.Load(), "the split route's calls never reach the parent's endpoints")
}

// The retry's timeout (retry.linkerd.io/timeout) ends an attempt that
// does not answer in time and retries it, whatever the retry codes.
func TestRetryTimeout(t *testing.T) {
	a := startApp(t, &app{handle: func(ctx context.Context, n int64) error {
		if n == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}}, nil)
	c, m := policyChannel(t, `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: try
  namespace: default
  annotations: {retry.linkerd.io/grpc: unavailable, retry.linkerd.io/limit: "1", retry.linkerd.io/timeout: 100ms}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: books, port: 7000}]
`, map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	require.NoError(t, err)
	assert.Equal(t, int64(2), a.calls.Load())
	route := []string{`route_name="try"`}
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_backend_response_statuses_total", append(route, `error="RESPONSE_HEADERS_TIMEOUT"`)...))
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_retry_successes_total", route...))
}

// A status past the 17 codes gRPC defines is Unknown in every family, as
// Linkerd's proxy reads one (tonic's Code::from_i32): the route's series
// write UNKNOWN, and response_total a failure with grpc_status="2". A
// server cannot give the labels values of its own, nor have its failure
// counted as a success. The caller still gets the status as sent.
func TestStatusPastTheCodesIsUnknown(t *testing.T) {
	a := startApp(t, &app{handle: func(context.Context, int64) error {
		return status.Error(codes.Code(99), "a code of its own")
	}}, nil)
	c, m := policyChannel(t, emptyRoute, map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	require.Equal(t, codes.Code(99), status.Code(err), "%v", err)

	route := []string{`route_name="empty"`}
	lines, n := m.Select(t, "outbound_grpc_route_request_statuses_total", route...)
	require.Equal(t, 1.0, n, "%v", lines)
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", append(route, `grpc_status="UNKNOWN"`, `error=""`)...), "%v", lines)
	backend := append(route, `backend_name="books"`)
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_backend_response_statuses_total", append(backend, `grpc_status="UNKNOWN"`)...),
		"%v", m.Lines(t, "outbound_grpc_route_backend_response_statuses_total", backend...))
	legacy := []string{`direction="outbound"`, `authority="` + books + `"`}
	lines, _ = m.Select(t, "response_total", legacy...)
	assert.Equal(t, "1", m.Value(t, "response_total", append(legacy, `grpc_status="2"`, `classification="failure"`)...), "%v", lines)
}
