package router_test

// Linkerd's proxy converts a DestinationProfile part by part
// (linkerd2-proxy linkerd/service-profiles/src/proto.rs convert_profile):
// a route whose condition does not convert is dropped (filter_map), a
// condition of an all or an any that does not convert is dropped from it,
// a response class that does not convert is dropped, a retry budget whose
// ttl is negative is dropped (retries disabled), a negative route timeout
// is ignored with a warning; everything else of the profile applies. The
// messages below are what linkerd2's destination controller sends
// (controller/api/destination/profile_translator.go): it does not compile
// pathRegex, it passes `status: {}` and `all: []` through, and it encodes
// a negative retryBudget.ttl or route timeout (both pass its validation,
// time.ParseDuration) as a negative protobuf Duration.

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/router"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

const partialAuthority = "profiles.test.svc.cluster.local:80"

var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// oneProfile is a Destination service that answers every GetProfile with
// one message and then holds the stream open, as linkerd2's controller
// does.
type oneProfile struct {
	pb.UnimplementedDestinationServer
	msg *pb.DestinationProfile
}

func (s oneProfile) GetProfile(_ *pb.GetDestination, stream grpc.ServerStreamingServer[pb.DestinationProfile]) error {
	if err := stream.Send(s.msg); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (oneProfile) Get(_ *pb.GetDestination, stream grpc.ServerStreamingServer[pb.Update]) error {
	<-stream.Context().Done()
	return nil
}

func pathMatch(re string) *pb.RequestMatch {
	return &pb.RequestMatch{Match: &pb.RequestMatch_Path{Path: &pb.PathMatch{Regex: re}}}
}

func allOf(ms ...*pb.RequestMatch) *pb.RequestMatch {
	return &pb.RequestMatch{Match: &pb.RequestMatch_All{All: &pb.RequestMatch_Seq{Matches: ms}}}
}

func getMatch() *pb.RequestMatch {
	return &pb.RequestMatch{Match: &pb.RequestMatch_Method{Method: &pb.HttpMethod{Type: &pb.HttpMethod_Registered_{Registered: pb.HttpMethod_GET}}}}
}

func statusClass(min, max uint32, failure bool) *pb.ResponseClass {
	return &pb.ResponseClass{IsFailure: failure, Condition: &pb.ResponseMatch{Match: &pb.ResponseMatch_Status{Status: &pb.HttpStatusRange{Min: min, Max: max}}}}
}

// retryRoute is the route under test of Linkerd's profiles.rs: /0.5,
// retryable, as the controller writes `pathRegex: /0.5`.
func retryRoute() *pb.Route {
	return &pb.Route{Condition: pathMatch("/0.5"), MetricsLabels: map[string]string{"route": "retry"}, IsRetryable: true, ResponseClasses: []*pb.ResponseClass{}}
}

func defaultBudget() *pb.RetryBudget {
	return &pb.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, Ttl: &durationpb.Duration{Seconds: 10}}
}

// runAgainst serves msg as the control plane and sends GET /0.5 through a
// router fed by a destination.Client, to a server that answers 533 then
// 200 "retried" (Linkerd's profiles.rs /0.5). It returns the status and
// the route the router explains for GET /0.5 afterwards. The client and
// the router log to logs.
func runAgainst(t *testing.T, msg *pb.DestinationProfile, logs *testutil.LogLines) (int, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	pb.RegisterDestinationServer(g, oneProfile{msg: msg})
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	dst, err := destination.Dial(lis.Addr().String(), destination.WithLogger(logs.Logger()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })

	var n atomic.Int64
	up := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/load-profile":
			w.WriteHeader(http.StatusCreated)
		case "/0.5":
			if n.Add(1)%2 == 1 {
				w.WriteHeader(533)
				return
			}
			_, _ = io.WriteString(w, "retried")
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	base := testutil.NewTransport(t, testutil.H1)
	upAddr := up.Listener.Addr().String()
	base.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, upAddr) // no DNS: every name is the test server
	}
	// The first request waits for the first answer of the control plane
	// (or 2s when no answer can be used), as Linkerd's tests wait on
	// /load-profile.
	r := router.New(router.WithProfiles(dst), router.WithLogger(logs.Logger()), router.WithDiscoveryWait(2*time.Second))
	t.Cleanup(r.Close)
	client := &http.Client{Transport: r.Transport(base)}
	get := func(path string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "GET", "http://"+partialAuthority+path, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status, _ := get("/load-profile")
	require.Equal(t, http.StatusCreated, status)
	status, body := get("/0.5")
	route := r.Explain(mustReq(t, "/0.5")).Route
	t.Logf("GET /0.5: %d %q (route explained: %q)", status, body, route)
	return status, route
}

func mustReq(t *testing.T, path string) *http.Request {
	req, err := http.NewRequest("GET", "http://"+partialAuthority+path, nil)
	require.NoError(t, err)
	return req
}

