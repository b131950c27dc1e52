package meshgrpc_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// hedgeRoutes are two GRPCRoutes of books that hedge every method, both
// idempotent with a share of 50% extra load: "hedged" after 20ms,
// "patient" (calls with x-route: patient) after 10s, and "plain"
// (x-route: plain) that does not hedge.
const hedgeRoutes = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: hedged
  namespace: default
  annotations: {hedge.inmesh.io/delay: 20ms, hedge.inmesh.io/idempotent: "true", hedge.inmesh.io/max-extra-load: "50%"}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - backendRefs: [{name: books, port: 7000}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: patient
  namespace: default
  annotations: {hedge.inmesh.io/delay: 10s, hedge.inmesh.io/idempotent: "true", hedge.inmesh.io/max-extra-load: "50%"}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{headers: [{name: x-route, value: patient}]}]
    backendRefs: [{name: books, port: 7000}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: plain
  namespace: default
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{headers: [{name: x-route, value: plain}]}]
    backendRefs: [{name: books, port: 7000}]
`

// notIdempotentRoute hedges after 20ms but is not marked idempotent.
const notIdempotentRoute = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: hedged
  namespace: default
  annotations: {hedge.inmesh.io/delay: 20ms, hedge.inmesh.io/max-extra-load: "100%"}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - backendRefs: [{name: books, port: 7000}]
`

// script is what the endpoints of a hedging test share: each call (by its
// x-call metadata) and the endpoints its attempts reached in order of
// arrival, and how an attempt answers.
type script struct {
	// behave answers attempt (0: the first of its call the client sent,
	// as hedgeChannel numbers them; 1: its hedge) at endpoint ep, whose
	// n-th call it is; nil answers OK.
	behave func(ctx context.Context, c *scriptCall, ep string, attempt int, n int64) error
	// stream, when set, answers a server-streaming attempt instead
	// (send sends one response).
	stream func(ctx context.Context, c *scriptCall, attempt int, send func() error) error

	mu        sync.Mutex
	calls     map[string]*scriptCall
	arrivals  atomic.Int64
	cancelled atomic.Int64
}

// scriptCall is one call as the endpoints saw it.
type scriptCall struct {
	eps []string
	// hedgeDone is closed when the call's second attempt has answered;
	// firstIn when its first attempt has arrived.
	hedgeDone, firstIn chan struct{}
	// received are the messages each attempt of a bidi call received.
	received [2][]string
}

func newScript() *script { return &script{calls: make(map[string]*scriptCall)} }

func (s *script) arrive(ctx context.Context, ep string) (*scriptCall, int) {
	s.arrivals.Add(1)
	md, _ := metadata.FromIncomingContext(ctx)
	id := ""
	if v := md.Get("x-call"); len(v) > 0 {
		id = v[0]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls[id]
	if c == nil {
		c = &scriptCall{hedgeDone: make(chan struct{}), firstIn: make(chan struct{})}
		s.calls[id] = c
	}
	c.eps = append(c.eps, ep)
	// The attempt as the client sent it, not as it arrived: on a loaded
	// machine a hedge sent after its delay may arrive before the first
	// attempt does.
	n := len(c.eps) - 1
	if v := md.Get("x-attempt"); len(v) > 0 {
		if a, err := strconv.Atoi(v[0]); err == nil {
			n = a
		}
	}
	select {
	case <-c.firstIn:
	default:
		if n == 0 {
			close(c.firstIn)
		}
	}
	return c, n
}

// afterFirst answers then once the call's first attempt has reached its
// endpoint: a hedge that must not win before the first is there to be
// cancelled (on a loaded machine the first may arrive after the hedge).
func afterFirst(ctx context.Context, c *scriptCall, then error) error {
	select {
	case <-c.firstIn:
		return then
	case <-ctx.Done():
		return ctx.Err()
	}
}

// call returns the endpoints call id reached.
func (s *script) call(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.calls[id]; c != nil {
		return slices.Clone(c.eps)
	}
	return nil
}

// stall waits for the attempt to be cancelled, and counts it.
func (s *script) stall(ctx context.Context) error {
	<-ctx.Done()
	s.cancelled.Add(1)
	return status.FromContextError(ctx.Err()).Err()
}

// hedgeApp is an endpoint of a hedging test.
type hedgeApp struct {
	testgrpc.UnimplementedTestServiceServer
	name  string
	sc    *script
	calls atomic.Int64
}

func (a *hedgeApp) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	c, attempt := a.sc.arrive(ctx, a.name)
	n := a.calls.Add(1)
	var err error
	if a.sc.behave != nil {
		err = a.sc.behave(ctx, c, a.name, attempt, n)
	}
	if attempt == 1 {
		close(c.hedgeDone)
	}
	if err != nil {
		return nil, err
	}
	return &testgrpc.Empty{}, nil
}

