package meshgrpc_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/inmesh/inmesh/profiles"
)

// namedApp is a real gRPC server that answers every UnaryCall and
// StreamingOutputCall with its name.
type namedApp struct {
	testgrpc.UnimplementedTestServiceServer
	name string
}

func (a *namedApp) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Username: a.name}, nil
}

func (a *namedApp) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	return s.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: []byte(a.name)}})
}

// splitNames are the Services of the split tests: books, the target, and
// two others a profile of books may override it to.
const (
	booksV1 = "books-v1.default.svc.cluster.local:7000"
	booksV2 = "books-v2.default.svc.cluster.local:7000"
)

// splitStore serves books, books-v1 and books-v2, each by a namedApp
// named after its Service ("books", "v1", "v2"), from a store with no
// profile yet.
func splitStore(t *testing.T) *controlplane.Store {
	t.Helper()
	store := controlplane.NewStore()
	ep := func(name string) []endpoint.Endpoint {
		return []endpoint.Endpoint{{Addr: serveTestService(t, &namedApp{name: name}), Weight: endpoint.DefaultWeight}}
	}
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: ep("books"), booksV1: ep("v1"), booksV2: ep("v2")})
	return store
}

// setOverrides gives books a ServiceProfile whose dstOverrides are
// overrides ("authority weight" each), with routes (YAML lines under
// spec.routes, "" for none).
func setOverrides(t *testing.T, store *controlplane.Store, routes string, overrides ...string) {
	t.Helper()
	y := "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: books.default.svc.cluster.local, namespace: default}\nspec:\n"
	if routes != "" {
		y += "  routes:\n" + routes
	}
	if len(overrides) > 0 {
		y += "  dstOverrides:\n"
		for _, o := range overrides {
			var a string
			var w int
			_, err := fmt.Sscan(o, &a, &w)
			require.NoError(t, err)
			y += fmt.Sprintf("  - {authority: %q, weight: %d}\n", a, w)
		}
	}
	if routes == "" && len(overrides) == 0 {
		y = strings.TrimSuffix(y, "\n") + " {}\n"
	}
	sps, err := profiles.ParseServiceProfiles([]byte(y))
	require.NoError(t, err)
	require.Len(t, sps, 1)
	store.PutServiceProfile(sps[0])
}

// dialBooks makes a new mesh channel to books.
func dialBooks(t *testing.T, store *controlplane.Store, opts ...meshgrpc.Option) testgrpc.TestServiceClient {
	t.Helper()
	return dial(t, serveStore(t, store, destination.WithLogger(quiet)), append([]meshgrpc.Option{meshgrpc.WithLogger(quiet)}, opts...)...)
}

// who returns the name of the app that served a UnaryCall through c.
func who(t *testing.T, c testgrpc.TestServiceClient) string {
	t.Helper()
	resp, err := c.UnaryCall(callCtx(t), &testgrpc.SimpleRequest{})
	require.NoError(t, err)
	return resp.GetUsername()
}

// whoStreams returns the name of the app that served a
// StreamingOutputCall through c.
func whoStreams(t *testing.T, c testgrpc.TestServiceClient) string {
	t.Helper()
	s, err := c.StreamingOutputCall(callCtx(t), &testgrpc.StreamingOutputCallRequest{})
	require.NoError(t, err)
	resp, err := s.Recv()
	require.NoError(t, err)
	return string(resp.GetPayload().GetBody())
}

// count makes n UnaryCalls through c and counts them by the app that
// served each.
func count(t *testing.T, c testgrpc.TestServiceClient, n int) map[string]int {
	t.Helper()
	got, err := tryCount(t, c, n)
	require.NoError(t, err)
	return got
}

// tryCount is count for a condition of require.Eventually, which runs
// on a goroutine of its own: the first error ends it.
func tryCount(t *testing.T, c testgrpc.TestServiceClient, n int) (map[string]int, error) {
	got := map[string]int{}
	for range n {
		resp, err := c.UnaryCall(callCtx(t), &testgrpc.SimpleRequest{})
		if err != nil {
			return got, err
		}
		got[resp.GetUsername()]++
	}
	return got, nil
}

// becomes waits until the next call through c goes to name.
func becomes(t *testing.T, c testgrpc.TestServiceClient, name, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		got, err := tryCount(t, c, 1)
		return err == nil && got[name] == 1
	}, testutil.Timeout, time.Millisecond, msg)
}

