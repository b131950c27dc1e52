package balancer

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
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
)

// answer is how limitBackend answers one request: a plain server with
// HTTP status status (to a plain request, or to a gRPC call when
// plainGRPC), a grpc-go server (grpc) with code as a unary error
// (trailers-only) or after one message (in the trailers).
type answer struct {
	status       int
	grpc         bool
	code         codes.Code
	afterMessage bool
	plainGRPC    bool
}

func plain(status int) answer { return answer{status: status} }

func grpcAnswer(code codes.Code, afterMessage bool) answer {
	return answer{grpc: true, code: code, afterMessage: afterMessage}
}

// limitBackend starts an endpoint that answers each request as its
// headers say (see send). With native, it is a real grpc-go server on
// its own HTTP/2 transport (which answers a unary error trailers-only)
// and takes only gRPC calls; else a plain HTTP server.
func limitBackend(t *testing.T, native bool) endpoint.Endpoint {
	if !native {
		return backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			code, _ := strconv.Atoi(r.Header.Get("X-Status"))
			w.WriteHeader(code)
		}))
	}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, s grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(s.Context())
		var code int
		if v := md.Get("x-code"); len(v) > 0 {
			code, _ = strconv.Atoi(v[0])
		}
		if len(md.Get("x-after-message")) > 0 {
			if err := s.SendMsg(&emptypb.Empty{}); err != nil {
				return err
			}
		}
		return status.Error(codes.Code(code), "answered "+codes.Code(code).String())
	}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return endpoint.Endpoint{Addr: netip.MustParseAddrPort(lis.Addr().String()), Weight: endpoint.DefaultWeight, H2: true}
}

