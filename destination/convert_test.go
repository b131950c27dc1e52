package destination_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"

	"github.com/google/go-cmp/cmp"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Every field of the ServiceProfile CRD, as a Linkerd controller would
// translate it.

func TestServiceProfileToProto(t *testing.T) {
	sps, err := profiles.ParseServiceProfiles([]byte(testutil.FullProfile))
	require.NoError(t, err)
	require.Len(t, sps, 1)
	got := destination.ProfileToProto(sps[0].ProfileFor(7000))

	method := func(m string) *pb.RequestMatch {
		return &pb.RequestMatch{Match: &pb.RequestMatch_Method{Method: destination.MethodToProto(m)}}
	}
	path := func(re string) *pb.RequestMatch {
		return &pb.RequestMatch{Match: &pb.RequestMatch_Path{Path: &pb.PathMatch{Regex: re}}}
	}
	status := func(lo, hi uint32) *pb.ResponseMatch {
		return &pb.ResponseMatch{Match: &pb.ResponseMatch_Status{Status: &pb.HttpStatusRange{Min: lo, Max: hi}}}
	}
	want := &pb.DestinationProfile{
		FullyQualifiedName: "books.default.svc.cluster.local",
		Routes: []*pb.Route{
			{
				Condition: &pb.RequestMatch{Match: &pb.RequestMatch_All{All: &pb.RequestMatch_Seq{Matches: []*pb.RequestMatch{
					method("GET"), path(`/books/\d+`),
				}}}},
				ResponseClasses: []*pb.ResponseClass{
					{Condition: status(533, 533)},
					{Condition: &pb.ResponseMatch{Match: &pb.ResponseMatch_All{All: &pb.ResponseMatch_Seq{Matches: []*pb.ResponseMatch{
						status(500, 599),
						{Match: &pb.ResponseMatch_Not{Not: status(503, 0)}},
					}}}}, IsFailure: true},
					{Condition: &pb.ResponseMatch{Match: &pb.ResponseMatch_Any{Any: &pb.ResponseMatch_Seq{Matches: []*pb.ResponseMatch{
						status(0, 429),
					}}}}, IsFailure: true},
				},
				MetricsLabels: map[string]string{"route": "GET /books/{id}"},
				IsRetryable:   true,
				Timeout:       durationpb.New(300 * time.Millisecond),
			},
			{
				Condition:     &pb.RequestMatch{Match: &pb.RequestMatch_All{All: &pb.RequestMatch_Seq{Matches: []*pb.RequestMatch{}}}},
				MetricsLabels: map[string]string{"route": "everything else"},
			},
			{
				Condition: &pb.RequestMatch{Match: &pb.RequestMatch_All{All: &pb.RequestMatch_Seq{Matches: []*pb.RequestMatch{
					{Match: &pb.RequestMatch_Any{Any: &pb.RequestMatch_Seq{Matches: []*pb.RequestMatch{method("POST"), method("PURGE")}}}},
					{Match: &pb.RequestMatch_Not{Not: path("/admin/.*")}},
				}}}},
				MetricsLabels: map[string]string{"route": "POST or PUT"},
			},
		},
		RetryBudget: &pb.RetryBudget{RetryRatio: 0.25, MinRetriesPerSecond: 7, Ttl: durationpb.New(15 * time.Second)},
		DstOverrides: []*pb.WeightedDst{
			{Authority: "books-v1.default.svc.cluster.local:7000", Weight: 10000},
			{Authority: "books-v2.default.svc.cluster.local:7000", Weight: 5000},
		},
	}
	assert.Empty(t, cmp.Diff(want, got, protocmp.Transform()))
	assert.True(t, destination.ProfileToProto(sps[0].ProfileFor(5432)).GetOpaqueProtocol())
	assert.True(t, destination.ProfileToProto(sps[0].ProfileFor(3306)).GetOpaqueProtocol())

	// And back: the client sees what the YAML said.
	back, err := destination.ProfileFromProto(got)
	require.NoError(t, err)
	assert.Equal(t, sps[0].ProfileFor(7000), back)
}

