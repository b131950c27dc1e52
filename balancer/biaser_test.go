package balancer

import (
	"bytes"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
)

// biasAnswer is one answer of the endpoint of TestLoadBiaserAsLinkerd.
type biasAnswer struct {
	// before is how far the test's clock moves before the request, took
	// how far it moves while the endpoint answers (the measured RTT).
	before, took time.Duration
	status       int // the HTTP status of a plain answer
	// grpc: a gRPC answer of HTTP 200 with status code, in its head
	// (Trailers-Only) or, afterMessage, in the trailers after a message.
	grpc         bool
	code         codes.Code
	afterMessage bool
	// header holds name, value pairs the head carries besides (for a
	// grpc-go server, the metadata it sends with the status).
	header []string
}

func plainA(status int, header ...string) biasAnswer {
	return biasAnswer{status: status, header: header}
}

func grpcA(code codes.Code, header ...string) biasAnswer {
	return biasAnswer{grpc: true, code: code, header: header}
}

func (a biasAnswer) after(d time.Duration) biasAnswer  { a.before = d; return a }
func (a biasAnswer) taking(d time.Duration) biasAnswer { a.took = d; return a }

// The transports a biaser test runs over: an HTTP server reached over
// HTTP/1.1, the same reached over HTTP/2, and a grpc-go server.
const (
	overHTTP1 = "HTTP/1"
	overHTTP2 = "HTTP/2"
	overGRPC  = "grpc-go"
)

// biasEndpoint starts an endpoint that answers the requests it gets with
// answers in turn (a plain 200 once they run out), moving clock as each
// says, over the transport over names.
func biasEndpoint(t *testing.T, over string, clock *fakeClock, answers []biasAnswer) endpoint.Endpoint {
	t.Helper()
	var n atomic.Int64
	next := func() (biasAnswer, bool) {
		k := int(n.Add(1)) - 1
		if k >= len(answers) {
			return biasAnswer{status: http.StatusOK}, false
		}
		clock.now.Add(int64(answers[k].took))
		return answers[k], true
	}
	if over == overGRPC {
		srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, s grpc.ServerStream) error {
			a, _ := next()
			if a.afterMessage {
				if err := s.SendMsg(&emptypb.Empty{}); err != nil {
					return err
				}
			}
			md := metadata.MD{}
			for i := 0; i+1 < len(a.header); i += 2 {
				md.Append(a.header[i], a.header[i+1])
			}
			s.SetTrailer(md)
			return status.Error(a.code, "answered "+a.code.String())
		}))
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(lis) }()
		t.Cleanup(func() { srv.Stop(); <-done })
		return endpoint.Endpoint{Addr: netip.MustParseAddrPort(lis.Addr().String()), Weight: endpoint.DefaultWeight, H2: true}
	}
	ep := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		a, ok := next()
		if !ok {
			io.WriteString(w, "ok")
			return
		}
		h := w.Header()
		if a.grpc {
			h.Set("Content-Type", "application/grpc")
		}
		for i := 0; i+1 < len(a.header); i += 2 {
			h.Set(a.header[i], a.header[i+1])
		}
		switch {
		case !a.grpc:
			w.WriteHeader(a.status)
		case a.afterMessage:
			h.Set("Trailer", "Grpc-Status")
			w.WriteHeader(http.StatusOK)
			w.Write([]byte{0, 0, 0, 0, 0})
			h.Set("Grpc-Status", strconv.Itoa(int(a.code)))
		default:
			h.Set("Grpc-Status", strconv.Itoa(int(a.code)))
			w.WriteHeader(http.StatusOK)
		}
	}))
	ep.H2 = over == overHTTP2
	return ep
}

// send sends one request through client for answer a, and reads its
// response to the end.
func (a biasAnswer) send(t *testing.T, client *http.Client) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, svcURL, nil)
	if a.grpc {
		req, err = http.NewRequest(http.MethodPost, svcURL+"test.Bias/Call", bytes.NewReader([]byte{0, 0, 0, 0, 0}))
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
	}
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	if !a.grpc {
		require.Equal(t, a.status, resp.StatusCode)
		return
	}
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sts := resp.Header.Get("Grpc-Status")
	if a.afterMessage {
		sts = resp.Trailer.Get("Grpc-Status")
	}
	require.Equal(t, strconv.Itoa(int(a.code)), sts, "the status where the answer put it")
}

