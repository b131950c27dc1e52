package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/meshgrpc"
)

// grpcHedgeManifests are hedgeManifests for gRPC: the same two Services,
// each with a GRPCRoute; the hedged one is marked idempotent, which gRPC
// calls must be to be hedged.
var grpcHedgeManifests = strings.NewReplacer(
	"kind: HTTPRoute", "kind: GRPCRoute",
	"name: http,", "name: grpc,",
	`hedge.inmesh.io/max-extra-load: "10%"`, `hedge.inmesh.io/max-extra-load: "10%"`+"\n    hedge.inmesh.io/idempotent: \"true\"",
).Replace(hedgeManifests)

// grpcHedgeEndpoint is one of three gRPC endpoint servers: as
// hedgeEndpoints' HTTP servers, it records which endpoints each call
// (x-request-id) reached and stalls the first arrival of a call marked
// x-stall.
type grpcHedgeEndpoint struct {
	testgrpc.UnimplementedTestServiceServer
	h *hedgeEndpoints
	i int
}

func (e *grpcHedgeEndpoint) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	id := ""
	if v := md.Get("x-request-id"); len(v) > 0 {
		id = v[0]
	}
	e.h.mu.Lock()
	e.h.seen[id] = append(e.h.seen[id], e.i)
	e.h.total++
	first := len(e.h.seen[id]) == 1
	e.h.mu.Unlock()
	if first && len(md.Get("x-stall")) > 0 {
		// A stalled call of the hedged Service holds its endpoint until
		// its hedge wins and cancels it (or 2 s pass), so that a hedge
		// the loaded machine was slow to deliver still arrives and is
		// counted; the plain Service's stall is hedgeStall.
		stall := hedgeStall
		if strings.HasPrefix(id, "grpc-hedged") {
			stall = 20 * hedgeStall
		}
		t := time.NewTimer(stall)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	return &testgrpc.Empty{}, nil
}

// grpcHedgeRun makes hedgeRequests calls one after the other on c and
// returns their latencies; every hedgeEvery-th stalls.
func grpcHedgeRun(t *testing.T, c testgrpc.TestServiceClient, prefix string) []time.Duration {
	t.Helper()
	lat := make([]time.Duration, 0, hedgeRequests)
	for i := range hedgeRequests {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		ctx = metadata.AppendToOutgoingContext(ctx, "x-request-id", fmt.Sprintf("%s-%d", prefix, i))
		if i%hedgeEvery == hedgeEvery-1 {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-stall", "1")
		}
		start := time.Now()
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		lat = append(lat, time.Since(start))
		cancel()
		require.NoError(t, err)
	}
	return lat
}

// The hedging scenario through meshgrpc over the embedded control
// plane's manifests: the GRPCRoute's hedge.inmesh.io annotations reach a
// grpc-go client, whose calls to the hedged Service are hedged to another
// endpoint, within the share of extra load, and never to one endpoint
// twice; those to the plain Service are sent once each. The p99 of each is
// logged (wall-clock figures are measurements, not assertions here).
func TestHedgeThroughMeshgrpc(t *testing.T) {
	bin := build(t)
	h := &hedgeEndpoints{seen: make(map[string][]int)}
	for i := range 3 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		srv := grpc.NewServer()
		testgrpc.RegisterTestServiceServer(srv, &grpcHedgeEndpoint{h: h, i: i})
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		h.addrs = append(h.addrs, lis.Addr().String())
	}
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(policies, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(policies, "hedge.yaml"), []byte(grpcHedgeManifests), 0o644))
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte(hedgeEndpointsFile(h.addrs)), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0",
		"-endpoints", endpoints, "-policies", policies, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)

	dc, err := destination.Dial(dstAddr, destination.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer dc.Close()
	opts := meshgrpc.DialOptions(dc, meshgrpc.WithMeterProvider(noop.NewMeterProvider()),
		meshgrpc.WithLogger(slog.New(slog.DiscardHandler)), meshgrpc.WithDiscoveryWait(timeout))
	channel := func(authority string) testgrpc.TestServiceClient {
		cc, err := grpc.NewClient("inmesh:///"+authority, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cc.Close() })
		return testgrpc.NewTestServiceClient(cc)
	}

	plain := grpcHedgeRun(t, channel(hedgePlainSvc), "grpc-plain")
	hedged := grpcHedgeRun(t, channel(hedgeHedgedSvc), "grpc-hedged")
	p99Plain, p99Hedged := hedgeP99(plain), hedgeP99(hedged)
	t.Logf("p99 without hedging %v, with %v (ratio %.2f); slowest hedged: %v", p99Plain, p99Hedged,
		float64(p99Hedged)/float64(p99Plain), slowest(hedged, 6))
	served, twice := h.stats("grpc-plain")
	assert.Equal(t, hedgeRequests, served, "the plain route sends each call once")
	assert.Empty(t, twice)
	served, twice = h.stats("grpc-hedged")
	extra := float64(served-hedgeRequests) / hedgeRequests
	t.Logf("extra load %.2f%% (%d hedges)", 100*extra, served-hedgeRequests)
	assert.GreaterOrEqual(t, served-hedgeRequests, hedgeRequests/hedgeEvery, "every stalled call was hedged")
	assert.LessOrEqual(t, extra, hedgeShare+0.01, "extra load within the share plus 1%%")
	assert.Empty(t, twice, "no call sent twice to one endpoint")
}
