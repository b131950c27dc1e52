package meshgrpc_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// refusing holds a loopback listener that accepts connections and closes
// them at once: an endpoint no HTTP/2 connection can be made to.
func refusing(t *testing.T) netip.AddrPort {
	addr, _ := testutil.AcceptAndClose(t)
	return addr
}

const deadBackendRoute = `
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
    backendRefs: [{name: books-v2, port: 7000}]
`

// A route's backend whose only endpoint cannot be connected to, while the
// target's own endpoint is READY: a fail-fast call fails DEADLINE_EXCEEDED
// once the backend's calls waited its failfast timeout (3 s), naming the
// backend, rather than waiting for its own deadline; a wait-for-ready call
// still waits (here: until its deadline).
func TestDeadBackendFailsFast(t *testing.T) {
	a := startApp(t, &app{}, nil)
	c, _ := policyChannel(t, deadBackendRoute, map[string][]endpoint.Endpoint{
		books: {{Addr: a.addr}},
		"books-v2.default.svc.cluster.local:7000": {{Addr: refusing(t)}},
	})
	var last error
	require.Eventually(t, func() bool {
		// The first calls wait in the queue until their own deadline;
		// once the failfast timeout has passed, a call fails at once.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, last = c.EmptyCall(ctx, &testgrpc.Empty{})
		return status.Code(last) == codes.DeadlineExceeded && strings.Contains(status.Convert(last).Message(), "failing fast")
	}, testutil.Timeout, 10*time.Millisecond, "a fail-fast call to a backend that cannot be reached did not fail fast")
	require.Contains(t, status.Convert(last).Message(), "books-v2")

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := c.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	require.False(t, errors.Is(err, context.Canceled))
}

// Channels to one target made with the same DialOptions share its
// routing state: closing the one that compiled it last leaves another
// routing by the policy (here a failure injector answering INTERNAL
// without reaching the app), not sending its calls straight to the app.
func TestSharedOptionsSurviveClose(t *testing.T) {
	a := startApp(t, &app{}, nil)
	store := controlplane.NewStore()
	manifests(t, store, booksService+`
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: nowhere, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: missing, port: 7000}]
`)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	opts := meshgrpc.DialOptions(serveStore(t, store))
	injected := func(c testgrpc.TestServiceClient) func() bool {
		return func() bool {
			_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
			return status.Code(err) == codes.Internal
		}
	}
	ccA, err := grpc.NewClient(booksTarget, opts...)
	require.NoError(t, err)
	defer ccA.Close()
	cA := testgrpc.NewTestServiceClient(ccA)
	require.Eventually(t, injected(cA), testutil.Timeout, 10*time.Millisecond, "the first channel routes by the policy")

	// More channels to the same target, each routing, then closed: the
	// state the first channel routes by must outlive each of them.
	for range 4 {
		ccB, err := grpc.NewClient(booksTarget, opts...)
		require.NoError(t, err)
		cB := testgrpc.NewTestServiceClient(ccB)
		// A call the route answers never leaves the channel idle: connect
		// it, so that its resolver watches and compiles the policy.
		ccB.Connect()
		require.Eventually(t, func() bool { return ccB.GetState() == connectivity.Ready },
			testutil.Timeout, 10*time.Millisecond, "another channel connects")
		require.Eventually(t, injected(cB), testutil.Timeout, 10*time.Millisecond, "another channel routes by the policy")
		require.NoError(t, ccB.Close()) // closes its resolver before it returns
	}

	before := a.calls.Load()
	for range 5 {
		_, err = cA.EmptyCall(callCtx(t), &testgrpc.Empty{})
		require.Equal(t, codes.Internal, status.Code(err), "the first channel after the others closed: %v", err)
	}
	require.Equal(t, before, a.calls.Load(), "a call bypassed the route and reached the app")
}

// An endpoint failure accrual took out of rotation stays out when the
// target's policy changes in a way that leaves its balancing alone (a
// route for another method is added): the backend's pool keeps its state
// rather than starting afresh, which sent calls to the failing endpoint
// again.
func TestPolicyUpdateKeepsFailureAccrual(t *testing.T) {
	bad := startApp(t, &app{handle: func(context.Context, int64) error {
		return status.Error(codes.Unavailable, "down")
	}}, nil)
	good := startApp(t, &app{}, nil)
	store := controlplane.NewStore()
	const accrual = `
---
apiVersion: v1
kind: Service
metadata:
  name: books
  namespace: default
  annotations:
    balancer.linkerd.io/failure-accrual: consecutive
    balancer.linkerd.io/failure-accrual-consecutive-max-failures: "1"
    balancer.linkerd.io/failure-accrual-consecutive-min-penalty: 1h
    balancer.linkerd.io/failure-accrual-consecutive-max-penalty: 1h
spec: {ports: [{port: 7000}]}
`
	manifests(t, store, accrual+emptyRoute)
	// The bad endpoint comes first, alone, so that it surely fails once
	// and leaves rotation for an hour. (Beside the good one from the
	// start, power of two choices could keep to the good one after a
	// first call there, until the bad one's unmeasured estimate decayed
	// below it: the test then checked nothing, or, when the policy update
	// took long enough, saw that first call on the bad endpoint.)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: bad.addr}}})
	c := dial(t, serveStore(t, store))
	require.Eventually(t, func() bool {
		_, _ = c.EmptyCall(callCtx(t), &testgrpc.Empty{})
		return bad.calls.Load() > 0
	}, testutil.Timeout, 10*time.Millisecond, "no call reached the failing endpoint")
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: bad.addr}, {Addr: good.addr}}})
	// The bad endpoint failed once and is out of rotation for an hour:
	// every call succeeds.
	require.Eventually(t, func() bool {
		for range 20 {
			if _, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{}); err != nil {
				return false
			}
		}
		return true
	}, testutil.Timeout, 10*time.Millisecond, "the failing endpoint never left rotation")
	before := bad.calls.Load()

	manifests(t, store, accrual+emptyRoute+`
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: other, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: UnaryCall}}]
    backendRefs: [{name: missing, port: 7000}]
`)
	// The new route is in force once UnaryCall is answered by the
	// failure injector (INTERNAL) rather than the app (UNIMPLEMENTED).
	require.Eventually(t, func() bool {
		_, err := c.UnaryCall(callCtx(t), &testgrpc.SimpleRequest{})
		return status.Code(err) == codes.Internal
	}, testutil.Timeout, 10*time.Millisecond, "the policy update never took effect")
	for range 20 {
		_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
		require.NoError(t, err, "a call went to the endpoint out of rotation after the policy update")
	}
	require.Equal(t, before, bad.calls.Load())
}
