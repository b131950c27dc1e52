package mesh

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const (
	grpcSvc = "grpc.default.svc.cluster.local:7000"
	// grpcSlow is the same server under a profile whose one route times
	// out after grpcRouteTimeout.
	grpcSlow         = "slow.default.svc.cluster.local:7000"
	grpcRouteTimeout = 200 * time.Millisecond
	// grpcEmpty is a service that exists without endpoints.
	grpcEmpty = "empty.default.svc.cluster.local:7000"
	// largeMessage is the size of the messages of the large-message test:
	// gRPC's default limit, which the test raises on both sides.
	largeMessage = 4 << 20
)

// grpcApp is a TestService whose handlers report what they saw: the
// deadline of each call, and the end of the calls that wait for their
// client to go away.
type grpcApp struct {
	testgrpc.UnimplementedTestServiceServer
	deadline  chan time.Duration
	cancelled chan error
	sent      atomic.Int64 // messages sent by StreamingOutputCall
}

func newGRPCApp() *grpcApp {
	return &grpcApp{deadline: make(chan time.Duration, 1), cancelled: make(chan error, 1)}
}

func (a *grpcApp) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func (a *grpcApp) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if d, ok := ctx.Deadline(); ok {
		select {
		case a.deadline <- time.Until(d):
		default:
		}
	}
	if req.GetResponseStatus() != nil {
		return nil, status.Error(codes.Code(req.ResponseStatus.Code), req.ResponseStatus.Message)
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t-"+string(req.GetPayload().GetBody()[:1])))
	return &testgrpc.SimpleResponse{Payload: &testgrpc.Payload{Body: bytes.Repeat([]byte{'r'}, int(req.ResponseSize))}}, nil
}

// FullDuplexCall echoes each message, and reports how the call ended when
// its client cancels it.
func (a *grpcApp) FullDuplexCall(stream testgrpc.TestService_FullDuplexCallServer) error {
	for {
		in, err := stream.Recv()
		if err != nil {
			a.cancelled <- stream.Context().Err()
			return err
		}
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: in.Payload}); err != nil {
			return err
		}
	}
}

// StreamingOutputCall sends the requested messages, counting each one sent;
// with an interval it waits that long before each.
func (a *grpcApp) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, stream testgrpc.TestService_StreamingOutputCallServer) error {
	for _, p := range req.ResponseParameters {
		if p.IntervalUs > 0 {
			select {
			case <-time.After(time.Duration(p.IntervalUs) * time.Microsecond):
			case <-stream.Context().Done():
				return stream.Context().Err()
			}
		}
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: make([]byte, p.Size)}}); err != nil {
			return err
		}
		a.sent.Add(1)
	}
	return nil
}

// grpcMesh is an inmesh peer pair carrying a grpc-go client's calls: the
// client speaks h2c to a reverse proxy over NewClient, which reaches the
// server's NewServer as a mesh peer (h2 hint). NewServer's application is
// a grpc.Server used as an http.Handler, or the plain handler raw for
// requests that are not gRPC.
func grpcMesh(t *testing.T, app *grpcApp, raw http.Handler) (*grpc.ClientConn, func(authority string) *grpc.ClientConn, *Client) {
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(2 * largeMessage))
	testgrpc.RegisterTestServiceServer(gs, app)
	t.Cleanup(gs.Stop)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			gs.ServeHTTP(w, r)
			return
		}
		raw.ServeHTTP(w, r)
	})
	noMetrics := WithMeterProvider(noop.NewMeterProvider())
	server := NewServer(handler, noMetrics, WithLogger(quiet))
	t.Cleanup(server.Close)
	inbound := serveH2C(t, server)

	peer := []endpoint.Endpoint{{Addr: netip.MustParseAddrPort(inbound), H2: true}}
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{grpcSvc: peer, grpcSlow: peer, grpcEmpty: nil})
	require.NoError(t, err)
	sps, err := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: slow.default.svc.cluster.local}
spec:
  routes:
  - name: StreamingOutputCall
    condition: {method: POST, pathRegex: '/grpc\.testing\.TestService/StreamingOutputCall'}
    timeout: 200ms