// A ServiceProfile's dstOverrides send a channel's calls to the
// overrides' Services by their weights, as Linkerd's proxy sends every
// HTTP/2 request of the profile's logical address to the backends its
// targets make (linkerd2-proxy linkerd/app/outbound/src/http/logical/profile.rs):
// the first call of a brand-new channel already goes there, a change of
// the overrides reaches the calls of an open channel, and without
// overrides the calls go to the target again. Each call is recorded in
// response_total under the authority of the Service that took it, and in
// route_* under the target's, as the HTTP stack records a split request.
func TestServiceProfileDstOverridesSplitCalls(t *testing.T) {
	store := splitStore(t)
	setOverrides(t, store, "", booksV2+" 100")
	m := testutil.NewMetrics(t)
	c := dialBooks(t, store, meshgrpc.WithMeterProvider(m.Provider))
	assert.Equal(t, "v2", who(t, c), "the first call of a new channel")
	assert.Equal(t, "v2", whoStreams(t, dialBooks(t, store)), "the first stream of a new channel")
	assert.Equal(t, map[string]int{"v2": 20}, count(t, c, 20))
	assert.Equal(t, "21", m.Value(t, "response_total", `direction="outbound"`, `authority="`+booksV2+`"`, `classification="success"`))
	assert.Empty(t, m.Lines(t, "response_total", `authority="`+books+`"`), "no call went to books")
	assert.Equal(t, "21", m.Value(t, "route_response_total", `direction="outbound"`, `dst="`+books+`"`, `classification="success"`))

	setOverrides(t, store, "", booksV1+" 50", booksV2+" 50")
	becomes(t, c, "v1", "the new overrides reach the open channel")
	got := count(t, c, 200)
	assert.GreaterOrEqual(t, got["v1"], 30, "%v", got)
	assert.GreaterOrEqual(t, got["v2"], 30, "%v", got)
	assert.Equal(t, 200, got["v1"]+got["v2"], "%v", got)
	assert.NotEmpty(t, m.Value(t, "response_total", `authority="`+booksV1+`"`, `classification="success"`))
	streams := map[string]bool{}
	for n := 0; n < 200 && len(streams) < 2; n++ {
		streams[whoStreams(t, c)] = true
	}
	assert.Equal(t, map[string]bool{"v1": true, "v2": true}, streams, "streams follow the split")

	setOverrides(t, store, "")
	becomes(t, c, "books", "without overrides, books again")
	assert.Equal(t, map[string]int{"books": 50}, count(t, c, 50))
	assert.Equal(t, "books", whoStreams(t, c))
}

// Linkerd's own cases of a profile's dst overrides (linkerd2-proxy
// linkerd/app/integration/src/tests/profile_dst_overrides.rs), over
// gRPC: each step sets the overrides of books's profile, whose routes
// stay (a route for EmptyCall and one for every call, as there), and
// then n calls go only to want, each of them reached when all is set. The
// first case starts on a brand-new channel, each step on the channel of
// the one before.
func TestServiceProfileDstOverridesLinkerdCases(t *testing.T) {
	const routes = "  - {name: load-profile, condition: {method: POST, pathRegex: /grpc\\.testing\\.TestService/EmptyCall}}\n" +
		"  - {name: any, condition: {pathRegex: .*}}\n"
	type step struct {
		overrides []string
		want      []string
		all       bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"add_a_dst_override", []step{
			{[]string{booksV1 + " 10000"}, []string{"v1"}, true},
		}},
		{"add_multiple_dst_overrides", []step{
			{[]string{booksV1 + " 5000", booksV2 + " 5000"}, []string{"v1", "v2"}, true},
		}},
		{"set_a_dst_override_weight_to_zero", []step{
			{[]string{booksV1 + " 5000", booksV2 + " 5000"}, []string{"v1", "v2"}, true},
			{[]string{booksV1 + " 0", booksV2 + " 5000"}, []string{"v2"}, true},
		}},
		{"set_all_dst_override_weights_to_zero", []step{
			{[]string{booksV1 + " 5000", booksV2 + " 5000"}, []string{"v1", "v2"}, true},
			{[]string{booksV1 + " 0", booksV2 + " 0"}, []string{"books"}, true},
		}},
		{"remove_a_dst_override", []step{
			{[]string{booksV1 + " 10000"}, []string{"v1"}, true},
			{nil, []string{"books"}, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := splitStore(t)
			setOverrides(t, store, routes, tc.steps[0].overrides...)
			c := dialBooks(t, store)
			only := func(want []string, got map[string]int) bool {
				for name := range got {
					if !slices.Contains(want, name) {
						return false
					}
				}
				return true
			}
			const n = 100
			for i, s := range tc.steps {
				if i == 0 {
					first := who(t, c)
					assert.Contains(t, s.want, first, "the first call of a new channel")
				} else {
					setOverrides(t, store, routes, s.overrides...)
					// The step's profile is in force once a batch of calls
					// goes only to want: 20 in a row by chance has odds
					// of 2^-20 in these cases.
					require.Eventually(t, func() bool {
						got, err := tryCount(t, c, 20)
						return err == nil && only(s.want, got)
					}, testutil.Timeout, time.Millisecond, "step %d", i)
				}
				got := count(t, c, n)
				assert.True(t, only(s.want, got), "step %d: want only %v, got %v", i, s.want, got)
				if s.all {
					for _, w := range s.want {
						assert.Positive(t, got[w], "step %d: %s, got %v", i, w, got)
					}
				}
			}
		})
	}
}

