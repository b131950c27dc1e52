package meshgrpc_test

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
)

// coldRoutes time EmptyCall out at 300 ms and retry the failures of
// UnaryCall and StreamingOutputCall with UNAVAILABLE.
const coldRoutes = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: slow
  namespace: default
  annotations: {timeout.linkerd.io/request: 300ms}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: books, port: 7000}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: retried
  namespace: default
  annotations: {retry.linkerd.io/grpc: unavailable, retry.linkerd.io/limit: "2"}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches:
    - {method: {service: grpc.testing.TestService, method: UnaryCall}}
    - {method: {service: grpc.testing.TestService, method: StreamingOutputCall}}
    backendRefs: [{name: books, port: 7000}]
`

// coldApp blocks EmptyCall until the caller gives up, and fails the first
// UnaryCall and StreamingOutputCall with UNAVAILABLE.
type coldApp struct {
	testgrpc.UnimplementedTestServiceServer
	unary, stream atomic.Int64
}

func (a *coldApp) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

func (a *coldApp) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if a.unary.Add(1) == 1 {
		return nil, status.Error(codes.Unavailable, "not yet")
	}
	return &testgrpc.SimpleResponse{}, nil
}

func (a *coldApp) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	if a.stream.Add(1) == 1 {
		return status.Error(codes.Unavailable, "not yet")
	}
	return s.Send(&testgrpc.StreamingOutputCallResponse{})
}

// coldChannel is a brand-new channel to books on a fresh Destination
// client of a control plane serving coldRoutes and app: nothing has been
// discovered before its first call.
func coldChannel(t *testing.T, a testgrpc.TestServiceServer) (testgrpc.TestServiceClient, *testutil.Metrics) {
	t.Helper()
	addr := serveTestService(t, a)
	store := controlplane.NewStore()
	manifests(t, store, booksService+coldRoutes)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: addr}}})
	m := testutil.NewMetrics(t)
	return dial(t, serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider)), m
}

// The first call on a new channel is routed as every later one: its
// GRPCRoute's timeout ends it (300 ms, not the caller's 10 s deadline),
// its retry retries it, and the route's series count it. Before, the
// interceptors ran before the channel had built its resolver, so the
// first call found no routes and went to the target as it was.
func TestFirstCallRouted(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		c, m := coldChannel(t, &coldApp{})
		ctx := callCtx(t)
		start := time.Now()
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		took := time.Since(start)
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		assert.NoError(t, ctx.Err(), "the route's timeout ended the call, not the caller's deadline (took %v)", took)
		assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="slow"`, `error="REQUEST_TIMEOUT"`))
	})
	t.Run("unary retry", func(t *testing.T) {
		a := &coldApp{}
		c, m := coldChannel(t, a)
		_, err := c.UnaryCall(callCtx(t), &testgrpc.SimpleRequest{})
		require.NoError(t, err, "the first failure is retried")
		assert.Equal(t, int64(2), a.unary.Load())
		assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_retry_requests_total", `route_name="retried"`))
		assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="retried"`, `grpc_status="OK"`))
	})
	t.Run("stream retry", func(t *testing.T) {
		a := &coldApp{}
		c, m := coldChannel(t, a)
		s, err := c.StreamingOutputCall(callCtx(t), &testgrpc.StreamingOutputCallRequest{})
		require.NoError(t, err)
		_, err = s.Recv()
		require.NoError(t, err, "the first failure is retried")
		assert.Equal(t, int64(2), a.stream.Load())
		assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_retry_requests_total", `route_name="retried"`))
	})
}

// silentPolicies accepts every OutboundPolicies watch and never answers
// (a control plane that is wedged, or a stand-in that only holds streams).
type silentPolicies struct {
	outboundpb.UnimplementedOutboundPoliciesServer
}

func (silentPolicies) Watch(_ *outboundpb.TrafficSpec, s grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error {
	<-s.Context().Done()
	return nil
}

// A control plane that never answers the outbound policy: the first call
// waits for it no longer than the discovery wait, then goes to the target
// as it is; once the wait has passed, no later call waits again; a call
// whose own deadline comes first ends with it.
func TestFirstCallPolicyNeverAnswers(t *testing.T) {
	const wait = 2 * time.Second
	a := startApp(t, &app{}, nil)
	store := controlplane.NewStore()
	manifests(t, store, booksService+coldRoutes)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	destinationpb.RegisterDestinationServer(g, controlplane.NewServer(store))
	outboundpb.RegisterOutboundPoliciesServer(g, silentPolicies{})
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	// The silence means nothing to the destination client within the test.
	dst, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quiet),
		destination.WithFirstMessageTimeout(time.Hour))
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	c := dial(t, dst, meshgrpc.WithDiscoveryWait(wait), meshgrpc.WithLogger(quiet))

	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = c.EmptyCall(short, &testgrpc.Empty{})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "the caller's deadline ends its wait: %v", err)

	start := time.Now()
	_, err = c.UnaryCall(callCtx(t), &testgrpc.SimpleRequest{})
	assert.Equal(t, codes.Unimplemented, status.Code(err), "the target as it is: %v", err)
	assert.Less(t, time.Since(start), testutil.Timeout, "the wait is bounded")

	start = time.Now()
	for range 5 {
		_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
		require.NoError(t, err)
	}
	assert.Less(t, time.Since(start), wait, "later calls do not wait")
}

// A channel that went idle closed its resolver and its watches; its next
// call starts them again and is routed like the first one.
func TestFirstCallAfterIdleRouted(t *testing.T) {
	a := startApp(t, &app{handle: func(ctx context.Context, _ int64) error {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}}, nil)
	store := controlplane.NewStore()
	manifests(t, store, booksService+coldRoutes)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	m := testutil.NewMetrics(t)
	opts := append(meshgrpc.DialOptions(serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider)),
		grpc.WithIdleTimeout(500*time.Millisecond)) // longer than discovery takes on a loaded machine
	cc, err := grpc.NewClient(booksTarget, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	c := testgrpc.NewTestServiceClient(cc)
	for i := 1; i <= 2; i++ {
		ctx := callCtx(t)
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "call %d: %v", i, err)
		assert.NoError(t, ctx.Err(), "call %d: the route's timeout ended it", i)
		assert.Equal(t, strconv.Itoa(i), m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="slow"`, `error="REQUEST_TIMEOUT"`))
		// Idle: the resolver and its watches are gone.
		wait := callCtx(t)
		for s := cc.GetState(); s != connectivity.Idle; s = cc.GetState() {
			require.True(t, cc.WaitForStateChange(wait, s), "the channel never went idle")
		}
	}
}

