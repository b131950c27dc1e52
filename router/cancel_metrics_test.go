package router

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request the application gives up has the outbound_*_route_* series
// Linkerd's proxy records for it. The cases are those of linkerd2-proxy
// linkerd/app/outbound/src/http/logical/policy/route/metrics/tests.rs
// (http_ and grpc_response_body_drop_on_eos, http_ and
// grpc_response_body_drop_early), and the one its code decides without a
// test: a request dropped before its response head records no status and
// no duration, on the route and on the backend, as the futures of
// linkerd/http/prom src/status.rs and src/record_response.rs record only
// when they resolve (neither has a Drop), while the backend's request was
// counted when it was sent (src/count_reqs.rs). A response body dropped
// before its end is the head's status with the error UNKNOWN (the
// RequestCancelled of the drop is none of labels.rs's errors): never
// error="CANCEL", which is an HTTP/2 reset by the server. Each request is
// the first of a fresh router.
func TestCancelledRequestHasOutboundRouteSeriesAsLinkerd(t *testing.T) {
	for _, tc := range []struct {
		name   string
		grpc   bool
		head   bool     // the upstream sends a head and a chunk of body first
		cancel bool     // the caller cancels; else it reads to the end
		want   []string // matchers of the one status series; nil: none
	}{
		{name: "http, cancelled before the head", cancel: true},
		{name: "http_response_body_drop_early", head: true, cancel: true,
			want: []string{`http_status="200"`, `error="UNKNOWN"`}},
		{name: "http_response_body_drop_on_eos", head: true,
			want: []string{`http_status="200"`, `error=""`}},
		{name: "grpc, cancelled before the head", grpc: true, cancel: true},
		{name: "grpc_response_body_drop_early", grpc: true, head: true, cancel: true,
			want: []string{`grpc_status="UNKNOWN"`, `error="UNKNOWN"`}},
		{name: "grpc_response_body_drop_on_eos", grpc: true, head: true,
			want: []string{`grpc_status="OK"`, `error=""`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
				if tc.grpc && mode != testutil.H2C {
					t.Skip("gRPC is HTTP/2")
				}
				arrived := make(chan struct{}, 1)
				up := newUpstream(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
					if tc.grpc {
						w.Header().Set("Content-Type", "application/grpc")
					}
					if tc.head {
						w.WriteHeader(http.StatusOK)
						_, _ = io.WriteString(w, "contents")
						w.(http.Flusher).Flush()
					}
					if !tc.cancel {
						if tc.grpc {
							w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
						}
						return
					}
					arrived <- struct{}{}
					<-r.Context().Done()
				})
				fam, route := "outbound_http_route_", `route_name="web"`
				p := httpPolicy(policy.HTTPRule{Backends: to(up.backend("web"))})
				if tc.grpc {
					fam, route = "outbound_grpc_route_", `route_name="rpc"`
					p = &policy.Policy{Parent: parentMeta, Protocol: policy.ProtocolGRPC, GRPC: policy.GRPCProtocol{Routes: []policy.GRPCRoute{{
						Meta:  policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Namespace: "ns", Name: "rpc"},
						Rules: []policy.GRPCRule{{Backends: to(up.backend("web"))}},
					}}}}
				}
				f := newFixture(t, mode, p)

				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				method, url := http.MethodGet, "http://svc.test/slow"
				if tc.grpc {
					method, url = http.MethodPost, "http://svc.test/pkg.Svc/Call"
				}
				req, err := http.NewRequestWithContext(ctx, method, url, nil)
				require.NoError(t, err)
				if tc.grpc {
					req.Header.Set("Content-Type", "application/grpc")
				}
				head := make(chan struct{})
				errc := make(chan error, 1)
				go func() {
					resp, err := f.client.Do(req)
					close(head)
					if err == nil {
						_, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
					errc <- err
				}()
				if tc.cancel {
					testutil.Recv(t, arrived, "the request upstream")
					if tc.head {
						testutil.Recv(t, head, "the response head") // the caller reads the body
					}
					cancel()
					require.ErrorIs(t, testutil.Recv(t, errc, "the caller's error"), context.Canceled)
				} else {
					require.NoError(t, testutil.Recv(t, errc, "the response"))
				}

				// What `linkerd viz stat-outbound` reads: the route's and
				// the backend's statuses (error!="" a failure) and
				// latencies.
				for _, name := range []string{fam + "request_statuses_total", fam + "backend_response_statuses_total"} {
					lines, sum := f.m.Select(t, name, route)
					_, failures := f.m.Select(t, name, route, `error!=""`)
					if tc.want == nil {
						assert.Empty(t, lines, "%s: a response nobody received", name)
						assert.Zero(t, failures, name)
						continue
					}
					assert.Equal(t, 1.0, sum, "%s: %v", name, lines)
					_, n := f.m.Select(t, name, append([]string{route}, tc.want...)...)
					assert.Equal(t, 1.0, n, "%s: %v", name, lines)
				}
				for _, name := range []string{fam + "request_duration_seconds_count", fam + "backend_response_duration_seconds_count"} {
					lines, n := f.m.Select(t, name, route)
					if tc.want == nil {
						assert.Empty(t, lines, name)
					} else {
						assert.Equal(t, 1.0, n, "%s: %v", name, lines)
					}
				}
				_, sent := f.m.Select(t, fam+"backend_requests_total", route)
				assert.Equal(t, 1.0, sent, "the request was sent to the backend")
			})
		})
	}
}