// In each case one part of the profile is something Linkerd's proxy drops
// on its own; the retryable /0.5 route still applies there, so GET /0.5 is
// retried into a 200.
func TestProfilePartThatDoesNotConvertLeavesTheRest(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  *pb.DestinationProfile
		// logged is in a warning that names what was left out, with its
		// route: by the router (compiling) or by the destination client
		// (converting).
		logged []string
	}{
		{
			// Control: the same profile with nothing bad in it.
			name: "control: a valid profile",
			msg: &pb.DestinationProfile{
				FullyQualifiedName: "profiles.test.svc.cluster.local",
				RetryBudget:        defaultBudget(),
				Routes:             []*pb.Route{{Condition: allOf(getMatch(), pathMatch("/books/[^/]+")), MetricsLabels: map[string]string{"route": "books"}}, retryRoute()},
			},
		},
		{
			// proto.rs convert_route: `orig.condition.and_then(convert_req_match)?`
			// drops the route whose regex does not compile; the
			// controller never compiles pathRegex, and sends a condition
			// of pathRegex alone as that match alone.
			name: "convert_route: another route's pathRegex does not compile",
			msg: &pb.DestinationProfile{
				FullyQualifiedName: "profiles.test.svc.cluster.local",
				RetryBudget:        defaultBudget(),
				Routes: []*pb.Route{
					{Condition: pathMatch("/0.(5"), MetricsLabels: map[string]string{"route": "typo"}},
					retryRoute(),
				},
			},
			logged: []string{"dropped a part of the profile that does not compile", "route=typo", "dropped=routes[0]", "bad regex"},
		},
		{
			// convert_req_match Method: a method that is not one
			// (http::Method::from_bytes) drops its route; the controller
			// sends any method it does not know as an unregistered one.
			name: "convert_route: another route's method is not a method",
			msg: &pb.DestinationProfile{
				FullyQualifiedName: "profiles.test.svc.cluster.local",
				RetryBudget:        defaultBudget(),
				Routes: []*pb.Route{
					{Condition: &pb.RequestMatch{Match: &pb.RequestMatch_Method{Method: &pb.HttpMethod{Type: &pb.HttpMethod_Unregistered{Unregistered: "G T"}}}}, MetricsLabels: map[string]string{"route": "typo"}},
					retryRoute(),
				},
			},
			logged: []string{"dropped a part of the profile that does not compile", "route=typo", "dropped=routes[0]", "is not an HTTP method"},
		},
		{
			// convert_req_match All: children filter_map'd; the route
			// stays, matching by its other children.
			name: "convert_req_match All: a bad regex inside the route's own all",
			msg: &pb.DestinationProfile{
				FullyQualifiedName: "profiles.test.svc.cluster.local",
				RetryBudget:        defaultBudget(),
				Routes: []*pb.Route{{
					Condition: allOf(pathMatch("/0.5"), pathMatch("[")), MetricsLabels: map[string]string{"route": "retry"}, IsRetryable: true,
				}},
			},
			logged: []string{"dropped a part of the profile that does not compile", "route=retry", "dropped=routes[0].condition.all[1]", "bad regex"},
		},
		{
			// convert_rsp_class: StatusCode::from_u16(0) fails, the
			// class is dropped; the controller sends `status: {}` as
			// {min: 0, max: 0} (ValidateResponseMatch accepts it).
			name: "convert_rsp_match Status: a response class of status {}",
			msg: &pb.DestinationProfile{
				FullyQualifiedName: "profiles.test.svc.cluster.local",
				RetryBudget:        defaultBudget(),
				Routes: []*pb.Route{func() *pb.Route {
					r := retryRoute()
					r.ResponseClasses = []*pb.ResponseClass{statusClass(0, 0, false), statusClass(500, 599, true)}
					return r
				}()},
			},
			logged: []string{"dropped a part of the profile that does not compile", "route=retry", "dropped=routes[0].responseClasses[0]", "min and max are both unset"},
		},
		{
			// convert_rsp_match All: an empty sequence returns None, the
			// class is dropped; the controller sends `all: []` as an
			// empty All.
			name: "convert_rsp_match All: a response class of all: []",
			msg: &pb.DestinationProfile{
				FullyQualifiedName: "profiles.test.svc.cluster.local",
				RetryBudget:        defaultBudget(),
				Routes: []*pb.Route{func() *pb.Route {
					r := retryRoute()
					r.ResponseClasses = []*pb.ResponseClass{{IsFailure: false, Condition: &pb.ResponseMatch{Match: &pb.ResponseMatch_All{All: &pb.ResponseMatch_Seq{}}}}}
					return r
				}()},
			},
			logged: []string{"dropped a part of a profile update that does not convert", "route=retry", "dropped=routes[0].response_classes[0]", "all: empty"},
		},
		{
			// convert_route: `set_route_timeout(&mut route,
			// timeout.try_into())` only warns on a negative timeout; the
			// route (and its retries) stay. The controller sends
			// `timeout: -500ms` as Duration{nanos: -500000000}.
			name: "set_route_timeout: a negative route timeout",
			msg: &pb.DestinationProfile{
				FullyQualifiedName: "profiles.test.svc.cluster.local",
				RetryBudget:        defaultBudget(),
				Routes: []*pb.Route{func() *pb.Route {
					r := retryRoute()
					r.Timeout = &durationpb.Duration{Nanos: -500000000}
					return r
				}()},
			},
			logged: []string{"dropped a part of a profile update that does not convert", "route=retry", "dropped=routes[0].timeout", "negative duration -500ms"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &testutil.LogLines{}
			status, route := runAgainst(t, tc.msg, logs)
			assert.Equal(t, http.StatusOK, status, "Linkerd's proxy keeps the retryable route and retries the 533")
			assert.Equal(t, "retry", route)
			if tc.logged == nil {
				assert.Zero(t, logs.Count("WARN"), logs.String())
				return
			}
			assert.Equal(t, 1, logs.Count(append([]string{"level=WARN"}, tc.logged...)...), "one warning names what was left out:\n%s", logs.String())
		})
	}
}