// The load penalty of a response, as linkerd2-proxy's load biaser records
// it: every case of the tests of linkerd/load-biaser/src/lib.rs that a
// response to one endpoint can show, a row named after its test (rows
// named after a function are cases of that function's rules), against a
// real HTTP server over HTTP/1 and HTTP/2 and, for gRPC answers, a real
// grpc-go server. An HTTP server writes a gRPC answer's head by hand, as
// the crate's mock does. The penalty is the biaser's: 429, 503 and other
// 5xx responses, and the grpc-status of a Trailers-Only gRPC answer
// (RESOURCE_EXHAUSTED, UNAVAILABLE, UNKNOWN, DEADLINE_EXCEEDED, INTERNAL,
// DATA_LOSS), take the base penalty; the Retry-After of a 429 or 503, and
// the grpc-retry-pushback-ms of a RESOURCE_EXHAUSTED or UNAVAILABLE,
// lengthen it up to the maximum. The penalty is recorded as the RTT
// estimate's new peak, floored at the estimate, and fades with the RTT
// decay whatever the penalty decay. The crate's in-flight cases are
// TestLoadBiaserInFlightAsLinkerd's.
func TestLoadBiaserAsLinkerd(t *testing.T) {
	ra := func(secs int) []string { return []string{"Retry-After", strconv.Itoa(secs)} }
	pushback := func(ms int) []string { return []string{"grpc-retry-pushback-ms", strconv.Itoa(ms)} }
	tooMany := func(h ...string) biasAnswer { return plainA(http.StatusTooManyRequests, h...) }
	unavailable := func(h ...string) biasAnswer { return plainA(http.StatusServiceUnavailable, h...) }
	ok := plainA(http.StatusOK)
	type row struct {
		name string
		// defaultRTT, penalty, maxRetryAfter and penaltyDecay configure
		// the penalty (defaultRTT 0: 1 ms; the others 0: their defaults).
		defaultRTT, penalty, maxRetryAfter, penaltyDecay time.Duration
		answers                                          []biasAnswer
		later                                            time.Duration // clock advance before the load is read
		want                                             float64       // the load in seconds (the RTT estimate)
		atLeast                                          bool          // want is a bound the load exceeds
	}
	rows := []row{
		{name: "test_load_uses_default_rtt_initially", defaultRTT: 100 * time.Millisecond, answers: []biasAnswer{ok}, want: 0.1},
		{name: "test_rtt_tracked_after_request", defaultRTT: 100 * time.Millisecond,
			answers: []biasAnswer{ok.after(time.Millisecond).taking(250 * time.Millisecond)}, want: 0.25},
		{name: "test_fast_failure_more_expensive_than_healthy", answers: []biasAnswer{unavailable()}, want: 5},
		{name: "test_faster_healthy_is_cheaper_than_slower_healthy (fast)", answers: []biasAnswer{ok.taking(10 * time.Millisecond)}, want: 0.01},
		{name: "test_faster_healthy_is_cheaper_than_slower_healthy (slow)", answers: []biasAnswer{ok.taking(2 * time.Second)}, want: 2},
		{name: "test_429_injects_penalty", answers: []biasAnswer{tooMany()}, want: 5},
		{name: "test_200_does_not_inject_penalty", answers: []biasAnswer{ok}, want: 0.001},
		{name: "test_penalty_decays_over_time", answers: []biasAnswer{tooMany()}, later: 10 * time.Second, want: 5 * math.Exp(-1)},
		{name: "test_sequential_failures_maintain_load",
			answers: []biasAnswer{tooMany(), tooMany().after(time.Second), tooMany().after(time.Second)}, want: 5},
		{name: "default_max_duration_matches_client_policy", answers: []biasAnswer{tooMany(ra(3600)...)}, want: 300},
		{name: "test_429_with_retry_after_records_hint", answers: []biasAnswer{tooMany(ra(30)...)}, want: 30},
		{name: "test_small_retry_after_floored_at_base_penalty", answers: []biasAnswer{tooMany(ra(1)...)}, want: 5},
		{name: "test_429_with_retry_after_capped_at_max", maxRetryAfter: 300 * time.Second, answers: []biasAnswer{tooMany(ra(600)...)}, want: 300},
		{name: "test_rate_limit_hint_parses_retry_after", maxRetryAfter: time.Minute, answers: []biasAnswer{tooMany(ra(45)...)}, want: 45},
		{name: "test_rate_limit_hint_none_for_200", maxRetryAfter: time.Minute, answers: []biasAnswer{plainA(http.StatusOK, ra(45)...)}, want: 0.001},
		{name: "test_rate_limit_hint_none_without_header", maxRetryAfter: time.Minute, answers: []biasAnswer{tooMany()}, want: 5},
		{name: "test_rate_limit_hint_on_read_without_attach", maxRetryAfter: time.Minute, answers: []biasAnswer{tooMany(ra(45)...)}, want: 45},
		{name: "test_rate_limit_hint_on_read_caps_at_max", maxRetryAfter: time.Minute, answers: []biasAnswer{tooMany(ra(300)...)}, want: 60},
		{name: "test_503_records_base_penalized_effective_rtt", answers: []biasAnswer{unavailable()}, want: 5},
		{name: "test_503_with_retry_after_records_hint", answers: []biasAnswer{unavailable(ra(30)...)}, want: 30},
		{name: "test_429_and_503_retry_after_produce_identical_load (429)", answers: []biasAnswer{tooMany(ra(30)...)}, want: 30},
		{name: "test_429_and_503_retry_after_produce_identical_load (503)", answers: []biasAnswer{unavailable(ra(30)...)}, want: 30},
		{name: "test_500_records_base_penalized_effective_rtt", answers: []biasAnswer{plainA(http.StatusInternalServerError)}, want: 5},
		{name: "test_sub_measured_penalty_failures_floor_at_measured_rtt", penalty: 100 * time.Millisecond,
			answers: append([]biasAnswer{ok.after(time.Millisecond).taking(500 * time.Millisecond)},
				repeat(plainA(http.StatusInternalServerError).after(time.Second), 8)...),
			want: (0.1 + 0.5) / 2, atLeast: true},
		// A penalty is an RTT sample, the estimate's new peak, not a
		// term added to it (load-biaser Handle's drop and
		// linkerd/ewma/src/lib.rs add_peak): after a 2 s answer a 503
		// makes the estimate 5 s, not 7 s; a penalty below the estimate
		// leaves it where it was (0.5 s, not 0.6 s); and the policy's
		// penalty decay is ignored, the penalty fading with the RTT
		// decay (linkerd/proxy/balance/src/lib.rs,
		// penalty_biaser_config_ignores_penalty_decay).
		{name: "Handle's drop: a penalty replaces a lower estimate",
			answers: []biasAnswer{ok.after(time.Millisecond).taking(2 * time.Second), unavailable()}, want: 5},
		{name: "Handle's drop: a penalty below the estimate floors at it", penalty: 100 * time.Millisecond,
			answers: []biasAnswer{ok.after(time.Millisecond).taking(500 * time.Millisecond), plainA(http.StatusInternalServerError)}, want: 0.5},
		{name: "penalty_biaser_config_ignores_penalty_decay", penaltyDecay: 99 * time.Second,
			answers: []biasAnswer{tooMany()}, later: 10 * time.Second, want: 5 * math.Exp(-1)},
		{name: "failure_hint_non_grpc_200_with_grpc_status_header", answers: []biasAnswer{plainA(http.StatusOK, "Grpc-Status", "14")}, want: 0.001},
		{name: "failure_hint_non_grpc_200_with_grpc_status_header (RESOURCE_EXHAUSTED)",
			answers: []biasAnswer{plainA(http.StatusOK, "Grpc-Status", "8")}, want: 0.001},
		{name: "test_grpc_ok_records_low_rtt", answers: []biasAnswer{grpcA(codes.OK)}, want: 0.001},
		// The rules of failure_hint and effective_rtt beyond the tests.
		{name: "failure_hint: another 5xx", answers: []biasAnswer{plainA(http.StatusBadGateway)}, want: 5},
		{name: "failure_hint: a 4xx", answers: []biasAnswer{plainA(http.StatusNotFound)}, want: 0.001},
		{name: "effective_rtt: a 500's Retry-After is no hint", answers: []biasAnswer{plainA(http.StatusInternalServerError, ra(30)...)}, want: 5},
		{name: "rate_limit_hint: a 429's grpc-retry-pushback-ms is no hint", answers: []biasAnswer{tooMany(pushback(30_000)...)}, want: 5},
		{name: "effective_rtt: UNAVAILABLE's pushback is a hint", answers: []biasAnswer{grpcA(codes.Unavailable, pushback(30_000)...)}, want: 30},
		{name: "effective_rtt: INTERNAL's pushback is no hint", answers: []biasAnswer{grpcA(codes.Internal, pushback(30_000)...)}, want: 5},
		{name: "failure_hint: a status in the trailers after a message (INTERNAL)",
			answers: []biasAnswer{{grpc: true, code: codes.Internal, afterMessage: true}}, want: 0.001},
		{name: "failure_hint: a status in the trailers after a message (RESOURCE_EXHAUSTED)",
			answers: []biasAnswer{{grpc: true, code: codes.ResourceExhausted, afterMessage: true}}, want: 0.001},
	}
	for _, c := range []struct{ cap, value int }{{60, 30}, {60, 120}, {300, 120}, {300, 600}, {1800, 900}, {1800, 3600}} {
		want := float64(min(c.value, c.cap))
		rows = append(rows,
			row{name: "test_rate_limit_hint_multi_cap_http (cap " + strconv.Itoa(c.cap) + " s, Retry-After " + strconv.Itoa(c.value) + ")",
				maxRetryAfter: time.Duration(c.cap) * time.Second, answers: []biasAnswer{tooMany(ra(c.value)...)}, want: want},
			row{name: "test_rate_limit_hint_multi_cap_grpc (cap " + strconv.Itoa(c.cap) + " s, pushback " + strconv.Itoa(c.value) + " s)",
				maxRetryAfter: time.Duration(c.cap) * time.Second, answers: []biasAnswer{grpcA(codes.ResourceExhausted, pushback(c.value*1000)...)}, want: want})
	}
	for _, code := range []codes.Code{codes.ResourceExhausted, codes.Unavailable, codes.Internal, codes.Unknown, codes.DeadlineExceeded, codes.DataLoss} {
		rows = append(rows, row{name: "test_grpc_server_errors_record_effective_rtt (" + code.String() + ")",
			answers: []biasAnswer{grpcA(code)}, want: 5})
	}
	for _, code := range []codes.Code{codes.Canceled, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.Aborted, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated} {
		rows = append(rows, row{name: "test_grpc_client_errors_record_low_rtt (" + code.String() + ")",
			answers: []biasAnswer{grpcA(code)}, want: 0.001})
	}
	rows = append(rows, row{name: "is_grpc: a content-type with a +suffix",
		answers: []biasAnswer{grpcA(codes.Unavailable, "Content-Type", "application/grpc+proto")}, want: 5})
	for _, tc := range rows {
		over := []string{overHTTP1, overHTTP2, overGRPC}
		for _, a := range tc.answers {
			if !a.grpc || len(a.header) > 0 && a.header[0] == "Content-Type" {
				over = over[:2] // a head only an HTTP server writes
			}
		}
		for _, o := range over {
			t.Run(tc.name+" over "+o, func(t *testing.T) {
				clock := &fakeClock{}
				clock.now.Store(1)
				ep := biasEndpoint(t, o, clock, tc.answers)
				defaultRTT := tc.defaultRTT
				if defaultRTT == 0 {
					defaultRTT = time.Millisecond
				}
				bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {ep}}), withClock(clock.read),
					WithPenaltyPeakEWMA(&PenaltyPeakEWMA{DefaultRTT: defaultRTT, Decay: 10 * time.Second,
						Penalty: tc.penalty, MaxRetryAfter: tc.maxRetryAfter, PenaltyDecay: tc.penaltyDecay}))
				for _, a := range tc.answers {
					clock.now.Add(int64(a.before))
					a.send(t, client)
				}
				clock.now.Add(int64(tc.later))
				st := stateOf(bal, svc, ep)
				assert.Equal(t, stateReady, st.State, "a penalty takes nobody out of rotation")
				if tc.atLeast {
					assert.Greater(t, st.LoadSeconds, tc.want)
				} else {
					assert.InDelta(t, tc.want, st.LoadSeconds, 0.01*tc.want+0.0002)
				}
			})
		}
	}
}

