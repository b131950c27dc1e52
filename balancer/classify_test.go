package balancer

import (
	"bytes"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
)

// grpcBackend starts a real grpc-go server on loopback (h2c, behind the
// mesh server) that ends every call with code, counting its calls.
func grpcBackend(t *testing.T, hits *atomic.Int64, code codes.Code) endpoint.Endpoint {
	t.Helper()
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		hits.Add(1)
		if code == codes.OK {
			return nil
		}
		return status.Error(code, "answered "+code.String())
	}))
	t.Cleanup(srv.Stop)
	return backendHandler(t, srv)
}

// grpcCall sends one unary gRPC call (an empty message) through c and
// returns its grpc-status, read from the trailers.
func grpcCall(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte{0, 0, 0, 0, 0}))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	if v := resp.Header.Get("Grpc-Status"); v != "" {
		return v // a trailers-only answer
	}
	return resp.Trailer.Get("Grpc-Status")
}

// A gRPC server answering UNKNOWN (2) fails as Linkerd's breaker counts
// it: after its consecutive failures it is tripped, and the next calls all
// go to the healthy endpoint.
func TestAccrualTripsOnGRPCUnknown(t *testing.T) {
	clock := &fakeClock{}
	clock.now.Store(1)
	var badHits, goodHits atomic.Int64
	bad := grpcBackend(t, &badHits, codes.Unknown)
	good := grpcBackend(t, &goodHits, codes.OK)
	bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {bad, good}}), withClock(clock.read),
		WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 3,
			Backoff: Backoff{MinBackoff: time.Hour, MaxBackoff: time.Hour}}}))
	url := svcURL + "test.Echo/Call"

	for i := 0; i < 200 && stateOf(bal, svc, bad).State != stateTripped; i++ {
		grpcCall(t, client, url)
	}
	require.Equal(t, stateTripped, stateOf(bal, svc, bad).State,
		"UNKNOWN never tripped the endpoint (%d calls to it)", badHits.Load())
	assert.EqualValues(t, 3, badHits.Load(), "it tripped at its third UNKNOWN in a row")

	goodHits.Store(0)
	for range 20 {
		assert.Equal(t, "0", grpcCall(t, client, url))
	}
	assert.EqualValues(t, 3, badHits.Load(), "a call reached the tripped endpoint")
	assert.EqualValues(t, 20, goodHits.Load())
}

// classBackend answers each request as its headers say: x-status the HTTP
// status (200), x-grpc-head a grpc-status in the head, x-grpc-trailer
// one in the trailers, x-abort a body that breaks after its first bytes.
func classBackend(t *testing.T) endpoint.Endpoint {
	return backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		code := http.StatusOK
		if v := r.Header.Get("X-Status"); v != "" {
			code, _ = strconv.Atoi(v)
		}
		if v := r.Header.Get("X-Grpc-Head"); v != "" {
			w.Header().Set("Grpc-Status", v)
		}
		trailer := r.Header.Get("X-Grpc-Trailer")
		if trailer != "" {
			w.Header().Set("Trailer", "Grpc-Status")
		}
		if ct := r.Header.Get("Content-Type"); ct != "" {
			w.Header().Set("Content-Type", ct)
		}
		w.WriteHeader(code)
		w.Write([]byte{0, 0, 0, 0, 0})
		if r.Header.Get("X-Abort") != "" {
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler) // the stream breaks
		}
		if trailer != "" {
			w.Header().Set("Grpc-Status", trailer)
		}
	}))
}

// Whether one response trips an endpoint of failure accrual with one
// failure allowed: it does exactly for what Linkerd's breaker counts as a
// failure, the class of the request's response classifier
// (linkerd2-proxy linkerd/app/outbound/src/http/breaker.rs, fed by
// linkerd/http/classify/src/channel.rs). Rows named after a test are the
// cases of linkerd/app/core/src/classify.rs; the codes are the default
// failure codes of linkerd/proxy/client-policy/src/grpc.rs (Codes) and
// the statuses its http.rs (StatusRanges, 500 to 599).
func TestAccrualClassifiesAsLinkerd(t *testing.T) {
	type row struct {
		name        string
		grpc        bool // the request is a gRPC call
		status      int  // 0: 200
		head, trail string
		abort       bool
		fails       bool
	}
	rows := []row{
		{name: "http_response_status_ok", status: 200},
		{name: "http_response_status_bad_request", status: 400},
		{name: "http_response_status_server_error", status: 500, fails: true},
		{name: "HTTP 429", status: 429},
		{name: "HTTP 503", status: 503, fails: true},
		{name: "HTTP 599", status: 599, fails: true},
		{name: "HTTP 600, past the ranges", status: 600},
		{name: "plain HTTP request, grpc-status 14 in the head", head: "14"},
		{name: "plain HTTP request, grpc-status 14 in the trailers", trail: "14"},
		{name: "plain HTTP request, 200 and a broken stream", abort: true, fails: true},
		{name: "grpc_response_header_ok", grpc: true, head: "0"},
		{name: "grpc_response_header_error (UNKNOWN)", grpc: true, head: "2", fails: true},
		{name: "grpc_response_trailer_ok", grpc: true, trail: "0"},
		{name: "grpc_response_trailer_error (DEADLINE_EXCEEDED)", grpc: true, trail: "4", fails: true},
		{name: "grpc_response_trailer_missing", grpc: true},
		{name: "gRPC 503 without grpc-status", grpc: true, status: 503},
		{name: "gRPC 500 with grpc-status 0", grpc: true, status: 500, head: "0"},
		{name: "gRPC code past 16 is UNKNOWN", grpc: true, trail: "17", fails: true},
		{name: "gRPC code past 16 bits is none", grpc: true, trail: "65536"},
		{name: "gRPC broken stream", grpc: true, abort: true, fails: true},
	}
	failing := map[int]bool{2: true, 4: true, 7: true, 13: true, 14: true, 15: true}
	for code := 0; code <= 16; code++ {
		rows = append(rows, row{name: "gRPC code " + codes.Code(code).String(), grpc: true,
			trail: strconv.Itoa(code), fails: failing[code]})
	}
	ep := classBackend(t)
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{}
			clock.now.Store(1)
			bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {ep}}), withClock(clock.read),
				WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 1,
					Backoff: Backoff{MinBackoff: time.Hour, MaxBackoff: time.Hour}}}))
			req, err := http.NewRequest(http.MethodPost, svcURL, bytes.NewReader([]byte{0, 0, 0, 0, 0}))
			require.NoError(t, err)
			if tc.grpc {
				req.Header.Set("Content-Type", "application/grpc")
				req.Header.Set("Te", "trailers")
			}
			if tc.status != 0 {
				req.Header.Set("X-Status", strconv.Itoa(tc.status))
			}
			if tc.head != "" {
				req.Header.Set("X-Grpc-Head", tc.head)
			}
			if tc.trail != "" {
				req.Header.Set("X-Grpc-Trailer", tc.trail)
			}
			if tc.abort {
				req.Header.Set("X-Abort", "1")
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if tc.abort {
				require.Error(t, err, "the stream breaks")
			} else {
				require.NoError(t, err)
				want := tc.status
				if want == 0 {
					want = http.StatusOK
				}
				require.Equal(t, want, resp.StatusCode)
			}
			want := "ready"
			if tc.fails {
				want = stateTripped
			}
			assert.Equal(t, want, stateOf(bal, svc, ep).State)
		})
	}
}

