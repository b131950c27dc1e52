package meshgrpc_test

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
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
)

// streamsApp answers StreamingOutputCall with one message per
// ResponseParameters, each after its interval, and then with fail (nil:
// OK).
type streamsApp struct {
	testgrpc.UnimplementedTestServiceServer
	fail error
	// started, when not nil, is told of each call as it begins.
	started chan struct{}
}

func (a *streamsApp) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	if a.started != nil {
		a.started <- struct{}{}
	}
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
	store := controlplane.NewStore()
	setProfiles(t, store, `
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  routes:
  - name: StreamingOutputCall
    condition: {method: POST, pathRegex: /grpc\.testing\.TestService/StreamingOutputCall}
    timeout: 500ms
`)
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

// givenUpChannel dials books, served by a, whose ServiceProfile routes
// StreamingOutputCall with the route's further YAML lines, extra.
func givenUpChannel(t *testing.T, a *streamsApp, extra string) (testgrpc.TestServiceClient, *testutil.Metrics) {
	t.Helper()
	store := controlplane.NewStore()
	setProfiles(t, store, `
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  routes:
  - name: StreamingOutputCall
    condition: {method: POST, pathRegex: /grpc\.testing\.TestService/StreamingOutputCall}
`+extra)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: serveTestService(t, a)}}})
	m := testutil.NewMetrics(t)
	return dial(t, serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider)), m
}

// The first stream of a new channel, on a ServiceProfile route, is given
// up by its caller after its first response message: route_* and
// route_actual_* count it once, as its response stood, ended without
// trailers, as Linkerd's proxy counts a response body dropped
// (linkerd2-proxy linkerd/http/metrics/src/requests/service.rs,
// ResponseBody's drop, classified by Eos::eos(None) of
// linkerd/app/core/src/classify.rs): without response classes a gRPC
// call without a status, success with grpc_status="2"
// (grpc_response_trailer_missing there); with classes none of which
// matches 200, the HTTP status 200, success without a grpc_status; with a
// class that matches 200, that class. A stream given up before its
// response headers is counted nowhere, as a unary call given up is not.
func TestServiceProfileRouteCountsStreamGivenUp(t *testing.T) {
	const failure200 = `    responseClasses:
    - condition: {status: {min: 200, max: 299}}
      isFailure: true
`
	const only5xx = `    responseClasses:
    - condition: {status: {min: 500, max: 599}}
      isFailure: true
`
	for _, tc := range []struct {
		name  string
		extra string
		// beforeHeaders: given up before the server answers at all.
		beforeHeaders bool
		// byContext: the caller cancels and never reads again.
		byContext bool
		wantLabel []string // nil: no response counted
	}{
		{name: "no response classes",
			wantLabel: []string{`classification="success"`, `grpc_status="2"`, `error=""`, `status_code="200"`}},
		{name: "no response classes, by its context alone", byContext: true,
			wantLabel: []string{`classification="success"`, `grpc_status="2"`, `error=""`, `status_code="200"`}},
		{name: "a route timeout", extra: "    timeout: 10s\n",
			wantLabel: []string{`classification="success"`, `grpc_status="2"`, `error=""`, `status_code="200"`}},
		{name: "classes none of which matches 200", extra: only5xx,
			wantLabel: []string{`classification="success"`, `grpc_status=""`, `error=""`, `status_code="200"`}},
		{name: "a class that makes 200 a failure", extra: failure200,
			wantLabel: []string{`classification="failure"`, `grpc_status=""`, `error=""`, `status_code="200"`}},
		{name: "before its response headers", beforeHeaders: true},
		{name: "before its response headers, with a route timeout", extra: "    timeout: 10s\n", beforeHeaders: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &streamsApp{started: make(chan struct{}, 1)}
			c, m := givenUpChannel(t, a, tc.extra)
			ctx, cancel := context.WithCancel(callCtx(t))
			defer cancel()
			// The server answers at once, then waits for the stream's end;
			// or, before its headers, waits at once.
			params := []*testgrpc.ResponseParameters{{}, {IntervalUs: int32(testutil.Timeout.Microseconds())}}
			if tc.beforeHeaders {
				params = params[1:]
			}
			s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{ResponseParameters: params})
			require.NoError(t, err)
			select {
			case <-a.started:
			case <-time.After(testutil.Timeout):
				t.Fatal("the call did not reach the server")
			}
			if !tc.beforeHeaders {
				_, err = s.Recv()
				require.NoError(t, err, "the first message")
			}
			cancel()
			route := []string{`direction="outbound"`, `dst="` + books + `"`, `rt_route="StreamingOutputCall"`}
			if !tc.byContext {
				_, err = s.Recv()
				require.Equal(t, codes.Canceled, status.Code(err), "%v", err)
			}
			assert.Equal(t, "1", m.Value(t, "route_request_total", route...))
			for _, name := range []string{"route_response_total", "route_actual_response_total"} {
				if tc.wantLabel == nil {
					assert.Empty(t, m.Lines(t, name, route...), "%s: no response", name)
					continue
				}
				// Given up by its context alone, the stream is counted as
				// grpc-go sees the cancellation.
				require.Eventually(t, func() bool { return len(m.Lines(t, name, route...)) > 0 },
					testutil.Timeout, 5*time.Millisecond, "%s: the stream is counted", name)
				assert.Equal(t, "1", m.Value(t, name, append(route, tc.wantLabel...)...), "%s: %v", name, m.Lines(t, name, route...))
				assert.Len(t, m.Lines(t, name, route...), 1, "%s: one series", name)
			}
		})
	}
}