// A condition of an all that does not convert is dropped from the all,
// which then matches by its other conditions (proto.rs convert_req_match:
// `ms.matches.into_iter().filter_map(convert_req_match)`): the controller
// sends `condition: {method: GET, pathRegex: "/books/("}` as all[GET,
// path], so in Linkerd's proxy that route takes every GET, GET /0.5 too,
// ahead of the retryable route.
func TestProfileAllWithoutItsBadRegexMatchesByTheRest(t *testing.T) {
	msg := &pb.DestinationProfile{
		FullyQualifiedName: "profiles.test.svc.cluster.local",
		RetryBudget:        defaultBudget(),
		Routes: []*pb.Route{
			{Condition: allOf(getMatch(), pathMatch("/books/(")), MetricsLabels: map[string]string{"route": "typo"}},
			retryRoute(),
		},
	}
	status, route := runAgainst(t, msg, &testutil.LogLines{})
	assert.Equal(t, "typo", route, "the all of GET alone takes GET /0.5")
	assert.Equal(t, 533, status, "route typo is not retryable")
}

// `retryBudget.ttl: -10s` passes linkerd2's validation
// (time.ParseDuration) and is sent as Duration{seconds: -10}. Linkerd's
// proxy (proto.rs convert_retry_budget: "retry_budget ttl negative") drops
// only the budget: the routes apply, without retries. Here the route must
// still be chosen.
func TestProfileNegativeBudgetTTLKeepsTheRoutes(t *testing.T) {
	msg := &pb.DestinationProfile{
		FullyQualifiedName: "profiles.test.svc.cluster.local",
		RetryBudget:        &pb.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, Ttl: &durationpb.Duration{Seconds: -10}},
		Routes:             []*pb.Route{retryRoute()},
	}
	status, route := runAgainst(t, msg, &testutil.LogLines{})
	assert.Equal(t, 533, status, "no budget: no retry")
	assert.Equal(t, "retry", route, "the profile's route applies (Linkerd drops only the budget)")
}

// A profile delivered again and again with the same part that does not
// compile is applied each time, and the part is named once per log
// interval, with its route and field.
func TestProfileDroppedPartIsLoggedOncePerInterval(t *testing.T) {
	logs := &testutil.LogLines{}
	src := profiles.NewStaticSource(nil)
	r := router.New(router.WithProfiles(src), router.WithLogger(logs.Logger()), router.WithLocalAuthorities(partialAuthority))
	t.Cleanup(r.Close)
	for i := range 20 {
		p := &profiles.Profile{Routes: []profiles.Route{
			{Condition: profiles.PathRegex("/books/("), Labels: map[string]string{"route": "typo"}},
			{Condition: profiles.PathRegex("/books/.*"), Labels: map[string]string{"route": "books"}},
		}}
		src.Set(partialAuthority, p)
		require.Eventually(t, func() bool {
			table := r.ProfileTable(partialAuthority)
			return table != nil && table.Profile() == p
		}, testutil.Timeout, time.Millisecond, "delivery %d applied", i)
		assert.Equal(t, "books", r.Explain(mustReq(t, "/books/1")).Route, "delivery %d: the rest applies", i)
	}
	assert.Equal(t, 1, logs.Count("level=WARN", "dropped a part of the profile that does not compile", "route=typo", "dropped=routes[0]", "bad regex"), logs.String())
	assert.Equal(t, 1, logs.Count("level=WARN"), logs.String())
}