// A Pool (grpc-go's balancer in meshgrpc) counts a call's result as the
// Balancer does: a gRPC call by its status alone, as
// linkerd/app/core/src/classify.rs classifies one, UNKNOWN and a code past
// 16 among the failures; a plain HTTP result by its status.
func TestPoolAccrualClassifiesAsLinkerd(t *testing.T) {
	for _, tc := range []struct {
		name  string
		r     Result
		fails bool
	}{
		{"gRPC OK", Result{GRPCStatus: 0}, false},
		{"gRPC UNKNOWN", Result{GRPCStatus: 2}, true},
		{"gRPC NOT_FOUND", Result{GRPCStatus: 5}, false},
		{"gRPC RESOURCE_EXHAUSTED", Result{GRPCStatus: 8}, false},
		{"gRPC UNAVAILABLE", Result{GRPCStatus: 14}, true},
		{"gRPC code past 16", Result{GRPCStatus: 17}, true},
		{"gRPC OK over HTTP 500", Result{GRPCStatus: 0, HTTPStatus: 500}, false},
		{"HTTP 503", Result{GRPCStatus: -1, HTTPStatus: 503}, true},
		{"HTTP 429", Result{GRPCStatus: -1, HTTPStatus: 429}, false},
		{"no answer", Result{Unanswered: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock fakeClock
			p := NewPool(nil, withClock(clock.read), WithFailureAccrual(&FailureAccrual{
				ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 1, Backoff: Backoff{MinBackoff: time.Hour}}}))
			p.Update([]endpoint.Endpoint{{Addr: netip.MustParseAddrPort("127.0.0.1:1")}})
			k, ok := p.Pick()
			require.True(t, ok)
			k.Done(tc.r)
			_, ok = p.Pick()
			assert.Equal(t, tc.fails, !ok, "tripped")
		})
	}
}

type routeClassifier struct{ c *classify.Classifier }

func (r routeClassifier) ResponseClassifier() *classify.Classifier { return r.c }

type statusIs int

func (s statusIs) MatchStatus(code int) bool { return code == int(s) }

// The classifier of the request's route decides, as the response classes
// of a ServiceProfile route decide for Linkerd's breaker
// (linkerd/app/outbound/src/http/logical/profile.rs gives its route's
// classes to the classifier the breaker reads): a route that calls 404 a
// failure trips an endpoint answering 404, and a route that calls 500 a
// success keeps one answering 500.
func TestAccrualFollowsTheRouteClassifier(t *testing.T) {
	ep := classBackend(t)
	for _, tc := range []struct {
		name   string
		route  *classify.Classifier // nil: no route
		status int
		fails  bool
	}{
		{"404, no route", nil, 404, false},
		{"404, a route calling it a failure", &classify.Classifier{Classes: []classify.ResponseClass{{Match: statusIs(404), Failure: true}}}, 404, true},
		{"500, no route", nil, 500, true},
		{"500, a route calling it a success", &classify.Classifier{Classes: []classify.ResponseClass{{Match: statusIs(500)}}}, 500, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{}
			clock.now.Store(1)
			bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {ep}}), withClock(clock.read),
				WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 1,
					Backoff: Backoff{MinBackoff: time.Hour, MaxBackoff: time.Hour}}}))
			req, err := http.NewRequest(http.MethodGet, svcURL, nil)
			require.NoError(t, err)
			req.Header.Set("X-Status", strconv.Itoa(tc.status))
			if tc.route != nil {
				req = req.WithContext(classify.WithProvider(req.Context(), routeClassifier{tc.route}))
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			require.Equal(t, tc.status, resp.StatusCode)
			want := "ready"
			if tc.fails {
				want = stateTripped
			}
			assert.Equal(t, want, stateOf(bal, svc, ep).State)
		})
	}
}
