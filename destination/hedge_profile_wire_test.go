package destination_test

import (
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/hedgepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A ServiceProfile route's hedging travels in field 1001 of the Destination
// API's Route (which Linkerd's proxies skip) and comes back as it went; a
// route without it has no field 1001, as a Linkerd control plane sends it.
func TestProfileHedgeWireRoundTrip(t *testing.T) {
	fixed := &hedge.Policy{Delay: 20 * time.Millisecond, MaxExtraLoad: 0.02}
	learnt := &hedge.Policy{Percentile: 99.5, Idempotent: true}
	get := profiles.Method("GET")
	budget := profiles.DefaultRetryBudget()
	p := &profiles.Profile{FullyQualifiedName: "books.default.svc.cluster.local", RetryBudget: &budget, Routes: []profiles.Route{
		{Condition: get, Labels: map[string]string{"route": "fixed"}, Hedge: fixed},
		{Condition: get, Labels: map[string]string{"route": "learnt"}, Retryable: true, Hedge: learnt},
		{Condition: get, Labels: map[string]string{"route": "none"}},
	}}
	m := destination.ProfileToProto(p)
	assert.True(t, hasField(t, marshal(t, m.GetRoutes()[0]), 1001), "field 1001 carries the hedge")
	assert.False(t, hasField(t, marshal(t, m.GetRoutes()[2]), 1001), "no hedge, no field")
	back, dropped := destination.ProfileFromProto(m)
	require.Empty(t, dropped)
	require.Len(t, back.Routes, 3)
	assert.Equal(t, fixed, back.Routes[0].Hedge)
	assert.Equal(t, learnt, back.Routes[1].Hedge)
	assert.True(t, back.Routes[1].Retryable)
	assert.Nil(t, back.Routes[2].Hedge)
	table, err := profiles.Compile(back, profiles.Options{})
	require.NoError(t, err)
	assert.Empty(t, table.Dropped())
}

// A profile route's hedge out of range is left out, naming the route's
// field: the route stays, without hedging.
func TestProfileHedgeWireInvalid(t *testing.T) {
	cond := destination.ProfileToProto(&profiles.Profile{Routes: []profiles.Route{{Condition: profiles.Method("GET")}}}).GetRoutes()[0].GetCondition()
	for _, tc := range []struct {
		name string
		h    *hedgepb.Hedge
		want string
	}{
		{"no delay", &hedgepb.Hedge{Idempotent: true}, "routes[0].hedge.delay: required"},
		{"negative delay", &hedgepb.Hedge{Delay: &hedgepb.Hedge_Fixed{Fixed: durationpb.New(-time.Second)}}, "routes[0].hedge.fixed"},
		{"percentile 0", &hedgepb.Hedge{Delay: &hedgepb.Hedge_Percentile{Percentile: 0}}, "routes[0].hedge.percentile"},
		{"share past one", &hedgepb.Hedge{Delay: &hedgepb.Hedge_Percentile{Percentile: 90}, MaxExtraLoad: 1.5}, "routes[0].hedge: maxExtraLoad"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, dropped := destination.ProfileFromProto(&pb.DestinationProfile{Routes: []*pb.Route{{Condition: cond, Hedge: tc.h}}})
			require.Len(t, dropped, 1)
			assert.Equal(t, "routes[0].hedge", dropped[0].Field)
			assert.ErrorContains(t, dropped[0].Err, tc.want)
			require.Len(t, p.Routes, 1)
			assert.Nil(t, p.Routes[0].Hedge)
		})
	}
}
