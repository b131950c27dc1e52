package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/interop"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
)

const (
	interopService = "interop.default.svc.cluster.local:7000"
	// slowService reaches the same server under a ServiceProfile whose one
	// route times out after slowTimeout.
	slowService = "slow.default.svc.cluster.local:7000"
	slowTimeout = 300 * time.Millisecond
)

const slowProfile = `apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: slow.default.svc.cluster.local
spec:
  routes:
  - name: StreamingOutputCall
    condition: {method: POST, pathRegex: '/grpc\.testing\.TestService/StreamingOutputCall'}
    timeout: 300ms
`

// grpc-go's interop cases report a failure through grpclog's Fatal, which
// exits the process; this logger turns it into a panic that runInterop
// recovers and reports as the case's failure.
func init() {
	grpclog.SetLoggerV2(panicOnFatal{grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr)})
}

type panicOnFatal struct{ grpclog.LoggerV2 }

func (panicOnFatal) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (panicOnFatal) Fatalln(args ...any)               { panic(fmt.Sprint(args...)) }
func (panicOnFatal) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// interopCases are the cases of grpc-go's interop suite (package
// google.golang.org/grpc/interop, as its client's -test_case names them)
// that need no credentials and no special server: unary and streaming
// calls both ways, deadlines, cancellation both ways, status codes and
// messages, unknown methods, and metadata in headers and trailers.
var interopCases = []struct {
	name string
	run  func(ctx context.Context, cc *grpc.ClientConn)
}{
	{"empty_unary", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoEmptyUnaryCall(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"large_unary", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoLargeUnaryCall(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"client_streaming", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoClientStreaming(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"server_streaming", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoServerStreaming(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"ping_pong", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoPingPong(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"empty_stream", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoEmptyStream(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"timeout_on_sleeping_server", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoTimeoutOnSleepingServer(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"cancel_after_begin", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoCancelAfterBegin(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"cancel_after_first_response", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoCancelAfterFirstResponse(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"status_code_and_message", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoStatusCodeAndMessage(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"special_status_message", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoSpecialStatusMessage(ctx, testgrpc.NewTestServiceClient(cc))
	}},
	{"unimplemented_method", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoUnimplementedMethod(ctx, cc)
	}},
	{"custom_metadata", func(ctx context.Context, cc *grpc.ClientConn) {
		interop.DoCustomMetadata(ctx, testgrpc.NewTestServiceClient(cc))
	}},
}

// runInterop runs every interop case on a plain grpc-go client that
// reaches addr (an outbound listener) with authority as :authority.
func runInterop(t *testing.T, addr, authority string) {
	runInteropOn(t, dialVia(t, addr, authority))
}

// runInteropOn runs every interop case on cc.
func runInteropOn(t *testing.T, cc *grpc.ClientConn) {
	for _, c := range interopCases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s failed: %v", c.name, p)
				}
			}()
			c.run(ctx, cc)
		})
	}
}

// dialVia returns a plain grpc-go client (h2c with prior knowledge, no
// resolver: the address is an IP literal) whose calls carry authority.
func dialVia(t *testing.T, addr, authority string) *grpc.ClientConn {
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority(authority))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return cc
}

// interopServer serves grpc-go's interop test service on a held loopback
// port and returns the server and its address.
func interopServer(t *testing.T) (*grpc.Server, string) {
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, interop.NewTestServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(lis)
	// GracefulStop waits for the handlers, the slow one's included.
	t.Cleanup(srv.GracefulStop)
	return srv, lis.Addr().String()
}

// assertRouteTimeout calls a server-streaming method whose first message
// the server sends only after 3s, ten times the route's timeout, on the
// slow service: the client reads the proxy's answer as DEADLINE_EXCEEDED,
// well before its own deadline.
func assertRouteTimeout(t *testing.T, cc *grpc.ClientConn) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stream, err := testgrpc.NewTestServiceClient(cc).StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{
		ResponseParameters: []*testgrpc.ResponseParameters{{Size: 1, IntervalUs: int32((10 * slowTimeout).Microseconds())}},
	})
	require.NoError(t, err)
	_, err = stream.Recv()
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.NoError(t, ctx.Err(), "the client's own deadline fired, not the route's")
}