func TestProfileFromProtoErrors(t *testing.T) {
	tests := []struct {
		name string
		m    *pb.DestinationProfile
		want string
	}{
		{"route without condition", &pb.DestinationProfile{Routes: []*pb.Route{{}}}, "routes[0].condition: required"},
		{"empty match", &pb.DestinationProfile{Routes: []*pb.Route{{Condition: &pb.RequestMatch{}}}}, "routes[0].condition: no match set"},
		{"nested empty match", &pb.DestinationProfile{Routes: []*pb.Route{{Condition: path0()}, {Condition: &pb.RequestMatch{Match: &pb.RequestMatch_All{All: &pb.RequestMatch_Seq{Matches: []*pb.RequestMatch{{}}}}}}}}, "routes[1].condition.all.matches[0]: no match set"},
		{"method unset", &pb.DestinationProfile{Routes: []*pb.Route{{Condition: &pb.RequestMatch{Match: &pb.RequestMatch_Method{Method: &pb.HttpMethod{}}}}}}, "routes[0].condition.method: no method set"},
		{"class without condition", &pb.DestinationProfile{Routes: []*pb.Route{{Condition: path0(), ResponseClasses: []*pb.ResponseClass{{}}}}}, "routes[0].response_classes[0].condition: required"},
		{"negative timeout", &pb.DestinationProfile{Routes: []*pb.Route{{Condition: path0(), Timeout: durationpb.New(-time.Second)}}}, "routes[0].timeout: negative duration"},
		{"bad ttl", &pb.DestinationProfile{RetryBudget: &pb.RetryBudget{Ttl: &durationpb.Duration{Seconds: 1, Nanos: 2e9}}}, "retry_budget.ttl:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := destination.ProfileFromProto(tt.m)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func path0() *pb.RequestMatch {
	return &pb.RequestMatch{Match: &pb.RequestMatch_Path{Path: &pb.PathMatch{Regex: "/"}}}
}

func TestEndpointRoundTrip(t *testing.T) {
	e := endpoint.Endpoint{
		Addr: netip.MustParseAddrPort("10.0.0.7:4143"), Weight: 2500,
		Labels:   map[string]string{"pod": "books-0", "zone": "a"},
		Identity: "books.default.serviceaccount.identity.linkerd.cluster.local", ServerName: "books.default",
		H2: true, OpaqueTransportPort: 4143, AuthorityOverride: "books.default.svc.cluster.local:7000",
	}
	back, err := destination.EndpointFromProto(destination.EndpointToProto(e), nil, "addr")
	require.NoError(t, err)
	assert.Equal(t, e, back)

	// Set labels sit under the endpoint's own; zero weight means the default.
	w := destination.EndpointToProto(endpoint.Endpoint{Addr: e.Addr, Labels: map[string]string{"zone": "b"}})
	back, err = destination.EndpointFromProto(w, map[string]string{"zone": "a", "ns": "default"}, "addr")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"zone": "b", "ns": "default"}, back.Labels)
	assert.Equal(t, uint32(endpoint.DefaultWeight), back.Weight)

	uri := &pb.WeightedAddr{Addr: destination.AddrToProto(e.Addr), TlsIdentity: &pb.TlsIdentity{
		Strategy: &pb.TlsIdentity_UriLikeIdentity_{UriLikeIdentity: &pb.TlsIdentity_UriLikeIdentity{Uri: "spiffe://td/ns/default/sa/books"}},
	}, ProtocolHint: &pb.ProtocolHint{Protocol: &pb.ProtocolHint_Opaque_{Opaque: &pb.ProtocolHint_Opaque{}}}}
	back, err = destination.EndpointFromProto(uri, nil, "addr")
	require.NoError(t, err)
	assert.Equal(t, "spiffe://td/ns/default/sa/books", back.Identity)
	assert.True(t, back.Opaque)

	// A URI identity goes out as one, with its server name.
	e = endpoint.Endpoint{Addr: e.Addr, Weight: endpoint.DefaultWeight, Identity: "spiffe://td/ns/default/sa/books", ServerName: "books.external"}
	w = destination.EndpointToProto(e)
	assert.Equal(t, "spiffe://td/ns/default/sa/books", w.GetTlsIdentity().GetUriLikeIdentity().GetUri())
	back, err = destination.EndpointFromProto(w, nil, "addr")
	require.NoError(t, err)
	assert.Equal(t, e, back)
}

func BenchmarkApplyAdd1000(b *testing.B) {
	add := &pb.WeightedAddrSet{MetricLabels: map[string]string{"namespace": "default", "service": "books"}}
	for i := range 1000 {
		add.Addrs = append(add.Addrs, destination.EndpointToProto(endpoint.Endpoint{
			Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 8080), Weight: endpoint.DefaultWeight,
			Labels: map[string]string{"pod": fmt.Sprintf("books-%d", i)}, H2: true,
			Identity: "books.default.serviceaccount.identity.linkerd.cluster.local",
		}))
	}
	msg := &pb.Update{Update: &pb.Update_Add{Add: add}}
	c := destination.NewClient(nil, destination.WithLogger(quietLogger))
	b.ReportAllocs()
	for b.Loop() {
		apply := destination.EndpointSession(c, "books.default.svc.cluster.local:8080")
		if u, ok := apply(msg); !ok || len(u.Set.Endpoints) != 1000 {
			b.Fatal("not applied")
		}
	}
}