// holdFirstCall returns an interceptor that, chained after meshgrpc's
// (which drew the call's backend), stops the channel's first call before
// the balancer's pick: held is closed when it is stopped, and closing
// release lets it go on.
func holdFirstCall() (hold grpc.UnaryClientInterceptor, held, release chan struct{}) {
	held, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold = func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		first := false
		once.Do(func() { first = true })
		if first {
			close(held)
			<-release
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	return hold, held, release
}

// A call whose backend the dst overrides drew, and which reaches the
// balancer only after the overrides changed and the channel stopped
// following that backend, goes to a backend of the overrides in force,
// instead of waiting until its deadline for endpoints that will never
// come.
func TestCallToADroppedOverrideTakesTheSplitInForce(t *testing.T) {
	store := splitStore(t)
	setOverrides(t, store, "", booksV1+" 100")
	hold, held, release := holdFirstCall()
	dst := serveStore(t, store, destination.WithLogger(quiet))
	cc, err := grpc.NewClient(booksTarget, append(meshgrpc.DialOptions(dst, meshgrpc.WithLogger(quiet)), grpc.WithChainUnaryInterceptor(hold))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	c := testgrpc.NewTestServiceClient(cc)

	errc := make(chan error, 1)
	var first *testgrpc.SimpleResponse
	go func() {
		var err error
		first, err = c.UnaryCall(callCtx(t), &testgrpc.SimpleRequest{})
		errc <- err
	}()
	<-held
	setOverrides(t, store, "", booksV2+" 100")
	// Once a call reached v2, the channel no longer follows v1.
	becomes(t, c, "v2", "the new overrides reach the open channel")
	close(release)
	require.NoError(t, <-errc)
	assert.Equal(t, "v2", first.GetUsername())
}

// A channel to a Service's clusterIP follows the dst overrides of the
// profile the control plane gives for the address (the Service's), as
// Linkerd's proxy builds the backends of a clusterIP's logical address
// from the targets of that profile
// (linkerd/app/outbound/src/http/logical/profile.rs): its first call
// already goes to the override, and without overrides the calls go to
// the Service.
func TestCallToAClusterIPTakesItsProfileSplit(t *testing.T) {
	vip := testutil.ClusterIP(7000)
	store := splitStore(t)
	manifests(t, store, testutil.ClusterIPService("default", "books", vip))
	setOverrides(t, store, "", booksV2+" 100")
	cc, err := grpc.NewClient("inmesh:///"+vip.String(), meshgrpc.DialOptions(serveStore(t, store, destination.WithLogger(quiet),
		destination.WithSearchNetworks(netip.MustParsePrefix("127.0.0.0/8"))),
		meshgrpc.WithLogger(quiet), meshgrpc.WithDiscoveryWait(testutil.Timeout))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	c := testgrpc.NewTestServiceClient(cc)
	assert.Equal(t, "v2", who(t, c), "the first call of a new channel")
	assert.Equal(t, map[string]int{"v2": 20}, count(t, c, 20))

	setOverrides(t, store, "")
	becomes(t, c, "books", "without overrides, the Service")
	assert.Equal(t, map[string]int{"books": 20}, count(t, c, 20))
}

// A call to a Service's clusterIP whose backend the dst overrides drew,
// and which reaches the balancer only after the overrides were removed,
// goes to the Service, where the channel's other calls now go, instead of
// waiting until its deadline for a backend keyed by the address itself.
func TestClusterIPCallOfARemovedOverrideTakesTheService(t *testing.T) {
	vip := testutil.ClusterIP(7000)
	store := splitStore(t)
	manifests(t, store, testutil.ClusterIPService("default", "books", vip))
	setOverrides(t, store, "", booksV2+" 100")
	hold, held, release := holdFirstCall()
	dst := serveStore(t, store, destination.WithLogger(quiet), destination.WithSearchNetworks(netip.MustParsePrefix("127.0.0.0/8")))
	cc, err := grpc.NewClient("inmesh:///"+vip.String(), append(meshgrpc.DialOptions(dst, meshgrpc.WithLogger(quiet),
		meshgrpc.WithDiscoveryWait(testutil.Timeout)), grpc.WithChainUnaryInterceptor(hold))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	c := testgrpc.NewTestServiceClient(cc)

	errc := make(chan error, 1)
	var first *testgrpc.SimpleResponse
	go func() {
		var err error
		first, err = c.UnaryCall(callCtx(t), &testgrpc.SimpleRequest{})
		errc <- err
	}()
	<-held
	setOverrides(t, store, "")
	becomes(t, c, "books", "without overrides, the Service")
	close(release)
	require.NoError(t, <-errc)
	assert.Equal(t, "books", first.GetUsername())
}