`))
	require.NoError(t, err)
	client := NewClient(WithEndpoints(eps), WithProfiles(profiles.NewStaticSource(map[string]*profiles.Profile{
		grpcSlow: sps[0].ProfileFor(7000),
	})), noMetrics, WithLogger(quiet), WithBalancerOptions(balancer.WithFallback(false)))
	t.Cleanup(client.Close)
	outbound := serveProxy(t, client)
	dial := func(authority string) *grpc.ClientConn {
		cc, err := grpc.NewClient("passthrough:///"+outbound, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithAuthority(authority), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(2*largeMessage)))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	return dial(grpcSvc), dial, client
}

// serveProxy serves a reverse proxy over rt (HTTP/1 and h2c), as a
// program forwards its application's requests to the outbound stack, and
// returns its address.
func serveProxy(t testing.TB, rt http.RoundTripper) string {
	return serveH2C(t, &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", pr.In.Host
			pr.Out.Host = pr.In.Host
		},
		Transport: rt,
		ErrorLog:  quietLog,
	})
}

var quietLog = log.New(io.Discard, "", 0)

// serveH2C serves h on a held loopback port with origproto.NewServer
// (HTTP/1 and h2c) and returns its address.
func serveH2C(t testing.TB, h http.Handler) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := origproto.NewServer(h)
	srv.ErrorLog = quietLog
	go srv.Serve(origproto.GuardListener(lis))
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

// A call's messages of 4 MiB each way, its trailers and its deadline
// (grpc-timeout) cross the peers intact.
func TestGRPCLargeMessagesTrailersAndDeadline(t *testing.T) {
	app := newGRPCApp()
	cc, _, _ := grpcMesh(t, app, http.NotFoundHandler())
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	var trailer metadata.MD
	body := append([]byte{'q'}, make([]byte, largeMessage-1)...)
	resp, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{
		ResponseSize: largeMessage, Payload: &testgrpc.Payload{Body: body},
	}, grpc.Trailer(&trailer))
	require.NoError(t, err)
	assert.Len(t, resp.Payload.Body, largeMessage)
	assert.Equal(t, []string{"t-q"}, trailer.Get("x-trailer"), "the server's trailer")
	select {
	case d := <-app.deadline:
		assert.Greater(t, d, time.Duration(0))
		assert.LessOrEqual(t, d, testutil.Timeout, "the server's deadline is the client's")
	default:
		t.Fatal("the call reached the server without its deadline (grpc-timeout)")
	}

	// A status with a message that needs percent-encoding, in trailers.
	_, err = testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{
		ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.FailedPrecondition), Message: "no\tlibros 100%"},
	})
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Equal(t, "no\tlibros 100%", status.Convert(err).Message())
}

// A bidirectional stream carries interleaved messages; when the client
// cancels it (RST_STREAM), the server's handler sees its context
// cancelled.
func TestGRPCStreamCancelReachesHandler(t *testing.T) {
	app := newGRPCApp()
	cc, _, _ := grpcMesh(t, app, http.NotFoundHandler())
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	stream, err := testgrpc.NewTestServiceClient(cc).FullDuplexCall(ctx)
	require.NoError(t, err)
	for _, m := range []string{"one", "two", "three"} {
		require.NoError(t, stream.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte(m)}}))
		got, err := stream.Recv()
		require.NoError(t, err)
		assert.Equal(t, m, string(got.Payload.Body), "each answer before the next message")
	}
	cancel()
	select {
	case err := <-app.cancelled:
		assert.ErrorIs(t, err, context.Canceled, "the handler's context")
	case <-time.After(testutil.Timeout):
		t.Fatal("the handler never saw its client cancel")
	}
}

// A stream the server resets (a handler aborting mid-body, RST_STREAM)
// ends in an error for a plain HTTP/2 request's client through the peer
// pair, not in a truncated success.
func TestHTTP2ServerResetReachesClient(t *testing.T) {
	raw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{grpcSvc: {{Addr: netip.MustParseAddrPort(meshInbound(t, raw)), H2: true}}})
	require.NoError(t, err)
	client := NewClient(WithEndpoints(eps), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer client.Close()
	req, err := http.NewRequest(http.MethodPost, "http://"+grpcSvc+"/reset", strings.NewReader("x"))
	require.NoError(t, err)
	req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/2.0", 2, 0
	resp, err := client.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 2, resp.ProtoMajor, "the request crossed as HTTP/2")
	_, err = io.ReadAll(resp.Body)
	assert.Error(t, err, "the reset reaches the client")
}

// meshInbound serves h behind NewServer and returns the address.
func meshInbound(t *testing.T, h http.Handler) string {
	server := NewServer(h, WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	t.Cleanup(server.Close)
	return serveH2C(t, server)
}

// A client that stops reading holds back its server: HTTP/2 flow control
// works across both hops, so the proxies buffer a bounded amount of a
// 64 MiB stream rather than all of it.
func TestGRPCFlowControlUnderSlowReader(t *testing.T) {
	const messages, size = 64, 1 << 20
	app := newGRPCApp()
	cc, _, _ := grpcMesh(t, app, http.NotFoundHandler())
	// 64 MiB through two proxies under the race detector takes about 4 s
	// on an idle 2-core machine, and several times that beside the rest
	// of the suite: the deadline is for a hang, not a speed.
	ctx, cancel := context.WithTimeout(context.Background(), 6*testutil.Timeout)
	defer cancel()
	params := make([]*testgrpc.ResponseParameters, messages)
	for i := range params {
		params[i] = &testgrpc.ResponseParameters{Size: size}
	}
	stream, err := testgrpc.NewTestServiceClient(cc).StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{ResponseParameters: params})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)
	// The windows along the path (client, both proxies, server) hold a few
	// MiB each; without flow control the server would send all 64.
	const bound = 32
	assert.Never(t, func() bool { return app.sent.Load() > bound }, time.Second, 10*time.Millisecond,
		"the server ran ahead of its reader")
	got := 1
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.Len(t, m.Payload.Body, size)
		got++
	}
	assert.Equal(t, messages, got)
}

// Errors the mesh answers itself reach a gRPC client as gRPC statuses, as
// Linkerd's proxy answers them: a route timeout is DEADLINE_EXCEEDED, a
// service without endpoints UNAVAILABLE.
func TestGRPCProxyErrorsAreStatuses(t *testing.T) {
	app := newGRPCApp()
	_, dial, client := grpcMesh(t, app, http.NotFoundHandler())
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()

	// Discovery never blocks: the first call watches the authority, and
	// the route applies once its profile is in.
	slow := dial(grpcSlow)
	_, _ = testgrpc.NewTestServiceClient(slow).EmptyCall(ctx, &testgrpc.Empty{})
	probe, err := http.NewRequest(http.MethodPost, "http://"+grpcSlow+"/grpc.testing.TestService/StreamingOutputCall", nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return client.Router().Explain(probe).Route == "StreamingOutputCall" },
		testutil.Timeout, 5*time.Millisecond)
	stream, err := testgrpc.NewTestServiceClient(slow).StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{
		ResponseParameters: []*testgrpc.ResponseParameters{{Size: 1, IntervalUs: int32((50 * grpcRouteTimeout).Microseconds())}},
	})
	require.NoError(t, err)
	_, err = stream.Recv()
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.NoError(t, ctx.Err(), "the route's timeout fired, not the client's deadline")

	// A service without endpoints: the call waits in the balancer's queue
	// for the failfast timeout (3 s by default), then fails fast with
	// DEADLINE_EXCEEDED, as Linkerd's proxy answers a fail-fast (504).
	_, err = testgrpc.NewTestServiceClient(dial(grpcEmpty)).EmptyCall(ctx, &testgrpc.Empty{})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "fail-fast: no endpoints")
}

// A net/http-based gRPC client (as connect-go builds its requests:
// ProtoMajor 1, content-type application/grpc) calls through NewClient
// straight into a grpc.Server behind NewServer: the call crosses as HTTP/2
// and its status arrives in the trailers.
func TestGRPCFromNetHTTPClient(t *testing.T) {
	app := newGRPCApp()
	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, app)
	defer gs.Stop()
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		grpcSvc: {{Addr: netip.MustParseAddrPort(meshInbound(t, gs)), H2: true}},
	})
	require.NoError(t, err)
	client := NewClient(WithEndpoints(eps), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer client.Close()

	// One length-prefixed message: an empty testgrpc.Empty.
	req, err := http.NewRequest(http.MethodPost, "http://"+grpcSvc+"/grpc.testing.TestService/EmptyCall",
		bytes.NewReader([]byte{0, 0, 0, 0, 0}))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := (&http.Client{Transport: client, Timeout: testutil.Timeout}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, 2, resp.ProtoMajor, "HTTP/2 end to end")
	assert.Equal(t, []byte{0, 0, 0, 0, 0}, body, "one empty message back")
	assert.Equal(t, "0", resp.Trailer.Get("Grpc-Status"), "OK, in the trailers")
}