// BenchmarkProfileFromProto50Routes measures converting a 50-route profile.
func BenchmarkProfileFromProto50Routes(b *testing.B) {
	sp := &profiles.ServiceProfile{Name: "books.default.svc.cluster.local", RetryBudget: profiles.DefaultRetryBudget()}
	for i := range 50 {
		sp.Routes = append(sp.Routes, profiles.Route{
			Condition: profiles.MatchAll{profiles.Method("GET"), profiles.PathRegex(fmt.Sprintf(`/api/v1/r%d/[^/]+`, i))},
			ResponseClasses: []profiles.ResponseClass{
				{Condition: profiles.StatusRange{Min: 500, Max: 599}, IsFailure: true},
			},
			Labels:    map[string]string{"route": fmt.Sprintf("GET /api/v1/r%d/{id}", i)},
			Retryable: i%2 == 0, Timeout: time.Second,
		})
	}
	m := destination.ProfileToProto(sp.ProfileFor(80))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := destination.ProfileFromProto(m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStoreUpdateToClient measures a Store change travelling to a
// watching client over a real gRPC connection on loopback.
func BenchmarkStoreUpdateToClient(b *testing.B) {
	store := controlplane.NewStore()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	srv := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quietLogger)).Register(srv)
	go srv.Serve(lis)
	defer srv.Stop()
	c, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quietLogger))
	require.NoError(b, err)
	defer c.Close()
	got := make(chan string, 16)
	stop, err := c.Watch(context.Background(), books+":7000", func(u profiles.Update) {
		if u.Profile != nil && len(u.Profile.Routes) > 0 {
			got <- u.Profile.Routes[0].Labels["route"]
		}
	})
	require.NoError(b, err)
	defer stop()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		name := strconv.Itoa(i)
		store.PutServiceProfile(serviceProfile(books, name))
		for r := range got {
			if r == name {
				break
			}
		}
	}
}

// One Get stream's updates applied in turn, as Linkerd's controller sends
// them: the set after each, sorted by address. An address added again
// takes its latest weight; a remove of an address not in the set, or an
// add with nothing valid in it, keeps the set; no_endpoints empties it.
func TestEndpointSessionApplies(t *testing.T) {
	ep := func(last byte, weight uint32) *pb.WeightedAddr {
		return destination.EndpointToProto(endpoint.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, last}), 80), Weight: weight})
	}
	add := func(eps ...*pb.WeightedAddr) *pb.Update {
		return &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{Addrs: eps}}}
	}
	remove := func(lasts ...byte) *pb.Update {
		r := &pb.AddrSet{}
		for _, l := range lasts {
			r.Addrs = append(r.Addrs, destination.AddrToProto(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, l}), 80)))
		}
		return &pb.Update{Update: &pb.Update_Remove{Remove: r}}
	}
	bad := &pb.WeightedAddr{}
	c := destination.NewClient(nil, destination.WithLogger(quietLogger))
	apply := destination.EndpointSession(c, "books.default.svc.cluster.local:80")
	for _, step := range []struct {
		msg    *pb.Update
		exists bool
		want   string // address:weight, in order
	}{
		{add(ep(3, 1), ep(1, 1)), true, "10.0.0.1:80:1 10.0.0.3:80:1"},
		{add(ep(2, 1), ep(3, 5)), true, "10.0.0.1:80:1 10.0.0.2:80:1 10.0.0.3:80:5"},
		{add(ep(4, 1), ep(4, 7)), true, "10.0.0.1:80:1 10.0.0.2:80:1 10.0.0.3:80:5 10.0.0.4:80:7"},
		{remove(2, 9), true, "10.0.0.1:80:1 10.0.0.3:80:5 10.0.0.4:80:7"},
		{add(bad), true, "10.0.0.1:80:1 10.0.0.3:80:5 10.0.0.4:80:7"},
		{remove(1, 3, 4), true, ""},
		{add(ep(5, 1)), true, "10.0.0.5:80:1"},
		{&pb.Update{Update: &pb.Update_NoEndpoints{NoEndpoints: &pb.NoEndpoints{Exists: false}}}, false, ""},
		{add(ep(6, 2)), true, "10.0.0.6:80:2"},
	} {
		u, ok := apply(step.msg)
		require.True(t, ok)
		var got []string
		for _, e := range u.Set.Endpoints {
			got = append(got, fmt.Sprintf("%s:%d", e.Addr, e.Weight))
		}
		assert.Equal(t, step.want, strings.Join(got, " "), "after %v", step.msg)
		assert.Equal(t, step.exists, u.Set.Exists)
		assert.NotNil(t, u.Set.Endpoints, "an empty set is empty, not nil")
	}
}