func (a *hedgeApp) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	c, attempt := a.sc.arrive(s.Context(), a.name)
	n := a.calls.Add(1)
	send := func() error {
		return s.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: []byte(a.name)}})
	}
	if a.sc.stream != nil {
		return a.sc.stream(s.Context(), c, attempt, send)
	}
	if a.sc.behave != nil {
		if err := a.sc.behave(s.Context(), c, a.name, attempt, n); err != nil {
			return err
		}
	}
	return send()
}

// FullDuplexCall echoes each message, except that the first attempt of a
// call only reads (it never answers) until it is cancelled.
func (a *hedgeApp) FullDuplexCall(s grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	c, attempt := a.sc.arrive(s.Context(), a.name)
	for {
		m, err := s.Recv()
		if err != nil {
			if attempt == 0 && s.Context().Err() != nil {
				a.sc.cancelled.Add(1)
			}
			return nil
		}
		a.sc.mu.Lock()
		c.received[min(attempt, 1)] = append(c.received[min(attempt, 1)], string(m.GetPayload().GetBody()))
		a.sc.mu.Unlock()
		if attempt == 0 {
			continue
		}
		if err := s.Send(&testgrpc.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}

// startHedgeApps serves n endpoints sharing sc.
func startHedgeApps(t *testing.T, sc *script, n int) ([]*hedgeApp, []endpoint.Endpoint) {
	t.Helper()
	var apps []*hedgeApp
	var eps []endpoint.Endpoint
	for i := range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		a := &hedgeApp{name: "ep" + strconv.Itoa(i), sc: sc}
		g := grpc.NewServer()
		testgrpc.RegisterTestServiceServer(g, a)
		go func() { _ = g.Serve(lis) }()
		t.Cleanup(g.Stop)
		apps = append(apps, a)
		eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(lis.Addr().String())})
	}
	return apps, eps
}

// callAs is ctx with the call's id and, unless "", the route it takes.
func callAs(ctx context.Context, id, route string) context.Context {
	ctx = metadata.AppendToOutgoingContext(ctx, "x-call", id)
	if route != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-route", route)
	}
	return ctx
}

var hedgedLabels = []string{`route_name="hedged"`, `route_kind="GRPCRoute"`}

// counter reads a counter of the hedged route, 0 when absent.
func counter(t *testing.T, m *testutil.Metrics, name string) int {
	t.Helper()
	v := m.Value(t, name, hedgedLabels...)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err)
	return n
}