// A call on a retryable ServiceProfile route asks the profile's retry
// budget as its answer comes, as Linkerd's proxy does
// (linkerd2-proxy linkerd/app/outbound/src/http/retry.rs,
// RetryPolicy::retry, called by linkerd/retry/src/lib.rs's tower Retry
// with each answer): a failure withdraws its retry, and one the budget
// refuses deposits nothing; an answer that is not retried deposits; a
// call given up before its answer is never asked and deposits nothing. A
// stream is taken into the retry policy too (its request body is not
// known to pass the 64 KiB the proxy buffers) and its answer deposits.
// Under a budget of one retry per deposit and no minimum, what came
// before a failing unary call decides whether it is retried. Before,
// every call and stream deposited as it started: a call's own deposit
// paid for its retry, and a call or stream given up before its answer
// paid for another's.
func TestServiceProfileBudgetDepositsAsAnswersCome(t *testing.T) {
	type step int
	const (
		answered    step = iota // a unary call answered OK
		failed                  // a unary call answered UNAVAILABLE once
		givenUp                 // a unary call given up before its answer
		stream                  // a stream answered with a message
		streamGiven             // a stream given up before its response headers
	)
	for _, tc := range []struct {
		name      string
		before    []step
		wantCode  codes.Code
		wantCalls int64 // attempts of the failing call
	}{
		{name: "a fresh budget: the first failure is not retried", wantCode: codes.Unavailable, wantCalls: 1},
		{name: "an answer pays for a retry", before: []step{answered}, wantCode: codes.OK, wantCalls: 2},
		{name: "a failure the budget refused pays nothing", before: []step{failed}, wantCode: codes.Unavailable, wantCalls: 1},
		{name: "a call given up before its answer pays nothing", before: []step{givenUp}, wantCode: codes.Unavailable, wantCalls: 1},
		{name: "a stream answered pays for a retry", before: []step{stream}, wantCode: codes.OK, wantCalls: 2},
		{name: "a stream given up before its headers pays nothing", before: []step{streamGiven}, wantCode: codes.Unavailable, wantCalls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fail, stall atomic.Bool
			var unary atomic.Int64
			reached := make(chan struct{}, 1)
			a := startApp(t, &app{handle: func(ctx context.Context, _ int64) error {
				if m, _ := grpc.Method(ctx); m == "/grpc.testing.TestService/EmptyCall" {
					unary.Add(1)
				}
				if stall.Load() {
					reached <- struct{}{}
					<-ctx.Done()
					return ctx.Err()
				}
				if fail.CompareAndSwap(true, false) {
					return status.Error(codes.Unavailable, "once")
				}
				return nil
			}}, nil)
			store := controlplane.NewStore()
			setProfiles(t, store, `
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  retryBudget: {retryRatio: 1, minRetriesPerSecond: 0, ttl: 60s}
  routes:
  - name: EmptyCall
    condition: {method: POST, pathRegex: /grpc\.testing\.TestService/EmptyCall}
    isRetryable: true
  - name: StreamingOutputCall
    condition: {method: POST, pathRegex: /grpc\.testing\.TestService/StreamingOutputCall}
    isRetryable: true
`)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
			c := dial(t, serveStore(t, store))
			// giveUp sends a call or stream that stalls on the app,
			// and gives it up once the app has it.
			giveUp := func(do func(ctx context.Context) error) {
				stall.Store(true)
				defer stall.Store(false)
				ctx, cancel := context.WithCancel(callCtx(t))
				defer cancel()
				go func() {
					select {
					case <-reached:
					case <-ctx.Done():
					}
					cancel()
				}()
				require.Equal(t, codes.Canceled, status.Code(do(ctx)))
			}
			for _, st := range tc.before {
				switch st {
				case answered:
					_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
					require.NoError(t, err)
				case failed:
					fail.Store(true)
					_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
					require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
				case givenUp:
					giveUp(func(ctx context.Context) error {
						_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
						return err
					})
				case stream:
					n, err := streamTo(t, c)
					require.NoError(t, err)
					require.Equal(t, 1, n, "the stream's one message")
				case streamGiven:
					giveUp(func(ctx context.Context) error {
						s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
						require.NoError(t, err)
						_, err = s.Recv()
						return err
					})
				}
			}
			before := unary.Load()
			fail.Store(true)
			_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
			assert.Equal(t, tc.wantCode, status.Code(err), "%v", err)
			assert.Equal(t, tc.wantCalls, unary.Load()-before, "attempts of the failing call")
		})
	}
}
