package router

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// grpcApp is a real gRPC server on loopback that counts its calls,
// remembers the metadata of the last and answers with code.
type grpcApp struct {
	testgrpc.UnimplementedTestServiceServer
	addr  netip.AddrPort
	calls atomic.Int64
	code  codes.Code
	mu    sync.Mutex
	md    metadata.MD
}

func (a *grpcApp) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	a.mu.Lock()
	a.md = md
	a.mu.Unlock()
	a.calls.Add(1)
	if a.code != codes.OK {
		return nil, status.Error(a.code, "mirror says no")
	}
	return &testgrpc.Empty{}, nil
}

func (a *grpcApp) last() metadata.MD {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.md
}

func startGRPCApp(t *testing.T, code codes.Code) *grpcApp {
	t.Helper()
	a := &grpcApp{code: code}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, a)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	a.addr = netip.MustParseAddrPort(lis.Addr().String())
	return a
}

func (a *grpcApp) meta(name string) policy.Metadata {
	return policy.Metadata{Kind: "Service", Namespace: "ns", Name: name, Port: a.addr.Port()}
}

// grpcThroughRouter returns a gRPC client whose calls go over h2c through
// a reverse proxy whose transport is f's router (the sidecar's path), to
// the authority of the fixture's policy.
func grpcThroughRouter(t *testing.T, f *fixture) testgrpc.TestServiceClient {
	t.Helper()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", authority, authority
		},
		Transport: f.r.Transport(testutil.NewTransport(t, testutil.H2C)),
	}
	srv := testutil.NewServer(t, proxy)
	cc, err := grpc.NewClient("passthrough:///"+strings.TrimPrefix(srv.URL, "http://"),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority(authority))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

// TestGRPCRequestMirrorConformance runs the cases of the Gateway API
// conformance tests grpcroute-request-mirror.go and
// mesh/grpcroute-request-mirror.go (kubernetes-sigs/gateway-api
// conformance/tests/), and a share as httproute-request-percentage-mirror
// has for HTTP, through the router to real gRPC servers: the call is
// answered by the primary, the mirror gets a copy with the rule's header
// modifiers applied, its answer (status OK, or not) is counted on
// outbound_grpc_route_mirror_requests_total and never reaches the caller.
func TestGRPCRequestMirrorConformance(t *testing.T) {
	modify := policy.Filter{RequestHeaders: &policy.HeaderModifier{
		Set:    []policy.Header{{Name: "X-Header-Set", Value: "set-overwrites-values"}},
		Add:    []policy.Header{{Name: "X-Header-Add", Value: "header-val-1"}, {Name: "X-Header-Add-Append", Value: "header-val-2"}},
		Remove: []string{"X-Header-Remove"},
	}}
	for _, tc := range []struct {
		source     string
		filters    bool
		ratio      [2]uint32
		mirrorCode codes.Code
		calls      int
		mirrored   int
		result     string
	}{
		{source: "grpcroute-request-mirror (mirror only)", calls: 10, mirrored: 10, result: "success"},
		{source: "grpcroute-request-mirror (mirror and modify headers)", filters: true, calls: 10, mirrored: 10, result: "success"},
		{source: "a share, as httproute-request-percentage-mirror", ratio: [2]uint32{25, 100}, calls: 100, mirrored: 25, result: "success"},
		{source: "a mirror that fails: the caller still gets OK", mirrorCode: codes.Unavailable, calls: 10, mirrored: 10, result: "failure"},
	} {
		t.Run(tc.source, func(t *testing.T) {
			primary, shadow := startGRPCApp(t, codes.OK), startGRPCApp(t, tc.mirrorCode)
			rule := policy.GRPCRule{
				Backends: to(policy.RouteBackend{Backend: policy.Backend{Meta: primary.meta("grpc-infra-backend-v1"),
					Forward: &endpoint.Endpoint{Addr: primary.addr}}, Weight: 1}),
				Mirrors: []policy.Mirror{{Meta: shadow.meta("grpc-infra-backend-v2"), Forward: &endpoint.Endpoint{Addr: shadow.addr},
					Ratio: policy.Ratio{Numerator: tc.ratio[0], Denominator: tc.ratio[1]}}},
			}
			if tc.filters {
				rule.Filters = []policy.Filter{modify}
			}
			gmeta := policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Namespace: "ns", Name: "grpc-request-mirror"}
			f := newFixture(t, testutil.H2C, &policy.Policy{Parent: parentMeta, Protocol: policy.ProtocolGRPC,
				GRPC: policy.GRPCProtocol{Routes: []policy.GRPCRoute{{Meta: gmeta, Rules: []policy.GRPCRule{rule}}}}})
			var draw atomic.Int64
			f.r.cfg.rand = func() float64 { return float64((draw.Add(1)*37)%100) / 100 }
			client := grpcThroughRouter(t, f)
			for range tc.calls {
				ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
				ctx = metadata.AppendToOutgoingContext(ctx, "x-header-remove", "remove-val", "x-header-add-append", "append-val-1")
				_, err := client.EmptyCall(ctx, &testgrpc.Empty{})
				cancel()
				require.NoError(t, err, "the caller gets the primary's answer")
			}
			assert.EqualValues(t, tc.calls, primary.calls.Load(), "the primary gets every call")
			require.Eventually(t, func() bool {
				return f.m.Value(t, "outbound_grpc_route_mirror_requests_total", `backend_name="grpc-infra-backend-v2"`, `result="`+tc.result+`"`) ==
					strconv.Itoa(tc.mirrored)
			}, testutil.Timeout, 5*time.Millisecond, "mirrored calls counted %s", tc.result)
			assert.EqualValues(t, tc.mirrored, shadow.calls.Load(), "the mirror gets its share")
			assert.Len(t, f.m.Lines(t, "outbound_grpc_route_mirror_requests_total", `route_name="grpc-request-mirror"`,
				`route_kind="GRPCRoute"`, `result="`+tc.result+`"`), 1, "the route's own series")
			for _, md := range []metadata.MD{primary.last(), shadow.last()} {
				if tc.filters {
					assert.Equal(t, []string{"set-overwrites-values"}, md.Get("x-header-set"))
					assert.Equal(t, []string{"header-val-1"}, md.Get("x-header-add"))
					assert.Equal(t, []string{"append-val-1", "header-val-2"}, md.Get("x-header-add-append"))
					assert.Empty(t, md.Get("x-header-remove"))
				} else {
					assert.Equal(t, []string{"remove-val"}, md.Get("x-header-remove"))
				}
			}
			req, err := http.NewRequest("POST", "http://"+authority+"/grpc.testing.TestService/EmptyCall", nil)
			require.NoError(t, err)
			req.ProtoMajor, req.Header["Content-Type"] = 2, []string{"application/grpc"}
			e := f.r.Explain(req)
			require.NotNil(t, e.Mirrors)
			assert.Equal(t, "grpc-infra-backend-v2", e.Mirrors.Mirrors[0].Name)
		})
	}
}
