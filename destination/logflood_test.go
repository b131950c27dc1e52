package destination_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A control plane flooding bad updates (profiles with a route that does
// not convert, endpoints with a bad address) writes a few log lines, not
// one per update. The interval is an hour, so that a loaded machine that
// takes seconds over the flood cannot let a second line of a kind through,
// and the flood is 1,000 updates, which such a machine still decodes well
// within the wait for the good ones.
func TestRejectedUpdateFloodIsRateLimited(t *testing.T) {
	const n = 500
	s := newScripted()
	s.profile = func(_ int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
		bad := &pb.DestinationProfile{Routes: []*pb.Route{{}}} // a route without a condition
		for range n {
			if err := st.Send(bad); err != nil {
				return err
			}
		}
		if err := st.Send(destination.ProfileToProto(serviceProfile(books, "good").ProfileFor(7000))); err != nil {
			return err
		}
		return block(st.Context())
	}
	s.get = func(_ int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.Update]) error {
		bad := &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{Addrs: []*pb.WeightedAddr{{Addr: &pb.TcpAddress{Port: 70000}}}}}}
		for range n {
			if err := st.Send(bad); err != nil {
				return err
			}
		}
		good := &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{Addrs: []*pb.WeightedAddr{destination.EndpointToProto(ep("10.0.0.1:80", false))}}}}
		if err := st.Send(good); err != nil {
			return err
		}
		return block(st.Context())
	}
	cp := serve(t, s)
	logs := &testutil.LogLines{}
	c := newTestClient(t, cp.addr, destination.WithLogger(logs.Logger()), destination.WithLogInterval(time.Hour))
	prof := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	defer stop()
	eps := newRecorder[endpoint.Update]()
	stopE, err := c.WatchEndpoints(context.Background(), books+":7000", eps.update)
	require.NoError(t, err)
	defer stopE()
	prof.waitFor(t, "the good profile", hasRoute("good"))
	eps.waitFor(t, "the good endpoint", func(u endpoint.Update) bool { return len(addrs(u)) == 1 })
	t.Logf("%d rejected updates: %d log lines, %d bytes", 2*n, logs.Count(""), logs.Bytes())
	assert.Equal(t, 2, logs.Count("WARN"), "one line per kind within the interval:\n%s", logs.String())
}

// A rogue control plane sending distinct bad profiles: each route left out
// is named in the log, within one rate-limit interval; the good profile
// after them is applied.
func TestEveryDistinctDroppedRouteIsLogged(t *testing.T) {
	const n = 17
	s := newScripted()
	s.profile = func(_ int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
		good := destination.ProfileToProto(serviceProfile(books, "r").ProfileFor(7000)).Routes[0]
		for i := range n {
			// i good routes, then one without a condition: a different
			// field at fault each time.
			bad := &pb.DestinationProfile{}
			for range i {
				bad.Routes = append(bad.Routes, good)
			}
			bad.Routes = append(bad.Routes, &pb.Route{})
			if err := st.Send(bad); err != nil {
				return err
			}
		}
		if err := st.Send(destination.ProfileToProto(serviceProfile(books, "good").ProfileFor(7000))); err != nil {
			return err
		}
		return block(st.Context())
	}
	cp := serve(t, s)
	logs := &testutil.LogLines{}
	c := newTestClient(t, cp.addr, destination.WithLogger(logs.Logger()), destination.WithLogInterval(time.Hour))
	prof := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	defer stop()
	prof.waitFor(t, "the good profile", hasRoute("good"))
	for i := range n {
		assert.Equal(t, 1, logs.Count("WARN", fmt.Sprintf("routes[%d]", i)), "bad profile %d named once:\n%s", i, logs.String())
	}
}

// A stream that delivered updates and then ended is logged as an event
// (info, with the cause), not as an error marked "progress made".
func TestStreamEndAfterUpdatesIsNotAnError(t *testing.T) {
	s := newScripted()
	s.profile = func(n int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
		if n > 1 { // calls count from 1
			return block(st.Context())
		}
		if err := st.Send(destination.ProfileToProto(serviceProfile(books, "good").ProfileFor(7000))); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "the control plane is restarting")
	}
	cp := serve(t, s)
	logs := &testutil.LogLines{}
	c := newTestClient(t, cp.addr, destination.WithLogger(logs.Logger()))
	prof := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	defer stop()
	require.Eventually(t, func() bool { return logs.Count("stream ended after updates") == 1 }, defaultTestTimeout, 5*time.Millisecond, logs.String())
	line := logs.String()
	assert.Contains(t, line, "level=INFO")
	assert.Contains(t, line, "the control plane is restarting")
	assert.NotContains(t, line, "progress made")
	assert.NotContains(t, line, "level=WARN")
}

// The target of a policy watch is logged under its own name, once.
func TestTargetAttr(t *testing.T) {
	assert.Equal(t, "authority=books.default.svc.cluster.local:7000", destination.TargetAttr("authority=books.default.svc.cluster.local:7000").String())
	assert.Equal(t, "addr=10.0.0.1:80", destination.TargetAttr("addr=10.0.0.1:80").String())
	assert.Equal(t, "authority=books.default.svc.cluster.local:7000", destination.TargetAttr("books.default.svc.cluster.local:7000").String())
}
