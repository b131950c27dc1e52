package router

import (
	"net/http"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
)

// A gRPC call on a GRPCRoute whose response ends without any grpc-status
// is labelled grpc_status="UNKNOWN", error="" in the outbound_grpc_route_*
// series, as Linkerd's proxy writes a response without a code
// (linkerd2-proxy
// linkerd/app/outbound/src/http/logical/policy/route/metrics/labels.rs,
// GrpcRsp: status.unwrap_or(Unknown)), and is never retried, even by a
// retry on UNKNOWN: Linkerd's retry reads the status from the response's
// head or trailers, and a response without one is not retryable
// (linkerd/app/outbound/src/http/logical/policy/route/retry.rs). A
// response with grpc-status 2 is. Both streams end before any data, so
// that the router holds them back to decide.
func TestGRPCWithoutStatusOnGRPCRoute(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trailer string // the grpc-status trailer, "" for none
		calls   int64
	}{
		{name: "without a status", calls: 1},
		{name: "with status UNKNOWN", trailer: "2", calls: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
				// Headers, then the end of the stream, with or without
				// trailers: a stream that ends before any data, which the
				// router holds to read its status and decide on a retry.
				w.Header().Set("Content-Type", "application/grpc")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				if tc.trailer != "" {
					w.Header().Set(http.TrailerPrefix+"Grpc-Status", tc.trailer)
				}
			})
			p := &policy.Policy{Parent: parentMeta, Protocol: policy.ProtocolGRPC, GRPC: policy.GRPCProtocol{Routes: []policy.GRPCRoute{{
				Meta: policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Namespace: "ns", Name: "rpc"},
				Rules: []policy.GRPCRule{{Backends: to(up.backend("web")),
					Retry: &policy.Retry{GRPCCodes: []codes.Code{codes.Unknown}, MaxRetries: 1}}},
			}}}}
			f := newFixture(t, testutil.H2C, p)
			f.do(t, http.MethodPost, "http://svc.test/pkg.Svc/Call", "", http.Header{"Content-Type": {"application/grpc"}})
			assert.Equal(t, tc.calls, up.n.Load())

			route := `route_name="rpc"`
			_, n := f.m.Select(t, "outbound_grpc_route_request_statuses_total", route, `grpc_status="UNKNOWN"`, `error=""`)
			assert.Equal(t, 1.0, n)
			_, n = f.m.Select(t, "outbound_grpc_route_backend_response_statuses_total", route, `grpc_status="UNKNOWN"`, `error=""`)
			assert.Equal(t, float64(tc.calls), n)
			_, n = f.m.Select(t, "outbound_grpc_route_retry_requests_total", route)
			assert.Equal(t, float64(tc.calls-1), n)
		})
	}
}
