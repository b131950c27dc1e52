package controlplane

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"

	"github.com/inmesh/inmesh/balancer/endpoint"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
)

// The Get streams of one authority share the updates of each change of its
// endpoint set and their encoding: the streams that make the same change
// get the very same messages, computed once; each stream still gets
// exactly its own change: one that joined late gets the whole set, a
// stream that compresses (gzip, whose encoding is not shared) and a
// Watches subscription get the same answers as the others.
func TestEndpointUpdatesShared(t *testing.T) {
	const authority = booksSvc + ":7000"
	store := NewStore()
	store.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.1:7000", true)})
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	// The same change, asked twice, is the same messages.
	eps, _ := store.endpointSet(authority)
	first, v1, _ := store.endpointUpdates(authority, 0, nil)
	again, v2, _ := store.endpointUpdates(authority, 0, nil)
	require.Len(t, first, 1)
	assert.Equal(t, v1, v2)
	assert.Same(t, first[0].Message, again[0].Message, "computed once")
	assert.Same(t, first[0].enc, again[0].enc, "encoded once")
	none, _, _ := store.endpointUpdates(authority, v1, eps)
	assert.Empty(t, none, "a stream at the current version has nothing to send")

	plain := rawClient(t, cp.addr)
	gz, err := grpc.NewClient(cp.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name)))
	require.NoError(t, err)
	defer gz.Close()
	type stream = grpc.ServerStreamingClient[pb.Update]
	open := func(api pb.DestinationClient) stream {
		st, err := api.Get(ctx, &pb.GetDestination{Path: authority})
		require.NoError(t, err)
		return st
	}
	streams := []stream{open(pb.NewDestinationClient(gz))}
	for range 8 {
		streams = append(streams, open(plain))
	}
	mux, _ := watchesStream(t, cp.addr)
	require.NoError(t, mux.Send(subscribeReq(1, watchespb.Kind_ENDPOINTS, authority)))
	muxRecv := func() (*pb.Update, error) {
		r, err := recvTimeout(t, mux.Recv)
		if err != nil {
			return nil, err
		}
		if r.GetUpdate() == nil {
			return nil, fmt.Errorf("got %v, want an update", r)
		}
		return r.GetUpdate(), nil
	}

	// expect checks the next update of every stream (and of the
	// subscription): an add of add, or a remove of remove.
	expect := func(what string, sts []stream, withMux bool, add, remove []string) {
		t.Helper()
		check := func(who string, u *pb.Update, err error) {
			t.Helper()
			require.NoError(t, err, "%s: %s", what, who)
			var got []string
			for _, a := range u.GetAdd().GetAddrs() {
				got = append(got, protoAddr(a.GetAddr()).String())
			}
			for _, a := range u.GetRemove().GetAddrs() {
				got = append(got, protoAddr(a).String())
			}
			if add != nil {
				assert.ElementsMatch(t, add, got, "%s: %s: added", what, who)
				assert.Equal(t, "books", u.GetAdd().GetMetricLabels()["service"], "%s: %s", what, who)
			} else {
				assert.ElementsMatch(t, remove, got, "%s: %s: removed", what, who)
				assert.NotNil(t, u.GetRemove(), "%s: %s", what, who)
			}
		}
		for i, st := range sts {
			u, err := recvTimeout(t, st.Recv)
			check(fmt.Sprintf("stream %d", i), u, err)
		}
		if withMux {
			u, err := muxRecv()
			check("the Watches subscription", u, err)
		}
	}
	expect("the first answer", streams, true, []string{"10.0.0.1:7000"}, nil)
	waitWatchers(t, store, len(streams)+1)

	store.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.1:7000", true), ep("10.0.0.2:7000", true)})
	expect("an endpoint added", streams, true, []string{"10.0.0.2:7000"}, nil)

	late := open(plain)
	expect("a stream that joined late", []stream{late}, false, []string{"10.0.0.1:7000", "10.0.0.2:7000"}, nil)
	streams = append(streams, late)

	store.PutEndpoints(authority, []endpoint.Endpoint{ep("10.0.0.2:7000", true)})
	expect("an endpoint removed", streams, true, nil, []string{"10.0.0.1:7000"})
}
