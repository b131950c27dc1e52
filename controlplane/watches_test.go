package controlplane

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/inmesh/inmesh/balancer/endpoint"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// watchesStream opens a Watches stream with the generated client alone.
func watchesStream(t *testing.T, addr string) (watchespb.Watches_WatchClient, context.CancelFunc) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := watchespb.NewWatchesClient(conn).Watch(ctx)
	require.NoError(t, err)
	return st, cancel
}

func subscribeReq(id uint64, kind watchespb.Kind, path string) *watchespb.WatchRequest {
	return &watchespb.WatchRequest{Request: &watchespb.WatchRequest_Subscribe{Subscribe: &watchespb.Subscribe{
		Id: id, Kind: kind, Destination: &pb.GetDestination{Path: path}}}}
}

func unsubscribeReq(id uint64) *watchespb.WatchRequest {
	return &watchespb.WatchRequest{Request: &watchespb.WatchRequest_Unsubscribe{Unsubscribe: &watchespb.Unsubscribe{Id: id}}}
}

// Every kind over one Watches stream answers exactly what the Linkerd
// stream of that kind answers: the same messages for a Service that
// exists, and, as an Ended answer, the status that ends the Linkerd stream
// for one that does not or a request it refuses.
func TestWatchesAnswerAsLinkerdStreams(t *testing.T) {
	store := NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{booksSvc + ":7000": {ep("10.0.0.1:7000", true)}})
	store.SetServiceProfiles(nil)
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	api := rawClient(t, cp.addr)
	conn, err := grpc.NewClient(cp.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	policyAPI := outboundpb.NewOutboundPoliciesClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	st, _ := watchesStream(t, cp.addr)

	first := func(t *testing.T, open func() (func() (proto.Message, error), error)) (proto.Message, error) {
		t.Helper()
		recv, err := open()
		if err != nil {
			return nil, err
		}
		return recvTimeout(t, recv)
	}
	spec := &outboundpb.TrafficSpec{SourceWorkload: "default:client", Target: &outboundpb.TrafficSpec_Authority{Authority: booksSvc + ":7000"}}
	cases := []struct {
		name   string
		kind   watchespb.Kind
		path   string
		spec   *outboundpb.TrafficSpec
		linker func() (func() (proto.Message, error), error)
	}{
		{"profile", watchespb.Kind_PROFILE, booksSvc + ":7000", nil, func() (func() (proto.Message, error), error) {
			s, err := api.GetProfile(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
			return func() (proto.Message, error) { return s.Recv() }, err
		}},
		{"endpoints", watchespb.Kind_ENDPOINTS, booksSvc + ":7000", nil, func() (func() (proto.Message, error), error) {
			s, err := api.Get(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
			return func() (proto.Message, error) { return s.Recv() }, err
		}},
		{"policy", watchespb.Kind_POLICY, "", spec, func() (func() (proto.Message, error), error) {
			s, err := policyAPI.Watch(ctx, spec)
			return func() (proto.Message, error) { return s.Recv() }, err
		}},
		{"profile of a Service that does not exist", watchespb.Kind_PROFILE, "nope.default.svc.cluster.local:80", nil, func() (func() (proto.Message, error), error) {
			s, err := api.GetProfile(ctx, &pb.GetDestination{Path: "nope.default.svc.cluster.local:80"})
			return func() (proto.Message, error) { return s.Recv() }, err
		}},
		{"endpoints of a Service that does not exist", watchespb.Kind_ENDPOINTS, "nope.default.svc.cluster.local:80", nil, func() (func() (proto.Message, error), error) {
			s, err := api.Get(ctx, &pb.GetDestination{Path: "nope.default.svc.cluster.local:80"})
			return func() (proto.Message, error) { return s.Recv() }, err
		}},
		{"endpoints of an IP address", watchespb.Kind_ENDPOINTS, "10.0.0.1:80", nil, func() (func() (proto.Message, error), error) {
			s, err := api.Get(ctx, &pb.GetDestination{Path: "10.0.0.1:80"})
			return func() (proto.Message, error) { return s.Recv() }, err
		}},
		{"policy without a target", watchespb.Kind_POLICY, "", nil, func() (func() (proto.Message, error), error) {
			s, err := policyAPI.Watch(ctx, &outboundpb.TrafficSpec{})
			return func() (proto.Message, error) { return s.Recv() }, err
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want, wantErr := first(t, tc.linker)
			req := subscribeReq(uint64(i+1), tc.kind, tc.path)
			req.GetSubscribe().TrafficSpec = tc.spec
			if tc.kind == watchespb.Kind_POLICY {
				req.GetSubscribe().Destination = nil
			}
			require.NoError(t, st.Send(req))
			r, err := recvTimeout(t, st.Recv)
			require.NoError(t, err)
			assert.Equal(t, uint64(i+1), r.GetId())
			if wantErr != nil {
				require.NotNil(t, r.GetEnded(), "answer %v", r)
				assert.Equal(t, uint32(statusCode(wantErr)), r.GetEnded().GetCode())
				assert.Equal(t, statusMessage(wantErr), r.GetEnded().GetMessage())
				return
			}
			var got proto.Message
			switch a := r.GetAnswer().(type) {
			case *watchespb.WatchResponse_Profile:
				got = a.Profile
			case *watchespb.WatchResponse_Update:
				got = a.Update
			case *watchespb.WatchResponse_Policy:
				got = a.Policy
			}
			assert.Empty(t, cmpDiff(want, got))
		})
	}
}

// A change wakes only the subscriptions of what changed, as with Linkerd's
// streams (TestChangeWakesOnlyItsWatchers): with 50 Services subscribed
// for endpoints and profiles on one stream, an endpoint change to one
// wakes its Get subscription alone; a subscription closed by Unsubscribe
// is not answered again and releases its waiter.
func TestWatchesChangeWakesOnlyItsSubscribers(t *testing.T) {
	store := NewStore()
	srv := NewServer(store, WithLogger(quietLogger))
	cp := serve(t, srv)
	st, _ := watchesStream(t, cp.addr)

	const n = 50
	name := func(i int) string { return fmt.Sprintf("svc-%d.default.svc.cluster.local:80", i) }
	sets := map[string][]endpoint.Endpoint{}
	for i := range n {
		sets[name(i)] = []endpoint.Endpoint{ep(fmt.Sprintf("10.0.0.%d:80", i+1), false)}
	}
	store.SetEndpoints(sets)
	for i := range n {
		require.NoError(t, st.Send(subscribeReq(uint64(2*i+1), watchespb.Kind_ENDPOINTS, name(i))))
		require.NoError(t, st.Send(subscribeReq(uint64(2*i+2), watchespb.Kind_PROFILE, name(i))))
	}
	got := map[uint64]int{}
	for range 2 * n {
		r, err := recvTimeout(t, st.Recv)
		require.NoError(t, err)
		require.Nil(t, r.GetEnded())
		got[r.GetId()]++
	}
	require.Len(t, got, 2*n, "one first answer per subscription")
	waitWatchers(t, store, 2*n)

	before := srv.wakes.Load()
	store.PutEndpoints(name(7), []endpoint.Endpoint{ep("10.0.1.7:80", false)})
	r, err := recvTimeout(t, st.Recv)
	require.NoError(t, err)
	assert.Equal(t, uint64(2*7+1), r.GetId(), "the Get subscription of the Service that changed")
	assert.NotNil(t, r.GetUpdate().GetAdd())
	r, err = recvTimeout(t, st.Recv)
	require.NoError(t, err)
	assert.Equal(t, uint64(2*7+1), r.GetId())
	assert.NotNil(t, r.GetUpdate().GetRemove())
	// The profile of an address-less name does not depend on its
	// endpoints: one wake-up, the Get subscription's.
	assert.Equal(t, int64(1), srv.wakes.Load()-before)

	// Unsubscribed: released, and a change is not answered.
	require.NoError(t, st.Send(unsubscribeReq(2*7+1)))
	waitWatchers(t, store, 2*n-1)
	store.PutEndpoints(name(7), []endpoint.Endpoint{ep("10.0.2.7:80", false)})
	store.PutEndpoints(name(8), []endpoint.Endpoint{ep("10.0.2.8:80", false)})
	r, err = recvTimeout(t, st.Recv)
	require.NoError(t, err)
	assert.Equal(t, uint64(2*8+1), r.GetId(), "the next answer is the other Service's")
}

// The subscriptions of one stream are bounded: past the bound a
// subscription ends at once with ResourceExhausted while the others go
// on; an unknown kind ends with InvalidArgument; an id already open ends
// the stream with InvalidArgument; and every subscription of a stream is
// released when it ends.
func TestWatchesBoundsAndRelease(t *testing.T) {
	store := NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{booksSvc + ":7000": {ep("10.0.0.1:7000", true)}})
	cp := serve(t, NewServer(store, WithLogger(quietLogger), WithMaxSubscriptions(2)))
	st, cancel := watchesStream(t, cp.addr)

	for id := uint64(1); id <= 2; id++ {
		require.NoError(t, st.Send(subscribeReq(id, watchespb.Kind_ENDPOINTS, booksSvc+":7000")))
		r, err := recvTimeout(t, st.Recv)
		require.NoError(t, err)
		require.Equal(t, id, r.GetId())
		require.NotNil(t, r.GetUpdate(), "answer %v", r)
	}
	require.NoError(t, st.Send(subscribeReq(3, watchespb.Kind_ENDPOINTS, booksSvc+":7000")))
	r, err := recvTimeout(t, st.Recv)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), r.GetId())
	assert.Equal(t, uint32(codes.ResourceExhausted), r.GetEnded().GetCode(), "answer %v", r)

	require.NoError(t, st.Send(subscribeReq(4, watchespb.Kind(99), booksSvc+":7000")))
	r, err = recvTimeout(t, st.Recv)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), r.GetId())
	assert.Equal(t, uint32(codes.InvalidArgument), r.GetEnded().GetCode(), "answer %v", r)

	// Room again after an unsubscribe.
	require.NoError(t, st.Send(unsubscribeReq(1)))
	require.NoError(t, st.Send(subscribeReq(5, watchespb.Kind_ENDPOINTS, booksSvc+":7000")))
	r, err = recvTimeout(t, st.Recv)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), r.GetId())
	assert.NotNil(t, r.GetUpdate(), "answer %v", r)
	waitWatchers(t, store, 2)

	// The client goes away: every subscription is released.
	cancel()
	waitWatchers(t, store, 0)

	st2, _ := watchesStream(t, cp.addr)
	require.NoError(t, st2.Send(subscribeReq(1, watchespb.Kind_ENDPOINTS, booksSvc+":7000")))
	_, err = recvTimeout(t, st2.Recv)
	require.NoError(t, err)
	require.NoError(t, st2.Send(subscribeReq(1, watchespb.Kind_ENDPOINTS, booksSvc+":7000")))
	_, err = recvTimeout(t, st2.Recv)
	assert.Equal(t, codes.InvalidArgument, statusCode(err), "an id open twice: %v", err)
	waitWatchers(t, store, 0)
}

// Shutdown ends the Watches streams with Unavailable, as it does the
// Linkerd streams, and waits for their goroutines.
func TestWatchesShutdown(t *testing.T) {
	store := NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{booksSvc + ":7000": {ep("10.0.0.1:7000", true)}})
	srv := NewServer(store, WithLogger(quietLogger))
	cp := serve(t, srv)
	st, _ := watchesStream(t, cp.addr)
	require.NoError(t, st.Send(subscribeReq(1, watchespb.Kind_ENDPOINTS, booksSvc+":7000")))
	_, err := recvTimeout(t, st.Recv)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))
	_, err = recvTimeout(t, st.Recv)
	assert.Equal(t, codes.Unavailable, statusCode(err))
	waitWatchers(t, store, 0)
}

func cmpDiff(want, got proto.Message) string { return cmp.Diff(want, got, protocmp.Transform()) }

func statusCode(err error) codes.Code { return status.Code(err) }

func statusMessage(err error) string { return status.Convert(err).Message() }
