package destination_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A watch that a stream delivered a state for keeps it when the stream
// re-established after a control plane's restart is answered "not found",
// as Linkerd's controller answers while it has not yet loaded what it
// serves ("Remote cluster not found: west" until a restarted controller
// has read the Link, "Service books.default not found" while a Service is
// re-created: controller/api/destination/server.go Get). Linkerd's proxy
// keeps its endpoints through such answers (linkerd/app/src/dst.rs backs
// off on every code but InvalidArgument and FailedPrecondition;
// linkerd/proxy/resolve/src/recover.rs emits no update on an error), and
// its policy (tonic-watch keeps the last ClientPolicy). Each row: the first
// stream delivers a state and ends, the second is answered "not found",
// the third delivers a new state; no update in between may stand for "no
// such target". The first answer being "not found" is TestNotFoundIsNoSuchTarget.
func TestNotFoundAfterAStateKeepsIt(t *testing.T) {
	notFound := []struct {
		name string
		err  error
	}{
		{"Get NotFound, a remote cluster not loaded yet", status.Error(codes.NotFound, "Remote cluster not found: west")},
		{"Get NotFound, a Service re-created", status.Error(codes.NotFound, "Service books-west.default not found")},
	}
	for _, tc := range notFound {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted()
			s.get = func(call int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.Update]) error {
				switch call {
				case 1:
					return st.Send(addUpdate("10.0.0.1:80"))
				case 2:
					return tc.err
				case 3:
					if err := st.Send(addUpdate("10.0.0.1:80", "10.0.0.2:80")); err != nil {
						return err
					}
				}
				return block(st.Context())
			}
			c := newTestClient(t, serve(t, s).addr)
			rec := newRecorder[endpoint.Update]()
			stop, err := c.WatchEndpoints(context.Background(), "books-west.default.svc.cluster.local:80", rec.update)
			require.NoError(t, err)
			defer stop()
			// The third stream's state comes after anything the "not found"
			// answer published: updates are delivered in order.
			rec.waitFor(t, "the third stream's endpoints", func(u endpoint.Update) bool { return len(addrs(u)) == 2 })
			for i, u := range rec.all() {
				require.NotNil(t, u.Set, "update %d", i)
				assert.True(t, u.Set.Exists, "update %d says no such service", i)
				assert.NotEmpty(t, addrs(u), "update %d dropped the endpoints", i)
			}
		})
	}

	profileNotFound := []struct {
		name string
		err  error
	}{
		{"GetProfile NotFound", status.Error(codes.NotFound, "Service books.default not found")},
		{"GetProfile Unknown from Kubernetes", status.Error(codes.Unknown, `service "books" not found`)},
	}
	for _, tc := range profileNotFound {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted()
			s.profile = func(call int, _ *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
				switch call {
				case 1:
					return st.Send(destination.ProfileToProto(serviceProfile("books", "first").ProfileFor(80)))
				case 2:
					return tc.err
				case 3:
					if err := st.Send(destination.ProfileToProto(serviceProfile("books", "third").ProfileFor(80))); err != nil {
						return err
					}
				}
				return block(st.Context())
			}
			c := newTestClient(t, serve(t, s).addr)
			rec := newRecorder[profiles.Update]()
			stop, err := c.Watch(context.Background(), "books.default.svc.cluster.local:80", rec.update)
			require.NoError(t, err)
			defer stop()
			rec.waitFor(t, "the third stream's profile", hasRoute("third"))
			for i, u := range rec.all() {
				assert.NotNil(t, u.Profile, "update %d dropped the profile", i)
			}
		})
	}

	t.Run("OutboundPolicies NotFound", func(t *testing.T) {
		first := destination.PolicyToProto(resources(t, authorsServiceYAML).Policy("default", "authors", 7001))
		third := destination.PolicyToProto(resources(t, authorsServiceYAML, authorsRouteYAML).Policy("default", "authors", 7001))
		srv := &policyCalls{answer: func(call int, st grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error {
			switch call {
			case 1:
				return st.Send(first)
			case 2:
				return status.Error(codes.NotFound, "unknown target")
			case 3:
				if err := st.Send(third); err != nil {
					return err
				}
			}
			return block(st.Context())
		}}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		g := grpc.NewServer()
		outboundpb.RegisterOutboundPoliciesServer(g, srv)
		done := make(chan struct{})
		go func() { defer close(done); _ = g.Serve(lis) }()
		defer func() { g.Stop(); <-done }()

		c := newTestClient(t, lis.Addr().String())
		rec := newRecorder[policy.Update]()
		stop, err := c.WatchPolicy(context.Background(), destination.TrafficSpec{Authority: authorsAuthority}, rec.update)
		require.NoError(t, err)
		defer stop()
		rec.waitFor(t, "the third stream's policy", routeNamedP("authors-get"))
		for i, u := range rec.all() {
			assert.NotNil(t, u.Policy, "update %d dropped the policy", i)
		}
	})
}

