package meshgrpc_test

import (
	"context"
	"fmt"
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
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// plainApp is a real HTTP/2 (h2c) server on loopback that serves the
// TestService with a real grpc-go server, except for the calls it answers
// with a plain HTTP response of status code (text/plain, not gRPC's
// content-type): the next one once armed, or every one when always.
type plainApp struct {
	grpc           biasApp
	code           int
	armed, always  atomic.Bool
	calls, answers atomic.Int64 // every call; the plain answers
	addr           netip.AddrPort
}

func startPlainApp(t *testing.T, code int) *plainApp {
	t.Helper()
	a := &plainApp{code: code}
	g := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(g, &a.grpc)
	t.Cleanup(g.Stop)
	srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.calls.Add(1)
		if a.always.Load() || a.armed.CompareAndSwap(true, false) {
			a.answers.Add(1)
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(a.code)
			_, _ = io.WriteString(w, "not gRPC")
			return
		}
		g.ServeHTTP(w, r)
	}))
	a.addr = netip.MustParseAddrPort(srv.Listener.Addr().String())
	return a
}

// A gRPC call answered by an HTTP response that is not gRPC's (an HTTP/2
// server that does not speak gRPC, a proxy's own answer) is penalized as
// the HTTP balancer penalizes such an answer to a gRPC request, and as
// linkerd2-proxy's load biaser reads a response's HTTP status before its
// content-type (linkerd/load-biaser/src/lib.rs, failure_hint): a 429, a
// 503 and any other 5xx set the penalty, and the endpoint gets none of the
// next calls; a 4xx sets none, and the endpoint keeps its share, though
// grpc-go fails the call with a status it made of the HTTP one. Both
// endpoints start at a default RTT (1 s) that the calls' own
// sub-millisecond times barely move, so their loads are alike but for a
// penalty, the estimate's new 5 s peak.
func TestPlainHTTPAnswerLoadPenalty(t *testing.T) {
	for _, tc := range []struct {
		http      int
		code      codes.Code // the status grpc-go makes of it
		penalized bool
	}{
		{http.StatusTooManyRequests, codes.Unavailable, true},
		{http.StatusServiceUnavailable, codes.Unavailable, true},
		{http.StatusInternalServerError, codes.Unknown, true},
		{http.StatusBadGateway, codes.Unavailable, true},
		{http.StatusGatewayTimeout, codes.Unavailable, true},
		{http.StatusNotImplemented, codes.Unknown, true},
		{http.StatusBadRequest, codes.Internal, false},
		{http.StatusUnauthorized, codes.Unauthenticated, false},
		{http.StatusForbidden, codes.PermissionDenied, false},
		{http.StatusNotFound, codes.Unimplemented, false},
	} {
		t.Run(strconv.Itoa(tc.http), func(t *testing.T) {
			a, b := startPlainApp(t, tc.http), &biasApp{}
			store := controlplane.NewStore()
			manifests(t, store, booksService)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}, {Addr: serveTestService(t, b)}}})
			c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithPenaltyPeakEWMA(
				&balancer.PenaltyPeakEWMA{DefaultRTT: time.Second, Decay: 10 * time.Second})))
			call := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
				defer cancel()
				_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
				return err
			}
			// Both endpoints are ready once each has answered a call.
			for a.calls.Load() == 0 || b.calls.Load() == 0 {
				require.Less(t, a.calls.Load()+b.calls.Load(), int64(10_000), "an endpoint got no call")
				require.NoError(t, call())
			}
			// From now on a answers every call plainly. Penalized, it
			// gets one call now and then, after its penalty has decayed
			// below b's load or when P2C draws it twice; unpenalized, it
			// keeps its share, about half.
			a.always.Store(true)
			before, was := a.calls.Load(), a.answers.Load()
			const n = 100
			for range n {
				if err := call(); err != nil {
					require.Equal(t, tc.code, status.Code(err), "%v", err)
				}
			}
			got := a.calls.Load() - before
			require.Equal(t, got, a.answers.Load()-was, "every call to the endpoint answered plainly")
			if tc.penalized {
				assert.LessOrEqual(t, got, int64(5), "calls to the penalized endpoint, of %d", n)
			} else {
				assert.Greater(t, got, int64(20), "calls to the endpoint, of %d", n)
			}
		})
	}
}

// A gRPC call answered by an HTTP response that is not gRPC's ended
// without a gRPC status, which Linkerd's classifier counts a success
// (linkerd/app/core/src/classify.rs: a gRPC response whose head has no
// grpc-status ends as Grpc(Ok(Unknown)) without trailers), and the HTTP
// balancer too: it takes no endpoint out of rotation by failure accrual,
// whatever status grpc-go makes of it. The calls go by a GRPCRoute of the
// Service, whose annotations set an accrual that would eject the endpoint
// for an hour after one failure: after its first plain answer the
// endpoint keeps its share of the next calls beside an endpoint that
// answers them. The RTT average forgets at once, so load does not decide.
func TestPlainHTTPAnswerIsNoFailure(t *testing.T) {
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusInternalServerError, http.StatusBadRequest, http.StatusForbidden} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			a, b := startPlainApp(t, code), &biasApp{}
			a.always.Store(true)
			store := controlplane.NewStore()
			manifests(t, store, `
apiVersion: v1
kind: Service
metadata:
  name: books
  namespace: default
  annotations:
    balancer.linkerd.io/failure-accrual: consecutive
    balancer.linkerd.io/failure-accrual-consecutive-max-failures: "1"
    balancer.linkerd.io/failure-accrual-consecutive-min-penalty: 1h
    balancer.linkerd.io/failure-accrual-consecutive-max-penalty: 1h
spec: {ports: [{port: 7000}]}
`+emptyRoute)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}, {Addr: serveTestService(t, b)}}})
			c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithPeakEWMA(0, time.Nanosecond)))
			call := func() error {
				_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
				return err
			}
			for a.answers.Load() == 0 {
				require.Less(t, b.calls.Load(), int64(10_000), "no call reached the endpoint")
				if err := call(); a.answers.Load() > 0 {
					require.Contains(t, status.Convert(err).Message(), fmt.Sprintf("unexpected HTTP status code received from server: %d", code))
				}
			}
			const n = 100
			for range n {
				_ = call()
			}
			assert.Positive(t, a.answers.Load()-1, "calls to the endpoint after its first plain answer, of %d", n)
		})
	}
}