func repeat[T any](v T, n int) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// The in-flight cases of the tests of linkerd/load-biaser/src/lib.rs, each
// row named after its test, against a real HTTP server over HTTP/1 and
// HTTP/2: a request counts in its endpoint's load from its send to the
// end of its body, and the load is the RTT estimate (a penalty included)
// times the requests in flight plus one, while a penalized response
// leaves the count at its head and records nothing more at its body's end.
// A request its caller gives up before its head leaves the count and
// records the time it waited.
func TestLoadBiaserInFlightAsLinkerd(t *testing.T) {
	type env struct {
		clock   *fakeClock
		bal     *Balancer
		client  *http.Client
		ep      endpoint.Endpoint
		release func() // lets the endpoint's handler go on
	}
	cost := func(e env) float64 {
		return lookup(e.bal, svc).current().state.Load().eps[0].load.cost(e.clock.read(), e.bal.decay) / 1e9
	}
	get := func(t *testing.T, e env) *http.Response {
		resp, err := e.client.Get(svcURL)
		require.NoError(t, err)
		return resp
	}
	drain := func(t *testing.T, resp *http.Response) {
		_, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
	}
	for _, tc := range []struct {
		name string
		// status is the endpoint's answer; it writes its head at once
		// and its body once released, or, holdHead, both once released.
		status   int
		holdHead bool
		run      func(t *testing.T, e env)
	}{
		{name: "test_pending_increases_load", status: http.StatusOK, holdHead: true, run: func(t *testing.T, e env) {
			done := make(chan *http.Response, 2)
			for range 2 {
				go func() {
					resp, err := e.client.Get(svcURL)
					if err != nil {
						done <- nil
						return
					}
					done <- resp
				}()
			}
			require.Eventually(t, func() bool { return stateOf(e.bal, svc, e.ep).Pending == 2 }, testutil.Timeout, time.Millisecond)
			st := stateOf(e.bal, svc, e.ep)
			assert.InDelta(t, 0.001, st.LoadSeconds, 1e-9, "no sample yet: the default RTT")
			assert.InDelta(t, 3*st.LoadSeconds, cost(e), 1e-9, "two in flight: the load of the RTT times three")
			e.release()
			for range 2 {
				resp := <-done
				require.NotNil(t, resp)
				drain(t, resp)
			}
			assert.Zero(t, stateOf(e.bal, svc, e.ep).Pending)
		}},
		{name: "test_pending_counted_via_strong_count", status: http.StatusOK, run: func(t *testing.T, e env) {
			resp := get(t, e)
			assert.EqualValues(t, 1, stateOf(e.bal, svc, e.ep).Pending, "in flight after its head, until its first data")
			e.release()
			drain(t, resp)
			assert.Zero(t, stateOf(e.bal, svc, e.ep).Pending)
		}},
		{name: "test_two_concurrent_requests_counted", status: http.StatusOK, holdHead: true, run: func(t *testing.T, e env) {
			done := make(chan *http.Response, 2)
			for range 2 {
				go func() {
					resp, err := e.client.Get(svcURL)
					if err != nil {
						done <- nil
						return
					}
					done <- resp
				}()
			}
			require.Eventually(t, func() bool { return stateOf(e.bal, svc, e.ep).Pending == 2 }, testutil.Timeout, time.Millisecond)
			e.release()
			for range 2 {
				resp := <-done
				require.NotNil(t, resp)
				drain(t, resp)
			}
			assert.Zero(t, stateOf(e.bal, svc, e.ep).Pending, "none once both ended")
		}},
		{name: "test_cancellation_records_measurement", status: http.StatusOK, holdHead: true, run: func(t *testing.T, e env) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, svcURL, nil)
			require.NoError(t, err)
			errc := make(chan error, 1)
			go func() {
				resp, err := e.client.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			require.Eventually(t, func() bool { return stateOf(e.bal, svc, e.ep).Pending == 1 }, testutil.Timeout, time.Millisecond)
			e.clock.now.Add(int64(3 * time.Second))
			before := stateOf(e.bal, svc, e.ep).LoadSeconds
			cancel()
			require.ErrorIs(t, testutil.Recv(t, errc, "the request given up"), context.Canceled)
			st := stateOf(e.bal, svc, e.ep)
			assert.Zero(t, st.Pending, "given up: no longer in flight")
			assert.Greater(t, st.LoadSeconds, before, "the elapsed wait is recorded")
			assert.InDelta(t, 3, st.LoadSeconds, 0.01, "the time it waited, a peak")
			assert.Zero(t, st.ConsecutiveFailures, "no failure")
			e.release()
		}},
		{name: "test_failure_records_once_at_response_head", status: http.StatusServiceUnavailable, run: func(t *testing.T, e env) {
			resp := get(t, e)
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			st := stateOf(e.bal, svc, e.ep)
			assert.Zero(t, st.Pending, "a penalized response is not in flight after its head")
			assert.InDelta(t, 5, st.LoadSeconds, 0.01)
			assert.InDelta(t, 5, cost(e), 0.01)
			e.clock.now.Add(int64(3 * time.Second))
			before := stateOf(e.bal, svc, e.ep).LoadSeconds
			e.release()
			drain(t, resp)
			st = stateOf(e.bal, svc, e.ep)
			assert.Equal(t, before, st.LoadSeconds, "the body's end records no second measurement")
			assert.Zero(t, st.Pending)
		}},
	} {
		for _, o := range []string{overHTTP1, overHTTP2} {
			t.Run(tc.name+" over "+o, func(t *testing.T) {
				clock := &fakeClock{}
				clock.now.Store(1)
				gate := make(chan struct{})
				var once sync.Once
				release := func() { once.Do(func() { close(gate) }) }
				t.Cleanup(release) // before the server's Close, which waits for the handler
				ep := backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if tc.holdHead {
						<-gate
					}
					w.WriteHeader(tc.status)
					http.NewResponseController(w).Flush()
					<-gate
					io.WriteString(w, "body")
				}))
				ep.H2 = o == overHTTP2
				bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {ep}}), withClock(clock.read),
					WithPenaltyPeakEWMA(&PenaltyPeakEWMA{DefaultRTT: time.Millisecond, Decay: 10 * time.Second}))
				tc.run(t, env{clock: clock, bal: bal, client: client, ep: ep, release: release})
			})
		}
	}
}

