package meshgrpc_test

import (
	"errors"
	"io"
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
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/inmesh/inmesh/profiles"
)

// streamsApp answers StreamingOutputCall with one message per
// ResponseParameters, each after its interval, and then with fail (nil:
// OK).
type streamsApp struct {
	testgrpc.UnimplementedTestServiceServer
	fail error
}

func (a *streamsApp) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	for _, p := range req.GetResponseParameters() {
		select {
		case <-time.After(time.Duration(p.GetIntervalUs()) * time.Microsecond):
		case <-s.Context().Done():
			return s.Context().Err()
		}
		if err := s.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	return a.fail
}

// profileAndPolicyChannel dials books, served by a, whose ServiceProfile
// routes StreamingOutputCall with a 500ms timeout and whose GRPCRoute
// "streams" routes the same method with a 200ms request timeout: the
// profile is the one that applies.
func profileAndPolicyChannel(t *testing.T, a *streamsApp) (testgrpc.TestServiceClient, *testutil.Metrics) {
	t.Helper()
	sps, err := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  routes:
  - name: StreamingOutputCall
    condition: {method: POST, pathRegex: /grpc\.testing\.TestService/StreamingOutputCall}
    timeout: 500ms
`))
	require.NoError(t, err)
	store := controlplane.NewStore()
	store.SetServiceProfiles(sps)
	manifests(t, store, booksService+timeoutRoute(`{timeout.linkerd.io/request: 200ms}`))
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: serveTestService(t, a)}}})
	m := testutil.NewMetrics(t)
	return dial(t, serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider)), m
}

// streamTo runs a StreamingOutputCall with one message per interval and
// returns the messages it received and the status it ended with.
func streamTo(t *testing.T, c testgrpc.TestServiceClient, intervals ...time.Duration) (int, error) {
	t.Helper()
	params := make([]*testgrpc.ResponseParameters, len(intervals))
	for i, d := range intervals {
		params[i] = &testgrpc.ResponseParameters{IntervalUs: int32(d.Microseconds())}
	}
	s, err := c.StreamingOutputCall(callCtx(t), &testgrpc.StreamingOutputCallRequest{ResponseParameters: params})
	require.NoError(t, err)
	for n := 0; ; n++ {
		if _, err := s.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return n, err
		}
	}
}

// A ServiceProfile's route applies to a stream as to every HTTP/2 request
// of Linkerd's proxy (linkerd2-proxy
// linkerd/app/outbound/src/http/logical/profile.rs, RouteParams): the
// first stream of a new channel is counted once, at its end, in route_*
// and route_actual_* with its grpc-status class, and not in the GRPCRoute's
// outbound_grpc_route_* series, since a profile with routes wins over the
// policy (should_override_policy).
func TestServiceProfileRouteCountsStreams(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fail      error
		intervals []time.Duration
		wantCode  codes.Code
		wantClass string
		wantGRPC  string
	}{
		{name: "ok", intervals: []time.Duration{0, 0}, wantCode: codes.OK, wantClass: "success", wantGRPC: "0"},
		{name: "unavailable before any message", fail: status.Error(codes.Unavailable, "down"),
			wantCode: codes.Unavailable, wantClass: "failure", wantGRPC: "14"},
		{name: "unavailable after a message", fail: status.Error(codes.Unavailable, "down"), intervals: []time.Duration{0},
			wantCode: codes.Unavailable, wantClass: "failure", wantGRPC: "14"},
		{name: "invalid argument is no failure", fail: status.Error(codes.InvalidArgument, "bad"),
			wantCode: codes.InvalidArgument, wantClass: "success", wantGRPC: "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, m := profileAndPolicyChannel(t, &streamsApp{fail: tc.fail})
			n, err := streamTo(t, c, tc.intervals...)
			require.Equal(t, tc.wantCode, status.Code(err), "%v", err)
			assert.Equal(t, len(tc.intervals), n, "messages")
			route := []string{`direction="outbound"`, `dst="` + books + `"`, `rt_route="StreamingOutputCall"`}
			assert.Equal(t, "1", m.Value(t, "route_request_total", route...))
			for _, name := range []string{"route_response_total", "route_actual_response_total"} {
				assert.Equal(t, "1", m.Value(t, name, append(route, `classification="`+tc.wantClass+`"`, `grpc_status="`+tc.wantGRPC+`"`)...), name)
				assert.Len(t, m.Lines(t, name, route...), 1, "%s: one series, the stream's end", name)
			}
			assert.Empty(t, m.Lines(t, "outbound_grpc_route_request_statuses_total", `route_name="streams"`), "the GRPCRoute does not apply")
		})
	}
}

// A ServiceProfile route's timeout bounds a stream's wait for its response
// headers, as Linkerd's proxy bounds the response future of a profile
// route (linkerd2-proxy linkerd/proxy/http/src/timeout.rs, NewTimeout,
// under RouteParams in linkerd/app/outbound/src/http/logical/profile.rs),
// not its body: a stream without headers within it ends DEADLINE_EXCEEDED
// and is counted a timeout; one that answered in time runs past it. The
// GRPCRoute's shorter request timeout does not apply.
func TestServiceProfileRouteTimeoutBoundsStreamHeaders(t *testing.T) {
	for _, tc := range []struct {
		name      string
		intervals []time.Duration
		wantCode  codes.Code
		wantMsg   string
		wantN     int
		wantLabel []string
	}{
		{name: "no headers within the timeout", intervals: []time.Duration{testutil.Timeout / 2},
			wantCode: codes.DeadlineExceeded, wantMsg: "request timed out after 500ms",
			wantLabel: []string{`classification="failure"`, `grpc_status=""`, `error="timeout"`}},
		{name: "headers within the timeout, then a stream past it", intervals: []time.Duration{0, time.Second},
			wantCode: codes.OK, wantN: 2,
			wantLabel: []string{`classification="success"`, `grpc_status="0"`, `error=""`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, m := profileAndPolicyChannel(t, &streamsApp{})
			start := time.Now()
			n, err := streamTo(t, c, tc.intervals...)
			took := time.Since(start)
			require.Equal(t, tc.wantCode, status.Code(err), "%v", err)
			if tc.wantMsg != "" {
				assert.Equal(t, tc.wantMsg, status.Convert(err).Message())
				assert.GreaterOrEqual(t, took, 500*time.Millisecond)
				assert.Less(t, took, testutil.Timeout/2, "the route's timeout, not the server, ended it")
			}
			assert.Equal(t, tc.wantN, n, "messages")
			route := []string{`direction="outbound"`, `dst="` + books + `"`, `rt_route="StreamingOutputCall"`}
			for _, name := range []string{"route_response_total", "route_actual_response_total"} {
				assert.Equal(t, "1", m.Value(t, name, append(route, tc.wantLabel...)...), name)
			}
		})
	}
}
