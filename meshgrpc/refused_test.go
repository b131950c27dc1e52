package meshgrpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// authorsManifests are booksService and coldRoutes for authors: among
// them a GRPCRoute that times EmptyCall out at 300 ms.
var authorsManifests = strings.ReplaceAll(booksService+coldRoutes, "books", "authors")

// A channel whose policy, profile and endpoint watches the Destination
// client refused (its bound, held by another channel) tries them again:
// once the bound has room, the channel gets its target's policy, and its
// calls follow the GRPCRoute (the route's 300 ms timeout ends a call that
// the app never answers). Before, a channel refused its policy at its
// first resolution went without routes for its whole life.
func TestRefusedPolicyWatchIsTriedAgain(t *testing.T) {
	app := serveTestService(t, &coldApp{})
	store := controlplane.NewStore()
	manifests(t, store, booksService+"\n---\n"+authorsManifests)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: app}}, authors: {{Addr: app}}})
	dst := serveStore(t, store, destination.WithMaxWatches(1))

	first, err := grpc.NewClient(booksTarget, meshgrpc.DialOptions(dst)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Close() })
	first.Connect()
	require.Eventually(t, func() bool {
		s := dst.Stats()
		return s.ProfileWatches == 1 && s.PolicyWatches == 1 && s.EndpointWatches == 1
	}, testutil.Timeout, 10*time.Millisecond, "the first channel holds the bound")

	m := testutil.NewMetrics(t)
	cc, err := grpc.NewClient("inmesh:///"+authors, meshgrpc.DialOptions(dst, meshgrpc.WithMeterProvider(m.Provider))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	cc.Connect()
	require.Eventually(t, func() bool { return dst.Stats().RejectedWatches >= 3 }, testutil.Timeout, 10*time.Millisecond,
		"the second channel's profile, policy and endpoint watches are refused")

	require.NoError(t, first.Close()) // its watches idle, and give way at the bound
	c := testgrpc.NewTestServiceClient(cc)
	// A call the route's timeout ends takes 300 ms; one without the
	// policy runs to the caller's 3 s deadline, which, as it races the
	// caller's own context, may also come back before ctx says so.
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
		return status.Code(err) == codes.DeadlineExceeded && time.Since(start) < 1500*time.Millisecond
	}, 4*testutil.Timeout, 10*time.Millisecond, "the route's timeout ends a call once the policy is watched again")
	assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="slow"`, `error="REQUEST_TIMEOUT"`))
}