// Unary hedging: of three endpoints, ep0 stalls every other call it gets
// until the call is cancelled. Every call succeeds (a stalled call could
// only end at its deadline unless a hedge answered it), each stalled
// attempt is cancelled (a hedge that stalls too, when the first attempt
// answers), no call reaches an endpoint twice, and the hedges
// stay within the route's share of extra load (50%).
func TestHedgeUnary(t *testing.T) {
	sc := newScript()
	var stalls, firstStalls atomic.Int64
	sc.behave = func(ctx context.Context, _ *scriptCall, ep string, attempt int, n int64) error {
		if ep == "ep0" && n%2 == 1 {
			stalls.Add(1)
			if attempt == 0 {
				firstStalls.Add(1)
			}
			return sc.stall(ctx)
		}
		return nil
	}
	_, eps := startHedgeApps(t, sc, 3)
	c, m := hedgeChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})
	const n = 300
	for i := range n {
		id := strconv.Itoa(i)
		_, err := c.EmptyCall(callAs(callCtx(t), id, ""), &testgrpc.Empty{})
		require.NoError(t, err, "call %d reached %v", i, sc.call(id))
		got := sc.call(id)
		assert.Len(t, slices.Compact(slices.Sorted(slices.Values(got))), len(got), "call %d: an endpoint twice: %v", i, got)
	}
	require.Positive(t, stalls.Load(), "ep0 stalled no call")
	require.Eventually(t, func() bool { return sc.cancelled.Load() == stalls.Load() }, testutil.Timeout, 10*time.Millisecond,
		"every stalled attempt is cancelled: %d of %d", sc.cancelled.Load(), stalls.Load())
	require.Eventually(t, func() bool {
		// A hedge cancelled before it reached its endpoint is counted
		// too (it was sent).
		return int64(counter(t, m, "outbound_grpc_route_hedge_requests_total")) >= sc.arrivals.Load()-n
	}, testutil.Timeout, 10*time.Millisecond, "each attempt beyond one per call is a hedge counted")
	sent := counter(t, m, "outbound_grpc_route_hedge_requests_total")
	wins := counter(t, m, "outbound_grpc_route_hedge_wins_total")
	t.Logf("%d calls: %d stalled, %d hedges sent, %d won", n, stalls.Load(), sent, wins)
	assert.GreaterOrEqual(t, int64(wins), firstStalls.Load(), "each call whose first attempt stalled answered by its hedge")
	assert.LessOrEqual(t, sent, 1+n/2, "extra load within the share (50%% of %d and the first)", n)
	assert.Equal(t, strconv.Itoa(n), m.Value(t, "outbound_grpc_route_request_statuses_total", append(hedgedLabels, `grpc_status="OK"`)...),
		"one logical call each")
}

// The first call on a fresh channel is hedged too: of two endpoints, ep0
// stalls every call; a new channel is made until ep0 has had the first
// call of one (the balancer chooses), and every first call succeeds.
func TestHedgeFirstCall(t *testing.T) {
	sc := newScript()
	sc.behave = func(ctx context.Context, _ *scriptCall, ep string, _ int, _ int64) error {
		if ep == "ep0" {
			return sc.stall(ctx)
		}
		return nil
	}
	apps, eps := startHedgeApps(t, sc, 2)
	store := controlplane.NewStore()
	manifests(t, store, booksService+hedgeRoutes)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: eps})
	dst := serveStore(t, store)
	for i := 0; apps[0].calls.Load() == 0; i++ {
		require.Less(t, i, 30, "ep0 never got a first call")
		cc, err := grpc.NewClient(booksTarget, meshgrpc.DialOptions(dst)...)
		require.NoError(t, err)
		_, err = testgrpc.NewTestServiceClient(cc).EmptyCall(callAs(callCtx(t), "first"+strconv.Itoa(i), ""), &testgrpc.Empty{})
		require.NoError(t, err, "first call of channel %d: %v", i, sc.call("first"+strconv.Itoa(i)))
		require.NoError(t, cc.Close())
	}
}

// A route that is not marked idempotent is never hedged: a call that
// reaches the stalling endpoint ends at its deadline, and no call reaches
// a second endpoint.
func TestHedgeNotIdempotent(t *testing.T) {
	sc := newScript()
	sc.behave = func(ctx context.Context, _ *scriptCall, ep string, _ int, _ int64) error {
		if ep == "ep0" {
			return sc.stall(ctx)
		}
		return nil
	}
	apps, eps := startHedgeApps(t, sc, 2)
	c, m := hedgeChannel(t, notIdempotentRoute, map[string][]endpoint.Endpoint{books: eps})
	calls := 0
	for apps[0].calls.Load() == 0 {
		require.Less(t, calls, 100, "ep0 never got a call")
		ctx, cancel := context.WithTimeout(context.Background(), testutil.ShortTimeout)
		_, err := c.EmptyCall(callAs(ctx, strconv.Itoa(calls), ""), &testgrpc.Empty{})
		cancel()
		calls++
		if err != nil {
			assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
		}
	}
	assert.Equal(t, int64(calls), sc.arrivals.Load(), "one attempt per call")
	assert.Equal(t, 0, counter(t, m, "outbound_grpc_route_hedge_requests_total"))
}