// send sends one request through client that ep answers with a, and
// reads its response to the end.
func (a answer) send(t *testing.T, client *http.Client) {
	t.Helper()
	var req *http.Request
	var err error
	if a.grpc || a.plainGRPC {
		req, err = http.NewRequest(http.MethodPost, svcURL+"test.Limit/Call", bytes.NewReader([]byte{0, 0, 0, 0, 0}))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		req.Header.Set("X-Code", strconv.Itoa(int(a.code)))
		if a.afterMessage {
			req.Header.Set("X-After-Message", "1")
		}
	} else {
		req, err = http.NewRequest(http.MethodGet, svcURL, nil)
		require.NoError(t, err)
	}
	if a.plainGRPC {
		req.Header.Set("X-Plain", "1")
	}
	if a.status != 0 {
		req.Header.Set("X-Status", strconv.Itoa(a.status))
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	if !a.grpc {
		require.Equal(t, a.status, resp.StatusCode)
		return
	}
	want := strconv.Itoa(int(a.code))
	if a.afterMessage {
		require.NotEmpty(t, body, "a message came first")
		require.Empty(t, resp.Header.Get("Grpc-Status"))
		require.Equal(t, want, resp.Trailer.Get("Grpc-Status"), "the status in the trailers")
	} else {
		require.Empty(t, body)
		require.Equal(t, want, resp.Header.Get("Grpc-Status"), "a trailers-only answer")
	}
}

// A rate limit (a 429, a gRPC RESOURCE_EXHAUSTED), which the default
// classifier calls a success, counts in failure accrual as in Linkerd's
// breakers. Unified accrual counts it against the success rate and as a
// failed probe (a strict probe), and never as a failure in a row;
// consecutive-failures accrual counts it as the success it is (a lenient
// probe). Which responses are rate limits follows the class: a
// RESOURCE_EXHAUSTED counts the same in the headers of a trailers-only
// answer (a unary error of a real grpc-go server) and in the trailers
// after a message, and a gRPC call answered 429 without a status is
// none. Rows named after a test are the cases of linkerd2-proxy
// linkerd/app/outbound/src/http/breaker/integration_tests.rs (and
// dual_mode_success_rate_trips_before_consecutive of unified.rs beside
// it), with their policies; the success rate here is inmesh's decaying
// average, which a fixed clock makes a plain average with weight 0.1.
// Before, unified accrual counted a rate limit as a success: neither row
// of a rate trip tripped, and a rate-limited probe restored the endpoint.
func TestRateLimitInAccrualAsLinkerd(t *testing.T) {
	unified := func(threshold float64, minRequests, maxConsecutive uint32) *FailureAccrual {
		return &FailureAccrual{Unified: &Unified{SuccessRateThreshold: threshold, MinRequests: minRequests,
			MaxConsecutiveFailures: maxConsecutive, Backoff: Backoff{MinBackoff: time.Second, MaxBackoff: time.Hour, JitterRatio: -1}}}
	}
	consecutive := &FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 2,
		Backoff: Backoff{MinBackoff: time.Second, MaxBackoff: time.Hour, JitterRatio: -1}}}
	limited := plain(http.StatusTooManyRequests)
	twoFailures := []answer{plain(http.StatusBadGateway), plain(http.StatusBadGateway)}
	twoUnavailable := []answer{grpcAnswer(codes.Unavailable, false), grpcAnswer(codes.Unavailable, false)}
	for _, tc := range []struct {
		name    string
		grpc    bool // the endpoint is a grpc-go server: every answer is a gRPC call's
		accrual *FailureAccrual
		// trip is sent in order until the endpoint trips; then, when
		// probe is set, its penalty passes and probe is its probe.
		trip  []answer
		probe *answer
		want  string
	}{
		{name: "unified_trips_on_low_success_rate", accrual: unified(0.8, 1, 100),
			trip: []answer{plain(http.StatusOK), limited, limited, limited, limited}, want: stateTripped},
		{name: "dual_mode_success_rate_trips_before_consecutive", accrual: unified(0.8, 3, 5),
			trip: []answer{plain(http.StatusOK), limited, limited, limited, limited}, want: stateTripped},
		{name: "unified: RESOURCE_EXHAUSTED after a message lowers the success rate", grpc: true, accrual: unified(0.8, 1, 100),
			trip: []answer{grpcAnswer(codes.OK, false), grpcAnswer(codes.ResourceExhausted, true), grpcAnswer(codes.ResourceExhausted, true),
				grpcAnswer(codes.ResourceExhausted, true), grpcAnswer(codes.ResourceExhausted, true)}, want: stateTripped},
		{name: "unified: 429s are no failures in a row", accrual: unified(0.8, 100, 2),
			trip: []answer{limited, limited, limited, limited}, want: stateReady},
		{name: "consecutive: 429s are successes", accrual: consecutive,
			trip: []answer{plain(http.StatusBadGateway), limited, plain(http.StatusBadGateway)}, want: stateReady},
		{name: "consecutive_probe_is_lenient", accrual: consecutive, trip: twoFailures, probe: &limited, want: stateReady},
		{name: "consecutive_probe_is_lenient, RESOURCE_EXHAUSTED after a message", grpc: true, accrual: consecutive, trip: twoUnavailable,
			probe: ptr(grpcAnswer(codes.ResourceExhausted, true)), want: stateReady},
		{name: "unified_probe_is_strict", accrual: unified(0.8, 100, 2), trip: twoFailures, probe: &limited, want: stateTripped},
		{name: "unified_probe_is_strict, RESOURCE_EXHAUSTED as a unary error", grpc: true, accrual: unified(0.8, 100, 2), trip: twoUnavailable,
			probe: ptr(grpcAnswer(codes.ResourceExhausted, false)), want: stateTripped},
		{name: "unified_probe_is_strict, RESOURCE_EXHAUSTED after a message", grpc: true, accrual: unified(0.8, 100, 2), trip: twoUnavailable,
			probe: ptr(grpcAnswer(codes.ResourceExhausted, true)), want: stateTripped},
		{name: "unified_probe_success_reopens", accrual: unified(0.8, 100, 2), trip: twoFailures,
			probe: ptr(plain(http.StatusOK)), want: stateReady},
		{name: "unified: a gRPC call answered 429 without a status is no rate limit", accrual: unified(0.8, 100, 2),
			trip: twoFailures, probe: &answer{status: http.StatusTooManyRequests, plainGRPC: true}, want: stateReady},
		{name: "unified: gRPC NOT_FOUND is a good probe", grpc: true, accrual: unified(0.8, 100, 2), trip: twoUnavailable,
			probe: ptr(grpcAnswer(codes.NotFound, true)), want: stateReady},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{}
			clock.now.Store(1)
			ep := limitBackend(t, tc.grpc)
			bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {ep}}), withClock(clock.read),
				WithFailureAccrual(tc.accrual))
			for _, a := range tc.trip {
				a.send(t, client)
				if stateOf(bal, svc, ep).State == stateTripped {
					break
				}
			}
			if tc.probe != nil {
				require.Equal(t, stateTripped, stateOf(bal, svc, ep).State)
				clock.now.Add(int64(time.Second))
				require.Equal(t, stateProbation, stateOf(bal, svc, ep).State)
				tc.probe.send(t, client)
			}
			assert.Equal(t, tc.want, stateOf(bal, svc, ep).State)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// A Pool (grpc-go's balancer in meshgrpc) counts a rate-limited probe as
