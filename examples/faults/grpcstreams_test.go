package faults

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/interop"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

const interopService = "interop.default.svc.cluster.local:7000"

// interopClient is a plain grpc-go client (h2c with prior knowledge, no
// resolver) of the interop service through the outbound listener addr.
func interopClient(t *testing.T, addr string) (*grpc.ClientConn, testgrpc.TestServiceClient) {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority(interopService))
	require.NoError(t, err)
	return cc, testgrpc.NewTestServiceClient(cc)
}

// openStream opens a bidirectional stream and waits for its first answer:
// the stream then spans both proxies and the server.
func openStream(ctx context.Context, c testgrpc.TestServiceClient) error {
	s, err := c.FullDuplexCall(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(&testgrpc.StreamingOutputCallRequest{ResponseParameters: []*testgrpc.ResponseParameters{{Size: 1}}}); err != nil {
		return err
	}
	_, err = s.Recv()
	return err
}

// 1,000 gRPC streams (10,000 with INMESH_FULL=1) from a grpc-go client
// through the proxy pair (examples/proxy, outbound then inbound) to a
// grpc-go server, all open at once, then all cancelled by the client: the
// proxies' goroutines (go_goroutines on their admin listener) come back to
// their baseline and an ordinary call still succeeds.
func TestGRPCStreamAbuse(t *testing.T) {
	app := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(app, interop.NewTestServer())
	appLis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go app.Serve(appLis)
	t.Cleanup(app.Stop)

	endpoints := filepath.Join(t.TempDir(), "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644))
	dst := start(t, "destination", nil, "-listen", "127.0.0.1:0", "-endpoints", endpoints, "-interval", "100ms")
	dstAddr := dst.addr(t, "grpc")
	proxy := func() *proc {
		return start(t, "proxy", []string{"INMESH_CONTROL_BACKOFF_DELAY=100ms"}, "-destination", dstAddr,
			"-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-app", appLis.Addr().String())
	}
	b := proxy()
	bIn, bMetrics := b.addr(t, "inbound"), b.addr(t, "metrics")
	writeFile(t, endpoints, fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n", interopService, bIn))
	waitEndpoint(t, dstAddr, interopService, bIn)
	a := proxy()
	aOut, aMetrics := a.addr(t, "outbound"), a.addr(t, "metrics")

	probeConn, probe := interopClient(t, aOut)
	defer probeConn.Close()
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := probe.EmptyCall(ctx, &testgrpc.Empty{})
		return err
	}
	require.Eventually(t, func() bool { return call() == nil }, timeout, 50*time.Millisecond, "the interop service never answered")

	// Warm up the paths the streams take, then the baseline.
	for range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, openStream(ctx, probe))
		cancel()
	}
	var baseA, baseB usage
	require.Eventually(t, func() bool {
		baseA, baseB = usageOf(t, a.pid(), aMetrics), usageOf(t, b.pid(), bMetrics)
		return baseA.goroutines >= 0 && baseB.goroutines >= 0
	}, timeout, 50*time.Millisecond, "the proxies export no go_goroutines")
	t.Logf("baseline: proxy A %v; proxy B %v", baseA, baseB)

	// 200 streams per client connection, under the proxies' 250 streams
	// per HTTP/2 connection.
	n := size(10000, 1000)
	const perConn = 200
	var clients []testgrpc.TestServiceClient
	var conns []*grpc.ClientConn
	for range (n + perConn - 1) / perConn {
		cc, c := interopClient(t, aOut)
		conns = append(conns, cc)
		clients = append(clients, c)
	}
	var opened, done sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	release := make(chan struct{})
	start := time.Now()
	for i := range n {
		opened.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := openStream(ctx, clients[i/perConn]); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			opened.Done()
			<-release
		}()
	}
	opened.Wait()
	t.Logf("%d streams open in %v (%d failed, first: %v); proxy A %v; proxy B %v", n, time.Since(start).Round(time.Millisecond),
		failed.Load(), firstErr.Load(), usageOf(t, a.pid(), aMetrics), usageOf(t, b.pid(), bMetrics))
	close(release)
	done.Wait()
	for _, cc := range conns {
		cc.Close()
	}
	assert.Zero(t, failed.Load(), "streams that did not open, first: %v", firstErr.Load())

	// Back means no goroutine per stream left: 20 more at most, and two
	// for each connection still open (proxy A keeps the connections to
	// proxy B it opened for the burst, 250 streams each, in its pool).
	back := func(base, now usage) bool {
		return now.goroutines <= base.goroutines+20+2*max(0, now.fds-base.fds)
	}
	var nowA, nowB usage
	calls := 0
	assert.Eventually(t, func() bool {
		if call() != nil {
			calls++
		}
		nowA, nowB = usageOf(t, a.pid(), aMetrics), usageOf(t, b.pid(), bMetrics)
		return back(baseA, nowA) && back(baseB, nowB)
	}, 30*time.Second, 100*time.Millisecond, "not back: proxy A %v (baseline %v); proxy B %v (baseline %v)", nowA, baseA, nowB, baseB)
	t.Logf("after: proxy A %v; proxy B %v", nowA, nowB)
	assert.Zero(t, calls, "calls failed after the streams")
	assert.NoError(t, call(), "an ordinary call after the streams")
}