// The first call on a new channel follows its target's ServiceProfile
// too: the profile route's timeout ends it and route_* counts it.
func TestFirstCallProfileRouted(t *testing.T) {
	a := startApp(t, &app{handle: func(ctx context.Context, _ int64) error {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}}, nil)
	store := controlplane.NewStore()
	setProfiles(t, store, `
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  routes:
  - name: EmptyCall
    condition: {method: POST, pathRegex: /grpc\.testing\.TestService/EmptyCall}
    timeout: 300ms
`)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	m := testutil.NewMetrics(t)
	c := dial(t, serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider))
	ctx := callCtx(t)
	_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.NoError(t, ctx.Err(), "the profile route's timeout ended the call, not the caller's deadline")
	assert.Len(t, m.Lines(t, "route_response_total", `rt_route="EmptyCall"`), 1)
}

// silentDestination accepts every Destination stream and never answers.
type silentDestination struct {
	destinationpb.UnimplementedDestinationServer
}

func (silentDestination) Get(_ *destinationpb.GetDestination, s grpc.ServerStreamingServer[destinationpb.Update]) error {
	<-s.Context().Done()
	return nil
}

func (silentDestination) GetProfile(_ *destinationpb.GetDestination, s grpc.ServerStreamingServer[destinationpb.DestinationProfile]) error {
	<-s.Context().Done()
	return nil
}