// A call whose route has one endpoint is not hedged: there is no other
// endpoint to send it to.
func TestHedgeOneEndpoint(t *testing.T) {
	sc := newScript()
	release := make(chan struct{})
	sc.behave = func(ctx context.Context, _ *scriptCall, _ string, _ int, n int64) error {
		if n == 1 {
			<-release
		}
		return nil
	}
	_, eps := startHedgeApps(t, sc, 1)
	c, m := hedgeChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})
	done := make(chan error, 1)
	go func() {
		_, err := c.EmptyCall(callAs(callCtx(t), "one", ""), &testgrpc.Empty{})
		done <- err
	}()
	require.Eventually(t, func() bool { return sc.arrivals.Load() == 1 }, testutil.Timeout, time.Millisecond)
	// Well past the route's 20ms delay, nothing else arrives.
	time.Sleep(testutil.ShortTimeout)
	close(release)
	require.NoError(t, <-done)
	assert.Equal(t, int64(1), sc.arrivals.Load())
	assert.Equal(t, 0, counter(t, m, "outbound_grpc_route_hedge_requests_total"))
}

// Streams are hedged before their response headers, never after: a
// server-streaming call whose first attempt stalls gets its answer from
// the hedge; one whose first attempt answered once and then stalls is not
// copied; a bidi call's messages sent before the hedge are replayed to it.
func TestHedgeStreams(t *testing.T) {
	t.Run("before the first response", func(t *testing.T) {
		sc := newScript()
		sc.stream = func(ctx context.Context, _ *scriptCall, attempt int, send func() error) error {
			if attempt == 0 {
				return sc.stall(ctx)
			}
			return send()
		}
		_, eps := startHedgeApps(t, sc, 3)
		c, m := hedgeChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})
		s, err := c.StreamingOutputCall(callAs(callCtx(t), "s", ""), &testgrpc.StreamingOutputCallRequest{})
		require.NoError(t, err)
		r, err := s.Recv()
		require.NoError(t, err)
		got := sc.call("s")
		require.Len(t, got, 2)
		assert.NotEqual(t, got[0], got[1], "the hedge went to another endpoint")
		assert.Equal(t, got[1], string(r.GetPayload().GetBody()), "the hedge's answer")
		_, err = s.Recv()
		assert.ErrorIs(t, err, io.EOF)
		require.Eventually(t, func() bool { return sc.cancelled.Load() == 1 }, testutil.Timeout, time.Millisecond, "the stalled attempt is cancelled")
		assert.Equal(t, 1, counter(t, m, "outbound_grpc_route_hedge_wins_total"))
	})
	t.Run("never after", func(t *testing.T) {
		sc := newScript()
		sc.stream = func(ctx context.Context, _ *scriptCall, _ int, send func() error) error {
			if err := send(); err != nil {
				return err
			}
			return sc.stall(ctx)
		}
		_, eps := startHedgeApps(t, sc, 3)
		c, m := hedgeChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})
		ctx, cancel := context.WithCancel(callCtx(t))
		s, err := c.StreamingOutputCall(callAs(ctx, "s", ""), &testgrpc.StreamingOutputCallRequest{})
		require.NoError(t, err)
		_, err = s.Recv()
		require.NoError(t, err)
		// Well past the route's 20ms delay, the stream that answered is
		// not copied.
		time.Sleep(testutil.ShortTimeout)
		cancel()
		_, err = s.Recv()
		assert.Equal(t, codes.Canceled, status.Code(err))
		assert.Len(t, sc.call("s"), 1)
		assert.Equal(t, 0, counter(t, m, "outbound_grpc_route_hedge_requests_total"))
	})
	t.Run("bidi replay", func(t *testing.T) {
		sc := newScript()
		_, eps := startHedgeApps(t, sc, 3)
		c, _ := hedgeChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})
		s, err := c.FullDuplexCall(callAs(callCtx(t), "b", ""))
		require.NoError(t, err)
		want := []string{"one", "two", "three"}
		for _, p := range want {
			require.NoError(t, s.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte(p)}}))
		}
		var got []string
		for range want {
			r, err := s.Recv()
			require.NoError(t, err)
			got = append(got, string(r.GetPayload().GetBody()))
		}
		assert.Equal(t, want, got, "the hedge echoes every message, in order")
		require.NoError(t, s.CloseSend())
		_, err = s.Recv()
		assert.ErrorIs(t, err, io.EOF)
		sc.mu.Lock()
		assert.Equal(t, want, sc.calls["b"].received[0], "the first attempt")
		assert.Equal(t, want, sc.calls["b"].received[1], "the hedge")
		sc.mu.Unlock()
		require.Eventually(t, func() bool { return sc.cancelled.Load() == 1 }, testutil.Timeout, time.Millisecond, "the first attempt is cancelled")
	})
}