// grpc-go's interop cases pass with a plain grpc-go client and server
// through the proxy pair: the client speaks h2c to proxy A's outbound
// listener, which carries the calls as HTTP/2 over its one connection to
// proxy B, which forwards them to the server as h2c. A route timeout is a
// gRPC DEADLINE_EXCEEDED for the client.
func TestGRPCInteropThroughProxyPair(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "slow.yaml"), []byte(slowProfile), 0o644))
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644))

	_, appAddr := interopServer(t)
	dst := start(t, filepath.Join(bin, "destination"), nil,
		"-listen", "127.0.0.1:0", "-profiles", profiles, "-endpoints", endpoints, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)
	_, _, bIn, bMetrics := startProxy(t, bin, dstAddr, appAddr)
	var eps string
	for _, a := range []string{interopService, slowService} {
		eps += fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n", a, bIn)
	}
	require.NoError(t, os.WriteFile(endpoints, []byte(eps), 0o644))
	dst.waitLog(t, loadedEndpointsRe)
	_, aOut, _, aMetrics := startProxy(t, bin, dstAddr, appAddr)
	for _, addr := range []string{aMetrics, bMetrics} {
		require.Eventually(t, func() bool {
			resp, err := http.Get("http://" + addr + "/ready")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		}, timeout, 20*time.Millisecond)
	}

	runInterop(t, aOut, interopService)

	slow := dialVia(t, aOut, slowService)
	// The profile reaches proxy A: its route's timeout then applies.
	require.Eventually(t, func() bool {
		_, ok := metric(scrape(t, aMetrics), "route_request_total", `rt_route="StreamingOutputCall"`)
		if !ok {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			stream, err := testgrpc.NewTestServiceClient(slow).StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
			if err == nil {
				_, _ = stream.Recv()
			}
		}
		return ok
	}, timeout, 50*time.Millisecond, "the slow service's profile never arrived")
	assertRouteTimeout(t, slow)

	// Every call crossed the peers as HTTP/2 on one connection.
	opened, _ := metric(scrape(t, bMetrics), "tcp_open_total", `direction="inbound"`)
	assert.Equal(t, 1.0, opened, "connections from proxy A to proxy B")
}

// grpc-go's interop cases pass against a grpc.Server used as the
// application handler of mesh.NewServer, called from an inmesh peer: a
// plain grpc-go client reaches a reverse proxy over mesh.NewClient, whose
// balancer has the server as a mesh peer (h2 hint).
func TestGRPCInteropIntoMeshServer(t *testing.T) {
	noMetrics := mesh.WithMeterProvider(noop.NewMeterProvider())
	app := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(app, interop.NewTestServer())
	defer app.Stop()
	server := mesh.NewServer(app, noMetrics)
	defer server.Close()
	inbound := serveH2C(t, server)

	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		interopService: {{Addr: netip.MustParseAddrPort(inbound), H2: true}},
	})
	require.NoError(t, err)
	client := mesh.NewClient(mesh.WithEndpoints(src), noMetrics, mesh.WithBalancerOptions(balancer.WithFallback(false)))
	defer client.Close()
	outbound := serveH2C(t, &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", pr.In.Host
			pr.Out.Host = pr.In.Host
		},
		Transport: client,
	})

	runInterop(t, outbound, interopService)
}

// serveH2C serves h on a held loopback port with origproto.NewServer
// (HTTP/1 and h2c) and returns its address.
func serveH2C(t *testing.T, h http.Handler) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := origproto.NewServer(h)
	go srv.Serve(origproto.GuardListener(lis))
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}