// A channel to a target that is not inmesh:/// never waits for discovery,
// even when it shares its options, and its host:port, with an inmesh
// channel whose first answers are pending (the control plane never
// answers its outbound policy, the discovery wait is 10s): its first call
// goes to the target at once.
func TestFirstCallNonMeshTargetNeverWaits(t *testing.T) {
	a := startApp(t, &app{}, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	destinationpb.RegisterDestinationServer(g, silentDestination{})
	outboundpb.RegisterOutboundPoliciesServer(g, silentPolicies{})
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	dst, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quiet), destination.WithFirstMessageTimeout(time.Hour),
		destination.WithSearchNetworks(netip.MustParsePrefix("127.0.0.0/8")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	opts := meshgrpc.DialOptions(dst, meshgrpc.WithDiscoveryWait(10*time.Second), meshgrpc.WithLogger(quiet))

	// The inmesh channel to the app's address: its wait is pending.
	mcc, err := grpc.NewClient("inmesh:///"+a.addr.String(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mcc.Close() })
	pending, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = testgrpc.NewTestServiceClient(mcc).EmptyCall(pending, &testgrpc.Empty{})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "the inmesh channel waits: %v", err)

	for _, target := range []string{"passthrough:///" + a.addr.String(), a.addr.String()} {
		// The mesh's interceptors, with grpc-go's own balancing of the
		// target's addresses.
		cc, err := grpc.NewClient(target, append(opts[:len(opts):len(opts)], grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"pick_first": {}}]}`))...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cc.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = testgrpc.NewTestServiceClient(cc).EmptyCall(ctx, &testgrpc.Empty{})
		cancel()
		assert.NoError(t, err, "%s: the first call does not wait for the inmesh channel's discovery", target)
	}
}

// A control plane that cannot be reached never answers the target: past
// the discovery wait, a fail-fast call on a new channel fails UNAVAILABLE
// (as the HTTP stack answers 503), not at its own deadline, while a
// wait-for-ready call waits on until its deadline.
func TestFirstCallControlPlaneUnreachable(t *testing.T) {
	dst, err := destination.Dial(testutil.RefusedAddr(t).String(), destination.WithLogger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	c := dial(t, dst, meshgrpc.WithLogger(quiet), meshgrpc.WithDiscoveryWait(200*time.Millisecond))
	_, err = c.EmptyCall(callCtx(t), &testgrpc.Empty{})
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "no answer from the control plane for "+books)

	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.EmptyCall(short, &testgrpc.Empty{}, grpc.WaitForReady(true))
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
}

// splitToAuthors sends every EmptyCall of books to the authors backend.
const splitToAuthors = `
---
apiVersion: v1
kind: Service
metadata: {name: authors, namespace: default}
spec: {ports: [{port: 7000}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: to-authors, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: authors, port: 7000}]
`

// The first call on a new channel, made while the control plane cannot be
// reached, waits out the discovery wait for its route as for its
// endpoints: when the control plane comes up within the wait, the call is
// routed by the GRPCRoute that came with them (to authors), not sent to
// books as if there were no route. Before, the client's own "cannot
// connect" ended the wait.
func TestFirstCallWaitsOutAnUnreachableControlPlane(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []destination.Option
	}{{"watches", nil}, {"Linkerd's streams", []destination.Option{destination.WithLinkerdStreams()}}} {
		t.Run(tc.name, func(t *testing.T) {
			booksApp, authorsApp := startApp(t, &app{}, nil), startApp(t, &app{}, nil)
			addr := testutil.FreeAddr(t)
			dst, refused := dialRefusedCounted(t, addr, tc.opts...)
			// An interceptor after the mesh's says when the mesh has routed
			// the call.
			routed := make(chan struct{}, 1)
			after := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
				invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
				select {
				case routed <- struct{}{}:
				default:
				}
				return invoker(ctx, method, req, reply, cc, o...)
			})
			cc, err := grpc.NewClient(booksTarget, append(meshgrpc.DialOptions(dst, meshgrpc.WithLogger(quiet),
				meshgrpc.WithDiscoveryWait(testutil.Timeout)), after)...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = cc.Close() })
			c := testgrpc.NewTestServiceClient(cc)

			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*testutil.Timeout)
				defer cancel()
				_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
				done <- err
			}()
			// The control plane comes up once the call was routed (as it
			// was, without its route, when the failure ended its wait), or
			// once the watches' streams failed, refused, and were tried
			// again a few times.
			wait := time.After(testutil.Timeout)
		refusals:
			for n := 0; n < 5; {
				select {
				case <-refused:
					n++
				case <-routed:
					t.Log("routed while the control plane was unreachable")
					break refusals
				case <-wait:
					t.Fatal("the control plane was never dialled")
				}
			}
			store := controlplane.NewStore()
			manifests(t, store, booksService+splitToAuthors)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: booksApp.addr}}, authors: {{Addr: authorsApp.addr}}})
			var lis net.Listener
			require.Eventually(t, func() bool { lis, err = net.Listen("tcp", addr); return err == nil }, testutil.Timeout, 10*time.Millisecond)
			g := grpc.NewServer()
			controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
			go func() { _ = g.Serve(lis) }()
			t.Cleanup(g.Stop)

			select {
			case err := <-done:
				require.NoError(t, err)
				assert.EqualValues(t, 1, authorsApp.calls.Load(), "the first call went to the route's backend (books got %d)", booksApp.calls.Load())
			case <-time.After(3 * testutil.Timeout):
				t.Fatal("the call never ended")
			}
		})
	}
}

// unavailablePolicies answers every OutboundPolicies watch with
// UNAVAILABLE (a policy controller not ready, or a gateway in front of it
// without a healthy backend): the control plane was reached and said so.
type unavailablePolicies struct {
	outboundpb.UnimplementedOutboundPoliciesServer
}

func (unavailablePolicies) Watch(*outboundpb.TrafficSpec, grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error {
	return status.Error(codes.Unavailable, "policy controller not ready")
}

// The control plane answers the target's endpoints and profile, and its
// outbound policy at once with UNAVAILABLE: the control plane was
// reached, and its answer ends the first call's discovery wait (only a
// control plane the client cannot reach leaves it waiting).
func TestFirstCallNotHeldByAnUnavailableAnswer(t *testing.T) {
	a := startApp(t, &app{}, nil)
	store := controlplane.NewStore()
	manifests(t, store, booksService)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	destinationpb.RegisterDestinationServer(g, controlplane.NewServer(store))
	outboundpb.RegisterOutboundPoliciesServer(g, unavailablePolicies{})
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	dst, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	c := dial(t, dst, meshgrpc.WithLogger(quiet), meshgrpc.WithDiscoveryWait(3*testutil.Timeout))

	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	start := time.Now()
	_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
	assert.NoError(t, err, "the first call, after %v", time.Since(start))
}
