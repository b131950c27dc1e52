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
	"github.com/inmesh/inmesh/proxyapi/hedgepb"
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
	back, dropped := destination.ProfileFromProto(got)
	require.Empty(t, dropped)
	assert.Equal(t, sps[0].ProfileFor(7000), back)
}

// A part of a profile message that does not convert is left out and the
// rest applies, as linkerd2-proxy converts it
// (linkerd/service-profiles/src/proto.rs, named in each row). Each row's
// message ends with the route "rest"; want is the profile converted.
func TestProfileFromProtoLeavesOutWhatDoesNotConvert(t *testing.T) {
	rest := &pb.Route{Condition: path0(), MetricsLabels: map[string]string{"route": "rest"}}
	restRoute := profiles.Route{Condition: profiles.PathRegex("/"), Labels: map[string]string{"route": "rest"}}
	named := func(name string, cond *pb.RequestMatch) *pb.Route {
		return &pb.Route{Condition: cond, MetricsLabels: map[string]string{"route": name}}
	}
	noVariant := &pb.RequestMatch{}
	all := func(ms ...*pb.RequestMatch) *pb.RequestMatch {
		return &pb.RequestMatch{Match: &pb.RequestMatch_All{All: &pb.RequestMatch_Seq{Matches: ms}}}
	}
	anyOf := func(ms ...*pb.RequestMatch) *pb.RequestMatch {
		return &pb.RequestMatch{Match: &pb.RequestMatch_Any{Any: &pb.RequestMatch_Seq{Matches: ms}}}
	}
	not := func(m *pb.RequestMatch) *pb.RequestMatch {
		return &pb.RequestMatch{Match: &pb.RequestMatch_Not{Not: m}}
	}
	get := &pb.RequestMatch{Match: &pb.RequestMatch_Method{Method: destination.MethodToProto("GET")}}
	status := func(lo, hi uint32) *pb.ResponseMatch {
		return &pb.ResponseMatch{Match: &pb.ResponseMatch_Status{Status: &pb.HttpStatusRange{Min: lo, Max: hi}}}
	}
	rspAll := func(ms ...*pb.ResponseMatch) *pb.ResponseMatch {
		return &pb.ResponseMatch{Match: &pb.ResponseMatch_All{All: &pb.ResponseMatch_Seq{Matches: ms}}}
	}
	rspAny := func(ms ...*pb.ResponseMatch) *pb.ResponseMatch {
		return &pb.ResponseMatch{Match: &pb.ResponseMatch_Any{Any: &pb.ResponseMatch_Seq{Matches: ms}}}
	}
	withClasses := func(cs ...*pb.ResponseClass) *pb.Route {
		r := named("r", get)
		r.ResponseClasses = cs
		return r
	}
	route := func(name string, cond profiles.RequestMatch) profiles.Route {
		return profiles.Route{Condition: cond, Labels: map[string]string{"route": name}}
	}
	fiveXX := &pb.ResponseClass{Condition: status(500, 599), IsFailure: true}
	fiveXXClass := profiles.ResponseClass{Condition: profiles.StatusRange{Min: 500, Max: 599}, IsFailure: true}
	tests := []struct {
		name    string
		m       *pb.DestinationProfile
		want    *profiles.Profile
		dropped []string // "field: error"
	}{
		{
			name:    "convert_route: a route without a condition",
			m:       &pb.DestinationProfile{Routes: []*pb.Route{{MetricsLabels: map[string]string{"route": "none"}}, rest}},
			want:    &profiles.Profile{Routes: []profiles.Route{restRoute}},
			dropped: []string{"routes[0]: routes[0].condition: required"},
		},
		{
			name:    "convert_req_match: a match with no variant",
			m:       &pb.DestinationProfile{Routes: []*pb.Route{named("empty", noVariant), rest}},
			want:    &profiles.Profile{Routes: []profiles.Route{restRoute}},
			dropped: []string{"routes[0]: routes[0].condition: no match set"},
		},
		{
			name:    "convert_req_match: a method not set",
			m:       &pb.DestinationProfile{Routes: []*pb.Route{named("m", &pb.RequestMatch{Match: &pb.RequestMatch_Method{Method: &pb.HttpMethod{}}}), rest}},
			want:    &profiles.Profile{Routes: []profiles.Route{restRoute}},
			dropped: []string{"routes[0]: routes[0].condition.method: no method set"},
		},
		{
			name:    "convert_req_match All: a condition is dropped, the all keeps the others",
			m:       &pb.DestinationProfile{Routes: []*pb.Route{named("a", all(noVariant, get)), rest}},
			want:    &profiles.Profile{Routes: []profiles.Route{route("a", profiles.MatchAll{profiles.Method("GET")}), restRoute}},
			dropped: []string{"routes[0].condition.all.matches[0]: routes[0].condition.all.matches[0]: no match set"},
		},
		{
			name:    "convert_req_match Any: a condition is dropped, the any keeps the others",
			m:       &pb.DestinationProfile{Routes: []*pb.Route{named("a", anyOf(get, noVariant)), rest}},
			want:    &profiles.Profile{Routes: []profiles.Route{route("a", profiles.MatchAny{profiles.Method("GET")}), restRoute}},
			dropped: []string{"routes[0].condition.any.matches[1]: routes[0].condition.any.matches[1]: no match set"},
		},
		{
			name:    "convert_req_match Not: a not of a match that does not convert does not convert",
			m:       &pb.DestinationProfile{Routes: []*pb.Route{named("n", all(get, not(noVariant))), named("top", not(noVariant)), rest}},
			want:    &profiles.Profile{Routes: []profiles.Route{route("n", profiles.MatchAll{profiles.Method("GET")}), restRoute}},
			dropped: []string{"routes[0].condition.all.matches[1]: routes[0].condition.all.matches[1].not: no match set", "routes[1]: routes[1].condition.not: no match set"},
		},
		{
			// The controller sends `timeout: -500ms` (time.ParseDuration
			// accepts it) as Duration{nanos: -500000000}.
			name: "set_route_timeout: a negative timeout is only warned about",
			m: &pb.DestinationProfile{Routes: []*pb.Route{func() *pb.Route {
				r := named("t", get)
				r.Timeout = &durationpb.Duration{Nanos: -500000000}
				return r
			}(), rest}},
			want:    &profiles.Profile{Routes: []profiles.Route{route("t", profiles.Method("GET")), restRoute}},
			dropped: []string{"routes[0].timeout: routes[0].timeout: negative duration -500ms"},
		},
		{
			name: "a timeout is read as prost reads it, normalized",
			m: &pb.DestinationProfile{Routes: []*pb.Route{func() *pb.Route {
				r := named("t", get)
				r.Timeout = &durationpb.Duration{Seconds: 1, Nanos: -500000000}
				return r
			}()}},
			want: &profiles.Profile{Routes: []profiles.Route{func() profiles.Route {
				r := route("t", profiles.Method("GET"))
				r.Timeout = 500 * time.Millisecond
				return r
			}()}},
		},
		{
			name:    "convert_rsp_class: a class without a condition",
			m:       &pb.DestinationProfile{Routes: []*pb.Route{withClasses(&pb.ResponseClass{}, fiveXX)}},
			want:    &profiles.Profile{Routes: []profiles.Route{{Condition: profiles.Method("GET"), Labels: map[string]string{"route": "r"}, ResponseClasses: []profiles.ResponseClass{fiveXXClass}}}},
			dropped: []string{"routes[0].response_classes[0]: routes[0].response_classes[0].condition: required"},
		},
		{
			// The controller sends `all: []` as an empty All.
			name:    "convert_rsp_match All: all: []",
			m:       &pb.DestinationProfile{Routes: []*pb.Route{withClasses(&pb.ResponseClass{Condition: rspAll()}, fiveXX)}},
			want:    &profiles.Profile{Routes: []profiles.Route{{Condition: profiles.Method("GET"), Labels: map[string]string{"route": "r"}, ResponseClasses: []profiles.ResponseClass{fiveXXClass}}}},
			dropped: []string{"routes[0].response_classes[0]: routes[0].response_classes[0].condition.all: empty"},
		},
		{
			name: "convert_rsp_match Any: a condition is dropped, the any keeps the others; left empty it is dropped",
			m: &pb.DestinationProfile{Routes: []*pb.Route{withClasses(
				&pb.ResponseClass{Condition: rspAny(&pb.ResponseMatch{}, status(503, 503))},
				&pb.ResponseClass{Condition: rspAny(&pb.ResponseMatch{})},
			)}},
			want: &profiles.Profile{Routes: []profiles.Route{{Condition: profiles.Method("GET"), Labels: map[string]string{"route": "r"}, ResponseClasses: []profiles.ResponseClass{
				{Condition: profiles.ResponseAny{profiles.StatusRange{Min: 503, Max: 503}}},
			}}}},
			dropped: []string{
				"routes[0].response_classes[0].condition.any.matches[0]: routes[0].response_classes[0].condition.any.matches[0]: no match set",
				"routes[0].response_classes[1].condition.any.matches[0]: routes[0].response_classes[1].condition.any.matches[0]: no match set",
				"routes[0].response_classes[1]: routes[0].response_classes[1].condition.any: empty",
			},
		},
		{
			// The controller sends `status: {}` as {min: 0, max: 0}: the
			// status range is kept as sent; profiles.Compile drops it.
			name: "status ranges are converted as sent",
			m:    &pb.DestinationProfile{Routes: []*pb.Route{withClasses(&pb.ResponseClass{Condition: status(0, 0)})}},
			want: &profiles.Profile{Routes: []profiles.Route{{Condition: profiles.Method("GET"), Labels: map[string]string{"route": "r"}, ResponseClasses: []profiles.ResponseClass{
				{Condition: profiles.StatusRange{}},
			}}}},
		},
		{
			name: "a route's invalid hedge: the route does not hedge",
			m: &pb.DestinationProfile{Routes: []*pb.Route{func() *pb.Route {
				r := named("h", get)
				r.Hedge = &hedgepb.Hedge{Delay: &hedgepb.Hedge_Percentile{Percentile: 0}}
				return r
			}()}},
			want:    &profiles.Profile{Routes: []profiles.Route{route("h", profiles.Method("GET"))}},
			dropped: []string{"routes[0].hedge: routes[0].hedge.percentile: 0 is not between 0 and 100"},
		},
		{
			// The controller sends `ttl: -10s` (time.ParseDuration accepts
			// it) as Duration{seconds: -10}.
			name:    "convert_retry_budget: ttl negative",
			m:       &pb.DestinationProfile{RetryBudget: &pb.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, Ttl: &durationpb.Duration{Seconds: -10}}, Routes: []*pb.Route{rest}},
			want:    &profiles.Profile{Routes: []profiles.Route{restRoute}},
			dropped: []string{"retry_budget: retry_budget.ttl: negative duration"},
		},
		{
			name:    "convert_retry_budget: ttl negative in its nanos",
			m:       &pb.DestinationProfile{RetryBudget: &pb.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, Ttl: &durationpb.Duration{Seconds: 5, Nanos: -1}}},
			want:    &profiles.Profile{},
			dropped: []string{"retry_budget: retry_budget.ttl: negative duration"},
		},
		{
			name:    "convert_retry_budget: nanos past 1s",
			m:       &pb.DestinationProfile{RetryBudget: &pb.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, Ttl: &durationpb.Duration{Seconds: 1, Nanos: 2e9}}},
			want:    &profiles.Profile{},
			dropped: []string{"retry_budget: retry_budget.ttl: nanos 2000000000 exceed 1s"},
		},
		{
			name: "a budget Linkerd's proxy refuses otherwise is kept, for the router to disable",
			m:    &pb.DestinationProfile{RetryBudget: &pb.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, Ttl: &durationpb.Duration{Seconds: 100}}},
			want: &profiles.Profile{RetryBudget: &profiles.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, TTL: 100 * time.Second}},
		},
		{
			name:    "an endpoint that does not convert",
			m:       &pb.DestinationProfile{Endpoint: &pb.WeightedAddr{Addr: &pb.TcpAddress{Port: 70000}}, Routes: []*pb.Route{rest}},
			want:    &profiles.Profile{Routes: []profiles.Route{restRoute}},
			dropped: []string{"endpoint: endpoint.addr: port 70000 is out of range"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, dropped := destination.ProfileFromProto(tt.m)
			assert.Equal(t, tt.want, got)
			var ds []string
			for _, d := range dropped {
				ds = append(ds, d.Field+": "+d.Err.Error())
			}
			assert.Equal(t, tt.dropped, ds)
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
		if _, dropped := destination.ProfileFromProto(m); dropped != nil {
			b.Fatal(dropped)
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
// takes its latest weight; a remove of an address not in the set keeps the
// rest; no_endpoints empties it. As in Linkerd's proxy, a message that
// changes nothing is no update: a Remove before the stream's first update
// (linkerd/proxy/resolve/src/recover.rs), an Add or a Remove with no
// address that converts (linkerd/proxy/api-resolve/src/resolve.rs
// mk_update).
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
		update bool
		exists bool
		want   string // address:weight, in order
	}{
		{remove(1), false, true, ""},
		{add(), false, true, ""},
		{add(bad), false, true, ""},
		{add(ep(3, 1), ep(1, 1)), true, true, "10.0.0.1:80:1 10.0.0.3:80:1"},
		{add(ep(2, 1), ep(3, 5)), true, true, "10.0.0.1:80:1 10.0.0.2:80:1 10.0.0.3:80:5"},
		{add(ep(4, 1), ep(4, 7)), true, true, "10.0.0.1:80:1 10.0.0.2:80:1 10.0.0.3:80:5 10.0.0.4:80:7"},
		{remove(2, 9), true, true, "10.0.0.1:80:1 10.0.0.3:80:5 10.0.0.4:80:7"},
		{add(bad), false, true, ""},
		{remove(), false, true, ""},
		{remove(1, 3, 4), true, true, ""},
		{add(ep(5, 1)), true, true, "10.0.0.5:80:1"},
		{&pb.Update{Update: &pb.Update_NoEndpoints{NoEndpoints: &pb.NoEndpoints{Exists: false}}}, true, false, ""},
		{add(), false, true, ""},
		{add(ep(6, 2)), true, true, "10.0.0.6:80:2"},
	} {
		u, ok := apply(step.msg)
		require.Equal(t, step.update, ok, "an update for %v", step.msg)
		if !ok {
			continue
		}
		var got []string
		for _, e := range u.Set.Endpoints {
			got = append(got, fmt.Sprintf("%s:%d", e.Addr, e.Weight))
		}
		assert.Equal(t, step.want, strings.Join(got, " "), "after %v", step.msg)
		assert.Equal(t, step.exists, u.Set.Exists)
		assert.NotNil(t, u.Set.Endpoints, "an empty set is empty, not nil")
	}
}
