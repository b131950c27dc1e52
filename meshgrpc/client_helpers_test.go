package meshgrpc_test

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/inmesh/inmesh/profiles"
)

// TestMain checks that no test of the package leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	books       = "books.default.svc.cluster.local:7000"
	booksTarget = "inmesh:///" + books
	authors     = "authors.default.svc.cluster.local:7000"
)

// app is a real gRPC server on loopback: it counts its calls and answers
// them with handle (nil: OK).
type app struct {
	testgrpc.UnimplementedTestServiceServer
	addr   netip.AddrPort
	calls  atomic.Int64
	handle func(ctx context.Context, n int64) error
}

func (a *app) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	n := a.calls.Add(1)
	if a.handle != nil {
		if err := a.handle(ctx, n); err != nil {
			return nil, err
		}
	}
	return &testgrpc.Empty{}, nil
}

func (a *app) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	n := a.calls.Add(1)
	if a.handle != nil {
		if err := a.handle(s.Context(), n); err != nil {
			return err
		}
	}
	return s.Send(&testgrpc.StreamingOutputCallResponse{})
}

// startApp serves a on 127.0.0.1 (with creds when not nil) until the test
// ends.
func startApp(t testing.TB, a *app, creds credentials.TransportCredentials) *app {
	t.Helper()
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	a.addr = serveTestService(t, a, opts...)
	return a
}

// serveTestService serves srv as the TestService on loopback until the
// test ends and returns its address.
func serveTestService(t testing.TB, srv testgrpc.TestServiceServer, opts ...grpc.ServerOption) netip.AddrPort {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(opts...)
	testgrpc.RegisterTestServiceServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return netip.MustParseAddrPort(lis.Addr().String())
}

// serveStore serves the embedded control plane over store on loopback
// and returns a Destination client of it.
func serveStore(t testing.TB, store *controlplane.Store, opts ...destination.Option) *destination.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store).Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	dst, err := destination.Dial(lis.Addr().String(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	return dst
}

func manifests(t testing.TB, store *controlplane.Store, yaml string) {
	t.Helper()
	res, err := manifest.Parse([]byte(yaml))
	require.NoError(t, err)
	store.SetManifests(res)
}

// setProfiles gives store the ServiceProfiles that yaml, one or more
// ServiceProfile documents, declares.
func setProfiles(t testing.TB, store *controlplane.Store, yaml string) {
	t.Helper()
	sps, err := profiles.ParseServiceProfiles([]byte(yaml))
	require.NoError(t, err)
	store.SetServiceProfiles(sps)
}

// dial makes a mesh channel to target.
func dial(t testing.TB, dst *destination.Client, opts ...meshgrpc.Option) testgrpc.TestServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(booksTarget, meshgrpc.DialOptions(dst, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

const booksService = `
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec: {ports: [{port: 7000}]}
`

// dialRefusedCounted returns a Destination client of the control plane at
// addr that tries again every 20ms, and a channel that receives a value
// (when it has room) for each dial of the control plane that failed.
func dialRefusedCounted(t testing.TB, addr string, opts ...destination.Option) (*destination.Client, <-chan struct{}) {
	t.Helper()
	refused := make(chan struct{}, 64)
	var d net.Dialer
	dialCP := func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, a)
		if err != nil {
			select {
			case refused <- struct{}{}:
			default:
			}
		}
		return c, err
	}
	fast, err := backoff.Fixed(20 * time.Millisecond)
	require.NoError(t, err)
	dst, err := destination.Dial(addr, append(opts, destination.WithLogger(quiet), destination.WithBackoff(fast),
		destination.WithDialFunc(dialCP))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	return dst, refused
}