// A Pool (grpc-go's balancer in meshgrpc) sets the load penalty of a
// call's Result as the Balancer reads a response head, by the rules of
// linkerd2-proxy's load biaser (linkerd/load-biaser/src/lib.rs,
// failure_hint and effective_rtt; rows named after its tests are their
// cases): an HTTP 429, 503 or other 5xx, or a gRPC status that came
// Trailers-Only; a status in the trailers sets none. The Retry-After or
// pushback of a 429, 503, RESOURCE_EXHAUSTED or UNAVAILABLE lengthens it.
func TestPoolLoadBiaserAsLinkerd(t *testing.T) {
	const s = time.Second
	trailersOnly := func(code codes.Code, retryAfter time.Duration) Result {
		return Result{GRPCStatus: int(code), TrailersOnly: true, RetryAfter: retryAfter}
	}
	httpStatus := func(status int, retryAfter time.Duration) Result {
		return Result{GRPCStatus: -1, HTTPStatus: status, RetryAfter: retryAfter}
	}
	type row struct {
		name string
		r    Result
		want float64 // the penalty in seconds
	}
	rows := []row{
		{"test_429_injects_penalty", httpStatus(429, 0), 5},
		{"test_503_records_base_penalized_effective_rtt", httpStatus(503, 0), 5},
		{"test_500_records_base_penalized_effective_rtt", httpStatus(500, 0), 5},
		{"test_200_does_not_inject_penalty", httpStatus(200, 0), 0},
		{"test_rate_limit_hint_none_for_200", httpStatus(200, 45*s), 0},
		{"test_429_with_retry_after_records_hint", httpStatus(429, 30*s), 30},
		{"test_503_with_retry_after_records_hint", httpStatus(503, 30*s), 30},
		{"test_small_retry_after_floored_at_base_penalty", httpStatus(429, s), 5},
		{"default_max_duration_matches_client_policy", httpStatus(429, 600*s), 300},
		{"test_grpc_ok_records_low_rtt", trailersOnly(codes.OK, 0), 0},
		{"test_rate_limit_hint_multi_cap_grpc (pushback 120 s)", trailersOnly(codes.ResourceExhausted, 120*s), 120},
		{"effective_rtt: UNAVAILABLE's pushback is a hint", trailersOnly(codes.Unavailable, 30*s), 30},
		{"effective_rtt: INTERNAL's pushback is no hint", trailersOnly(codes.Internal, 30*s), 5},
		{"effective_rtt: a 500's Retry-After is no hint", httpStatus(500, 30*s), 5},
		{"failure_hint: a 4xx", httpStatus(404, 0), 0},
		{"failure_hint: RESOURCE_EXHAUSTED in the trailers after a message", Result{GRPCStatus: int(codes.ResourceExhausted)}, 0},
		{"failure_hint: INTERNAL in the trailers after a message", Result{GRPCStatus: int(codes.Internal)}, 0},
		{"failure_hint: a Trailers-Only status on a 404", Result{GRPCStatus: int(codes.Internal), HTTPStatus: 404, TrailersOnly: true}, 0},
	}
	for _, code := range []codes.Code{codes.ResourceExhausted, codes.Unavailable, codes.Internal, codes.Unknown, codes.DeadlineExceeded, codes.DataLoss} {
		rows = append(rows, row{"test_grpc_server_errors_record_effective_rtt (" + code.String() + ")", trailersOnly(code, 0), 5})
	}
	for _, code := range []codes.Code{codes.Canceled, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.Aborted, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated} {
		rows = append(rows, row{"test_grpc_client_errors_record_low_rtt (" + code.String() + ")", trailersOnly(code, 0), 0})
	}
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			var clock fakeClock
			clock.now.Store(1)
			p := NewPool(nil, withClock(clock.read), WithPenaltyPeakEWMA(&PenaltyPeakEWMA{DefaultRTT: time.Millisecond, Decay: 10 * time.Second}))
			addr := netip.MustParseAddrPort("127.0.0.1:1")
			p.Update([]endpoint.Endpoint{{Addr: addr}})
			k, ok := p.Pick()
			require.True(t, ok)
			k.Done(tc.r)
			l := p.loads[addr]
			l.mu.Lock()
			est := l.estimateLocked(clock.read(), p.decay) / 1e9
			l.mu.Unlock()
			assert.InDelta(t, max(tc.want, 0.001), est, 1e-9, "the penalty replaces the 1 ms estimate")
		})
	}
}