// gRFC A6's hedging rules (proposal A6-client-retries.md, "Hedging
// Policy" and "Summary of Retry and Hedging Logic"), as meshgrpc applies
// them to one hedge: which answer is the call's, and whether a second
// attempt is sent. nonFatalStatusCodes are UNAVAILABLE and the route's
// retry codes. "patient" calls take the route that hedges only after 10s,
// so that a hedge they get was sent early by a rule, not by the delay.
func TestHedgeA6Rules(t *testing.T) {
	firstWaitsHedge := func(ctx context.Context, c *scriptCall, then error) error {
		select {
		case <-c.hedgeDone:
			return then
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, tc := range []struct {
		name  string
		route string
		// first and hedge answer the call's first and second attempts.
		first, hedge func(ctx context.Context, sc *script, c *scriptCall) error
		want         codes.Code
		wantMsg      string
		attempts     int
		cancelled    int64
	}{{
		name:     "OK: the answer, no hedge",
		route:    "patient",
		first:    func(context.Context, *script, *scriptCall) error { return nil },
		want:     codes.OK,
		attempts: 1,
	}, {
		name:     "fatal status before the delay: the answer, no hedge",
		route:    "patient",
		first:    func(context.Context, *script, *scriptCall) error { return status.Error(codes.InvalidArgument, "bad") },
		want:     codes.InvalidArgument,
		attempts: 1,
	}, {
		name:     "non-fatal status before the delay: the hedge goes at once",
		route:    "patient",
		first:    func(context.Context, *script, *scriptCall) error { return status.Error(codes.Unavailable, "first") },
		hedge:    func(context.Context, *script, *scriptCall) error { return nil },
		want:     codes.OK,
		attempts: 2,
	}, {
		name:      "OK of the hedge: the answer, the first cancelled",
		first:     func(ctx context.Context, sc *script, _ *scriptCall) error { return sc.stall(ctx) },
		hedge:     func(ctx context.Context, _ *script, c *scriptCall) error { return afterFirst(ctx, c, nil) },
		want:      codes.OK,
		attempts:  2,
		cancelled: 1,
	}, {
		name:  "fatal status of the hedge: the answer, the first cancelled",
		first: func(ctx context.Context, sc *script, _ *scriptCall) error { return sc.stall(ctx) },
		hedge: func(ctx context.Context, _ *script, c *scriptCall) error {
			return afterFirst(ctx, c, status.Error(codes.PermissionDenied, "no"))
		},
		want:      codes.PermissionDenied,
		attempts:  2,
		cancelled: 1,
	}, {
		name: "non-fatal status of the hedge: the first goes on",
		first: func(ctx context.Context, _ *script, c *scriptCall) error {
			return firstWaitsHedge(ctx, c, nil)
		},
		hedge:    func(context.Context, *script, *scriptCall) error { return status.Error(codes.Unavailable, "hedge") },
		want:     codes.OK,
		attempts: 2,
	}, {
		name: "every attempt fails non-fatally: the first's status",
		first: func(ctx context.Context, _ *script, c *scriptCall) error {
			return firstWaitsHedge(ctx, c, status.Error(codes.Unavailable, "first"))
		},
		hedge:    func(context.Context, *script, *scriptCall) error { return status.Error(codes.Unavailable, "hedge") },
		want:     codes.Unavailable,
		wantMsg:  "first",
		attempts: 2,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			sc := newScript()
			sc.behave = func(ctx context.Context, c *scriptCall, _ string, attempt int, _ int64) error {
				if attempt == 0 {
					return tc.first(ctx, sc, c)
				}
				require.NotNil(t, tc.hedge, "a hedge was sent")
				return tc.hedge(ctx, sc, c)
			}
			_, eps := startHedgeApps(t, sc, 3)
			c, _ := hedgeChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})
			_, err := c.EmptyCall(callAs(callCtx(t), "a6", tc.route), &testgrpc.Empty{})
			assert.Equal(t, tc.want, status.Code(err), "%v", err)
			if tc.wantMsg != "" {
				assert.Equal(t, tc.wantMsg, status.Convert(err).Message())
			}
			got := sc.call("a6")
			assert.Len(t, got, tc.attempts, "attempts: %v", got)
			if len(got) == 2 {
				assert.NotEqual(t, got[0], got[1], "the hedge went to another endpoint")
			}
			require.Eventually(t, func() bool { return sc.cancelled.Load() == tc.cancelled }, testutil.Timeout, time.Millisecond)
		})
	}

	// Streams commit at their response headers, and once a message goes
	// past the replay buffer (gRFC A6, "When Retries are Valid" and
	// "Memory Management").
	t.Run("response headers commit a stream", func(t *testing.T) {
		sc := newScript()
		sc.stream = func(ctx context.Context, _ *scriptCall, _ int, _ func() error) error {
			if err := grpc.SendHeader(ctx, metadata.Pairs("x-ep", "first")); err != nil {
				return err
			}
			return sc.stall(ctx)
		}
		_, eps := startHedgeApps(t, sc, 3)
		c, _ := hedgeChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})
		ctx, cancel := context.WithCancel(callCtx(t))
		s, err := c.StreamingOutputCall(callAs(ctx, "h", ""), &testgrpc.StreamingOutputCallRequest{})
		require.NoError(t, err)
		md, err := s.Header()
		require.NoError(t, err)
		assert.Equal(t, []string{"first"}, md.Get("x-ep"))
		time.Sleep(testutil.ShortTimeout) // well past the 20ms delay
		cancel()
		_, err = s.Recv()
		assert.Equal(t, codes.Canceled, status.Code(err))
		assert.Len(t, sc.call("h"), 1, "no hedge after the headers")
	})
	// A Trailers-Only answer is no response headers: grpc-go's Header
	// reports neither headers nor an error for it, and its status decides.
	t.Run("a stream's Trailers-Only status before the delay: non-fatal sends the hedge at once, fatal is the answer", func(t *testing.T) {
		sc := newScript()
		sc.stream = func(ctx context.Context, _ *scriptCall, attempt int, send func() error) error {
			if attempt == 0 {
				if metadata.ValueFromIncomingContext(ctx, "x-call")[0] == "fatal" {
					return status.Error(codes.InvalidArgument, "bad")
				}
				return status.Error(codes.Unavailable, "first")
			}
			return send()
		}
		_, eps := startHedgeApps(t, sc, 3)
		c, _ := hedgeChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})
		s, err := c.StreamingOutputCall(callAs(callCtx(t), "non-fatal", "patient"), &testgrpc.StreamingOutputCallRequest{})
		require.NoError(t, err)
		r, err := s.Recv()
		require.NoError(t, err, "the hedge's answer")
		got := sc.call("non-fatal")
		require.Len(t, got, 2)
		assert.NotEqual(t, got[0], got[1], "the hedge went to another endpoint")
		assert.Equal(t, got[1], string(r.GetPayload().GetBody()))
		_, err = s.Recv()
		assert.ErrorIs(t, err, io.EOF)

		s, err = c.StreamingOutputCall(callAs(callCtx(t), "fatal", "patient"), &testgrpc.StreamingOutputCallRequest{})
		require.NoError(t, err)
		_, err = s.Recv()
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		assert.Len(t, sc.call("fatal"), 1, "no hedge")
	})
	t.Run("a message past the replay buffer commits a stream", func(t *testing.T) {
		sc := newScript()
		_, eps := startHedgeApps(t, sc, 3)
		c, _ := hedgeChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})
		ctx, cancel := context.WithCancel(callCtx(t))
		s, err := c.FullDuplexCall(callAs(ctx, "big", ""))
		require.NoError(t, err)
		require.NoError(t, s.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: make([]byte, 65<<10)}}))
		time.Sleep(testutil.ShortTimeout) // well past the 20ms delay
		cancel()
		_, err = s.Recv()
		assert.Equal(t, codes.Canceled, status.Code(err))
		assert.Len(t, sc.call("big"), 1, "no hedge past the buffer")
	})
}

