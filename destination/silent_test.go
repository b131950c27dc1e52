package destination_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// Linkerd's controller never sends no_endpoints for a service that exists
// with no endpoints: the Get stream stays silent. The client keeps such a
// stream open, delivers "exists, no endpoints", requests fail fast (the
// first with 504 after the balancer's failfast timeout, the others with
// 503 at once), and the first later message applies.
//
// The first-message deadline is 50ms here instead of 5s, and the backoff
// 20ms to 200ms: the 1.5s watched below are 30 deadlines, 150s at the
// default deadline, five times the 30s the contract names.
func TestSilentGetStreamMeansNoEndpointsYet(t *testing.T) {
	const deadline = 50 * time.Millisecond
	_, backendEp := backend(t, "a")
	s := newScripted()
	sendAdd := make(chan struct{})
	var getCalls atomic.Int32
	s.get = func(_ int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.Update]) error {
		getCalls.Add(1)
		select {
		case <-sendAdd: // accept the stream, say nothing until told
		case <-st.Context().Done():
			return nil
		}
		add := &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{Addrs: []*pb.WeightedAddr{destination.EndpointToProto(backendEp)}}}}
		if err := st.Send(add); err != nil {
			return err
		}
		return block(st.Context())
	}
	s.profile = func(_ int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
		if err := st.Send(destination.ProfileToProto(serviceProfile(books).ProfileFor(7000))); err != nil {
			return err
		}
		return block(st.Context())
	}
	cp := serve(t, s)
	logs := &testutil.LogLines{}
	c := newTestClient(t, cp.addr, destination.WithFirstMessageTimeout(deadline), destination.WithLogger(logs.Logger()))

	rec := newRecorder[endpoint.Update]()
	stop, err := c.WatchEndpoints(context.Background(), books+":7000", rec.update)
	require.NoError(t, err)
	defer stop()
	u := rec.waitFor(t, "exists with no endpoints", func(endpoint.Update) bool { return true })
	require.NoError(t, u.Err)
	require.NotNil(t, u.Set)
	assert.True(t, u.Set.Exists)
	assert.Empty(t, u.Set.Endpoints)

	// Requests through the balancer fail fast: the resolve timeout is
	// an hour, so a request that waited for the control plane would hang
	// until the client's own timeout failed the test. The first waits in
	// the queue for the failfast timeout, the others are shed at once.
	_, hc := balancedClient(t, c, balancer.WithResolveTimeout(time.Hour), balancer.WithFallback(false),
		balancer.WithQueue(10, 100*time.Millisecond))
	for i := range 3 {
		status, _, hdr := fetch(t, hc, "http://"+books+":7000/")
		if i == 0 {
			assert.Equal(t, http.StatusGatewayTimeout, status, "the fail-fast")
		} else {
			assert.Equal(t, http.StatusServiceUnavailable, status, "shed")
		}
		assert.Contains(t, hdr.Get("l5d-proxy-error"), "no endpoints")
	}

	// 30 deadlines: the one stream stays open, no reconnect, no warning.
	time.Sleep(30 * deadline)
	// Only Get is counted: the balancer's GetProfile stream has the same
	// short deadline, and on a loaded machine its first message may miss it.
	assert.Equal(t, int32(1), getCalls.Load(), "one Get stream, never re-established")
	assert.Len(t, rec.all(), 1, "one update for the silence, not one per deadline")
	assert.Zero(t, logs.Count("level=WARN", "rpc=Get "), "no warning about the Get stream: %s", logs.String())
	assert.Equal(t, 1, logs.Count("level=DEBUG", "rpc=Get ", "silent"), "one debug line for the silence: %s", logs.String())

	// The first message later applies as usual.
	close(sendAdd)
	rec.waitFor(t, "the endpoint", func(u endpoint.Update) bool { return len(addrs(u)) == 1 })
	// The balancer has a subscription of its own, served in its own order.
	require.Eventually(t, func() bool {
		status, body, _ := fetch(t, hc, "http://"+books+":7000/")
		return status == http.StatusOK && strings.HasPrefix(body, "a ")
	}, defaultTestTimeout, 5*time.Millisecond, "requests reach the endpoint the add announced")
	assert.Equal(t, int32(1), getCalls.Load(), "still the same stream")
}