// A Pool records a load penalty as the Balancer does, as the RTT
// estimate's new peak in place of the answer's time (linkerd/load-biaser/
// src/lib.rs, Handle's drop; linkerd/ewma/src/lib.rs, add_peak), not as a
// term added to the estimate: an endpoint whose estimate is 2 s after a
// slow answer is at 5 s after a 503, not 7 s; and the penalty fades with
// the RTT decay, PenaltyDecay ignored (linkerd/proxy/balance/src/lib.rs,
// penalty_biaser_config_ignores_penalty_decay).
func TestPoolPenaltyIsAnRTTPeak(t *testing.T) {
	for _, tc := range []struct {
		name         string
		penaltyDecay time.Duration
		slow         time.Duration // the answer before the 503 took this long
		later        time.Duration
		want         float64 // the estimate in seconds
	}{
		{name: "Handle's drop: a penalty replaces a lower estimate", slow: 2 * time.Second, want: 5},
		{name: "penalty_biaser_config_ignores_penalty_decay", penaltyDecay: 99 * time.Second, later: 10 * time.Second, want: 5 * math.Exp(-1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock fakeClock
			clock.now.Store(1)
			p := NewPool(nil, withClock(clock.read), WithPenaltyPeakEWMA(&PenaltyPeakEWMA{DefaultRTT: time.Millisecond,
				Decay: 10 * time.Second, PenaltyDecay: tc.penaltyDecay}))
			addr := netip.MustParseAddrPort("127.0.0.1:1")
			p.Update([]endpoint.Endpoint{{Addr: addr}})
			k, ok := p.Pick()
			require.True(t, ok)
			clock.now.Add(int64(tc.slow))
			k.Done(Result{GRPCStatus: int(codes.OK)})
			k, ok = p.Pick()
			require.True(t, ok)
			k.Done(Result{GRPCStatus: int(codes.Unavailable), TrailersOnly: true})
			clock.now.Add(int64(tc.later))
			l := p.loads[addr]
			l.mu.Lock()
			est := l.estimateLocked(clock.read(), p.decay) / 1e9
			l.mu.Unlock()
			assert.InDelta(t, tc.want, est, 1e-6)
			assert.InDelta(t, tc.want*1e9, l.cost(clock.read(), p.decay), 1e3, "the load is the estimate")
		})
	}
}