// the Balancer does, and as the probes of
// linkerd/app/outbound/src/http/breaker/integration_tests.rs: it fails
// the strict probe of unified accrual and passes the lenient one of
// consecutive failures. A call dropped after its response began is a good
// probe for both.
func TestPoolRateLimitedProbe(t *testing.T) {
	backoff := Backoff{MinBackoff: time.Second, MaxBackoff: time.Hour, JitterRatio: -1}
	unified := &FailureAccrual{Unified: &Unified{MinRequests: 100, MaxConsecutiveFailures: 1, Backoff: backoff}}
	consecutive := &FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 1, Backoff: backoff}}
	for _, tc := range []struct {
		name    string
		accrual *FailureAccrual
		probe   Result
		tripped bool
	}{
		{"unified_probe_is_strict, RESOURCE_EXHAUSTED", unified, Result{GRPCStatus: 8}, true},
		{"unified_probe_is_strict, HTTP 429", unified, Result{GRPCStatus: -1, HTTPStatus: 429}, true},
		{"unified_probe_success_reopens", unified, Result{GRPCStatus: 0}, false},
		{"unified, dropped before its status", unified, Result{GRPCStatus: 1, Dropped: true}, false},
		{"consecutive_probe_is_lenient, RESOURCE_EXHAUSTED", consecutive, Result{GRPCStatus: 8}, false},
		{"consecutive_probe_is_lenient, HTTP 429", consecutive, Result{GRPCStatus: -1, HTTPStatus: 429}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock fakeClock
			p := NewPool(nil, withClock(clock.read), WithFailureAccrual(tc.accrual))
			p.Update([]endpoint.Endpoint{{Addr: netip.MustParseAddrPort("127.0.0.1:1")}})
			k, ok := p.Pick()
			require.True(t, ok)
			k.Done(Result{GRPCStatus: 14})
			_, ok = p.Pick()
			require.False(t, ok, "tripped")
			clock.now.Add(int64(time.Second))
			k, ok = p.Pick()
			require.True(t, ok, "the probe")
			k.Done(tc.probe)
			_, ok = p.Pick()
			assert.Equal(t, tc.tripped, !ok, "tripped after the probe")
		})
	}
}

// The load penalty of a gRPC RESOURCE_EXHAUSTED from a real grpc-go
// server follows linkerd2-proxy's load biaser (linkerd/load-biaser/src/
// lib.rs, failure_hint): it reads the grpc-status of a trailers-only
// answer (a unary error) and, as its comment says, not one in the
// trailers after a message, which records only the measured RTT. Rows
// named after a test are its cases; accrual, by contrast, counts both
// framings alike (TestRateLimitInAccrualAsLinkerd).
func TestGRPCResourceExhaustedPenaltyAsLinkerd(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    answer
		want float64 // penalty in seconds, within 0.1 s
	}{
		{"test_grpc_server_errors_record_effective_rtt (RESOURCE_EXHAUSTED, trailers-only)", grpcAnswer(codes.ResourceExhausted, false), 5},
		{"RESOURCE_EXHAUSTED in the trailers after a message", grpcAnswer(codes.ResourceExhausted, true), 0},
		{"test_grpc_ok_records_low_rtt", grpcAnswer(codes.OK, false), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{}
			clock.now.Store(1)
			ep := limitBackend(t, true)
			bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {ep}}), withClock(clock.read),
				WithPenaltyPeakEWMA(&PenaltyPeakEWMA{DefaultRTT: time.Millisecond, Decay: 10 * time.Second}))
			tc.a.send(t, client)
			st := stateOf(bal, svc, ep)
			assert.Equal(t, stateReady, st.State, "a penalty takes nobody out of rotation")
			assert.InDelta(t, tc.want+0.001, st.LoadSeconds, 0.1)
		})
	}
}