// The tail with and without hedging, logged: three endpoints, every 20th
// call stalls 100ms on the endpoint its first attempt reaches (the stall
// follows the call, as in examples/e2e's hedging scenario, so that the
// balancer cannot route around it). The same calls go over the "plain"
// route and the "hedged" one (20ms); the log gives each one's p50, p99
// and max, and the hedged route's extra load.
func TestHedgeTail(t *testing.T) {
	const n, every, stall = 400, 20, 100 * time.Millisecond
	sc := newScript()
	sc.behave = func(ctx context.Context, _ *scriptCall, _ string, attempt int, _ int64) error {
		md, _ := metadata.FromIncomingContext(ctx)
		if attempt == 0 && len(md.Get("x-stall")) > 0 {
			t := time.NewTimer(stall)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	_, eps := startHedgeApps(t, sc, 3)
	c, m := hedgeChannel(t, hedgeRoutes, map[string][]endpoint.Endpoint{books: eps})
	run := func(route string) []time.Duration {
		var lat []time.Duration
		for i := range n {
			ctx := callAs(callCtx(t), route+strconv.Itoa(i), route)
			if route == "" {
				ctx = callAs(callCtx(t), "hedged"+strconv.Itoa(i), "")
			}
			if i%every == every-1 {
				ctx = metadata.AppendToOutgoingContext(ctx, "x-stall", "1")
			}
			start := time.Now()
			_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
			require.NoError(t, err)
			lat = append(lat, time.Since(start))
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return lat
	}
	pct := func(lat []time.Duration, q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
	plain := run("plain")
	before := sc.arrivals.Load()
	hedged := run("")
	extra := sc.arrivals.Load() - before - n
	t.Logf("plain:  p50 %v, p99 %v, max %v", pct(plain, .5), pct(plain, .99), plain[len(plain)-1])
	t.Logf("hedged: p50 %v, p99 %v, max %v; %d hedges for %d calls (%.1f%% extra load), %d won",
		pct(hedged, .5), pct(hedged, .99), hedged[len(hedged)-1], extra, n, 100*float64(extra)/n,
		counter(t, m, "outbound_grpc_route_hedge_wins_total"))
	t.Logf("p99 ratio hedged/plain: %.2f", float64(pct(hedged, .99))/float64(pct(plain, .99)))
	assert.LessOrEqual(t, extra, int64(1+n/2), "extra load within the share")
}

// A hedged call through a traced client: the call's span has a child per
// attempt, the first (cancelled) and the hedge (marked so, answered), each
// at its own endpoint.
func TestTraceHedgedCall(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	sc := newScript()
	sc.behave = func(ctx context.Context, _ *scriptCall, _ string, attempt int, _ int64) error {
		if attempt == 0 {
			return sc.stall(ctx)
		}
		return nil
	}
	_, eps := startHedgeApps(t, sc, 3)
	store := controlplane.NewStore()
	manifests(t, store, booksService+hedgeRoutes)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: eps})
	// Attempts are tagged as the client sent them: on a loaded machine the
	// hedge may reach its endpoint before the first attempt does.
	cc, err := grpc.NewClient(booksTarget, append(meshgrpc.DialOptions(serveStore(t, store),
		meshgrpc.WithTracerProvider(tp), meshgrpc.WithDiscoveryWait(testutil.Timeout)), attemptTags()...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	c := testgrpc.NewTestServiceClient(cc)

	ctx, root := tp.Tracer("test").Start(callAs(callCtx(t), "traced", ""), "app")
	_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
	root.End()
	require.NoError(t, err)

	var call tracetest.SpanStub
	var attempts tracetest.SpanStubs
	require.Eventually(t, func() bool {
		attempts = attempts[:0]
		spans := exp.GetSpans()
		for _, s := range spans {
			if s.Parent.SpanID() == root.SpanContext().SpanID() {
				call = s
			}
		}
		for _, s := range spans {
			if s.Parent.SpanID() == call.SpanContext.SpanID() && call.SpanContext.IsValid() {
				attempts = append(attempts, s)
			}
		}
		return len(attempts) == 2
	}, testutil.Timeout, 5*time.Millisecond)
	sort.Slice(attempts, func(i, j int) bool { return attempts[i].StartTime.Before(attempts[j].StartTime) })
	assert.Equal(t, "hedged", spanAttr(call, "inmesh.route").AsString())
	assert.Equal(t, "OK", spanAttr(call, "rpc.response.status_code").AsString())
	for i, want := range []struct{ kind, code string }{{"first", "CANCELLED"}, {"hedge", "OK"}} {
		assert.Equal(t, want.kind, spanAttr(attempts[i], "inmesh.attempt.kind").AsString(), "attempt %d", i)
		assert.Equal(t, want.code, spanAttr(attempts[i], "rpc.response.status_code").AsString(), "attempt %d", i)
	}
	assert.NotEqual(t, spanAttr(attempts[0], "inmesh.endpoint").AsString(), spanAttr(attempts[1], "inmesh.endpoint").AsString())
}

// BenchmarkUnaryHedged is BenchmarkUnaryMesh on a route that hedges after
// 10s (never, here): the cost of a hedged route's bookkeeping per call
// (the second goroutine, the timer, the tried set).
func BenchmarkUnaryHedged(b *testing.B) {
	a := startApp(b, &app{}, nil)
	store := controlplane.NewStore()
	manifests(b, store, booksService+probeRoute+`
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: hedged
  namespace: default
  annotations: {hedge.inmesh.io/delay: 10s, hedge.inmesh.io/idempotent: "true"}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    backendRefs: [{name: books, port: 7000}]
`)
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
	m := testutil.NewMetrics(b)
	c := dial(b, serveStore(b, store), meshgrpc.WithMeterProvider(m.Provider))
	routed(b, c, m)
	benchUnary(b, c)
}

// attemptTags are dial options, to follow a mesh channel's, that tag each
// attempt with its number in the order the client sends them (x-attempt,
// counted per x-call), below the hedger, so that the script tells a call's
// first attempt from its hedge whichever arrives first.
func attemptTags() []grpc.DialOption {
	var mu sync.Mutex
	sent := map[string]int{}
	tag := func(ctx context.Context) context.Context {
		md, _ := metadata.FromOutgoingContext(ctx)
		id := ""
		if v := md.Get("x-call"); len(v) > 0 {
			id = v[0]
		}
		mu.Lock()
		n := sent[id]
		sent[id] = n + 1
		mu.Unlock()
		return metadata.AppendToOutgoingContext(ctx, "x-attempt", strconv.Itoa(n))
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(tag(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(tag(ctx), desc, cc, method, opts...)
		}),
	}
}

// hedgeChannel is policyChannel whose calls tag each attempt
// ([attemptTags]).
func hedgeChannel(t *testing.T, yaml string, eps map[string][]endpoint.Endpoint) (testgrpc.TestServiceClient, *testutil.Metrics) {
	t.Helper()
	store := controlplane.NewStore()
	manifests(t, store, booksService+yaml+probeRoute)
	store.SetEndpoints(eps)
	m := testutil.NewMetrics(t)
	opts := append(meshgrpc.DialOptions(serveStore(t, store), meshgrpc.WithMeterProvider(m.Provider)), attemptTags()...)
	cc, err := grpc.NewClient(booksTarget, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	c := testgrpc.NewTestServiceClient(cc)
	routed(t, c, m)
	return c, m
}