// addUpdate is a Get answer adding addrs.
func addUpdate(addrs ...string) *pb.Update {
	set := &pb.WeightedAddrSet{MetricLabels: map[string]string{"namespace": "default", "service": "books-west"}}
	for _, a := range addrs {
		set.Addrs = append(set.Addrs, destination.EndpointToProto(ep(a, true)))
	}
	return &pb.Update{Update: &pb.Update_Add{Add: set}}
}

// policyCalls answers each OutboundPolicies Watch call with its function.
type policyCalls struct {
	outboundpb.UnimplementedOutboundPoliciesServer
	n      atomic.Int32
	answer func(call int, st grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error
}

func (s *policyCalls) Watch(_ *outboundpb.TrafficSpec, st grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error {
	return s.answer(int(s.n.Add(1)), st)
}

// The update that says the control plane could not be reached is the
// client's own, not a state a stream delivered: a control plane that comes
// up later and answers "not found" is heard, at once, by a policy and a
// profile watch made while it was down (and by whoever waits on their
// first answer, such as a gRPC channel's discovery wait).
func TestNotFoundAfterUnreachableIsDelivered(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []destination.Option
	}{
		{"Watches", nil},
		{"Linkerd's streams", []destination.Option{destination.WithLinkerdStreams()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, listen := testutil.RefusedUntilListen(t)
			c := newTestClient(t, addr.String(), tc.opts...)
			const authority = "books.default.svc.cluster.local:7000"
			pol := newRecorder[policy.Update]()
			stop, err := c.WatchPolicy(context.Background(), destination.TrafficSpec{Authority: authority}, pol.update)
			require.NoError(t, err)
			defer stop()
			prof := newRecorder[profiles.Update]()
			stop, err = c.Watch(context.Background(), authority, prof.update)
			require.NoError(t, err)
			defer stop()
			u := pol.waitFor(t, "the policy watch's unreachable update", func(u policy.Update) bool { return u.Err != nil })
			require.ErrorIs(t, u.Err, destination.ErrUnreachable)
			p := prof.waitFor(t, "the profile watch's unreachable update", func(u profiles.Update) bool { return u.Err != nil })
			require.ErrorIs(t, p.Err, destination.ErrUnreachable)

			g := grpc.NewServer()
			controlplane.NewServer(controlplane.NewStore(), controlplane.WithLogger(quietLogger)).Register(g)
			done := make(chan struct{})
			go func() { defer close(done); _ = g.Serve(listen()) }()
			defer func() { g.Stop(); <-done }()

			pol.waitFor(t, "the control plane's not found", func(u policy.Update) bool { return u.Err == nil && u.Policy == nil })
			prof.waitFor(t, "the control plane's not found", func(u profiles.Update) bool { return u.Err == nil && u.Profile == nil })
		})
	}
}
