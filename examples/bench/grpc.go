package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/meshgrpc"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/interop"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// grpcService is the authority the control plane names the gRPC server
// under.
const grpcService = "interop.default.svc.cluster.local:7000"

// grpcPair is one gRPC server per side (plain grpc-go and grpc-go with
// meshgrpc.ServerOptions, both serving grpc-go's interop TestService) and
// the clients of the comparison: plain grpc-go straight to the plain
// server, grpc-go's own round_robin over a manual resolver with no
// interceptors, and meshgrpc's DialOptions (resolver, balancer,
// interceptors, metrics; no mTLS) to the meshed server.
type grpcPair struct {
	plain, roundRobin, mesh testgrpc.TestServiceClient
	closers                 []func()
}

func (p *grpcPair) close() {
	for _, c := range slices.Backward(p.closers) {
		c()
	}
}

func newGRPCPair(mp metric.MeterProvider) (*grpcPair, error) {
	p := &grpcPair{}
	ok := false
	defer func() {
		if !ok {
			p.close()
		}
	}()
	serveGRPC := func(opts ...grpc.ServerOption) (string, error) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		s := grpc.NewServer(opts...)
		testgrpc.RegisterTestServiceServer(s, interop.NewTestServer())
		go s.Serve(lis)
		p.closers = append(p.closers, s.Stop)
		return lis.Addr().String(), nil
	}
	plainAddr, err := serveGRPC()
	if err != nil {
		return nil, err
	}
	meshAddr, err := serveGRPC(meshgrpc.ServerOptions(meshgrpc.WithMeterProvider(mp), meshgrpc.WithLogger(quiet))...)
	if err != nil {
		return nil, err
	}
	cp, err := newControlPlane()
	if err != nil {
		return nil, err
	}
	p.closers = append(p.closers, cp.close)
	cp.putEndpoints(grpcService, []string{meshAddr}, true, 1)

	dial := func(target string, opts ...grpc.DialOption) (testgrpc.TestServiceClient, error) {
		cc, err := grpc.NewClient(target, opts...)
		if err != nil {
			return nil, err
		}
		p.closers = append(p.closers, func() { cc.Close() })
		return testgrpc.NewTestServiceClient(cc), nil
	}
	insecureCreds := grpc.WithTransportCredentials(insecure.NewCredentials())
	if p.plain, err = dial("passthrough:///"+plainAddr, insecureCreds); err != nil {
		return nil, err
	}
	rr := manual.NewBuilderWithScheme("bench")
	rr.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: plainAddr}}})
	if p.roundRobin, err = dial("bench:///interop", insecureCreds, grpc.WithResolvers(rr),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`)); err != nil {
		return nil, err
	}
	if p.mesh, err = dial("inmesh:///"+grpcService, meshgrpc.DialOptions(cp.dst, meshgrpc.WithMeterProvider(mp), meshgrpc.WithLogger(quiet))...); err != nil {
		return nil, err
	}
	// Every client answers once before the measurement starts.
	for _, c := range []testgrpc.TestServiceClient{p.plain, p.roundRobin, p.mesh} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			return nil, err
		}
	}
	ok = true
	return p, nil
}

// unaryRequest is a small unary call: a 100-byte payload each way.
var unaryRequest = &testgrpc.SimpleRequest{ResponseSize: 100, Payload: &testgrpc.Payload{Body: make([]byte, 100)}}

// grpcSerial makes n unary calls one after the other.
func grpcSerial(c testgrpc.TestServiceClient, n int) (figures, error) {
	n = sized(n)
	lat := make([]time.Duration, n)
	ctx := context.Background()
	a := mallocs()
	start := time.Now()
	for i := range n {
		t0 := time.Now()
		if _, err := c.UnaryCall(ctx, unaryRequest); err != nil {
			return figures{}, err
		}
		lat[i] = time.Since(t0)
	}
	el := time.Since(start)
	f := figures{NsPerOp: float64(el.Nanoseconds()) / float64(n), Allocs: float64(mallocs()-a) / float64(n)}
	f.P50, f.P99 = percentiles(lat)
	return f, nil
}

// grpcParallel makes total unary calls from workers goroutines.
func grpcParallel(c testgrpc.TestServiceClient, total, workers int) (figures, error) {
	total = sized(total)
	var next atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	ctx := context.Background()
	a := mallocs()
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(total) {
				if _, err := c.UnaryCall(ctx, unaryRequest); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return figures{}, *e
	}
	return figures{RPS: float64(total) / time.Since(start).Seconds(), Allocs: float64(mallocs()-a) / float64(total)}, nil
}

// grpcUnary: grpc-go unary calls with meshgrpc on both sides against plain
// grpc-go to a plain server: p50 of serial calls and the throughput of 16
// concurrent callers; allocations per call beside grpc-go's own
// round_robin with no interceptors.
func grpcUnary(o options) (*result, error) {
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	p, err := newGRPCPair(mp)
	if err != nil {
		return nil, err
	}
	defer p.close()
	n, total := o.scale(3000, 500), o.scale(20000, 4000)
	const workers = 16
	const plain, rr, mesh, plainPar, meshPar = 0, 1, 2, 3, 4
	rs, err := interleave(o.rounds,
		variant{"plain", func() (figures, error) { return grpcSerial(p.plain, n) }},
		variant{"round_robin", func() (figures, error) { return grpcSerial(p.roundRobin, n) }},
		variant{"meshgrpc", func() (figures, error) { return grpcSerial(p.mesh, n) }},
		variant{"plain x16", func() (figures, error) { return grpcParallel(p.plain, total, workers) }},
		variant{"meshgrpc x16", func() (figures, error) { return grpcParallel(p.mesh, total, workers) }},
	)
	if err != nil {
		return nil, err
	}
	r := &result{
		ratio:     rs.ratio("", atMost(1.10), func(f []figures) float64 { return f[mesh].P50 / f[plain].P50 }),
		Candidate: rs.median(mesh), Baseline: rs.median(plain),
		Others: map[string]figures{
			"round_robin":  *rs.median(rr),
			"plain_x16":    *rs.median(plainPar),
			"meshgrpc_x16": *rs.median(meshPar),
		},
		Extra: []ratio{
			rs.ratio("throughput, 16 callers: meshgrpc / plain", atLeast(0.9), func(f []figures) float64 { return f[meshPar].RPS / f[plainPar].RPS }),
			rs.ratio("allocs per call: meshgrpc / round_robin", noGoal, func(f []figures) float64 { return f[mesh].Allocs / f[rr].Allocs }),
		},
	}
	r.Note = fmt.Sprintf("ratio = p50 of serial unary calls, meshgrpc both sides / plain grpc-go; allocations per call (client and server): meshgrpc %.0f, plain %.0f, round_robin without interceptors %.0f",
		r.Candidate.Allocs, r.Baseline.Allocs, rs.median(rr).Allocs)
	return r, nil
}

// grpcStreamPingPong runs n request-response exchanges on one
// FullDuplexCall stream.
func grpcStreamPingPong(c testgrpc.TestServiceClient, n int) (figures, error) {
	n = sized(n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := c.FullDuplexCall(ctx)
	if err != nil {
		return figures{}, err
	}
	req := &testgrpc.StreamingOutputCallRequest{
		ResponseParameters: []*testgrpc.ResponseParameters{{Size: 100}},
		Payload:            &testgrpc.Payload{Body: make([]byte, 100)},
	}
	lat := make([]time.Duration, n)
	a := mallocs()
	start := time.Now()
	for i := range n {
		t0 := time.Now()
		if err := s.Send(req); err != nil {
			return figures{}, err
		}
		if _, err := s.Recv(); err != nil {
			return figures{}, err
		}
		lat[i] = time.Since(t0)
	}
	el := time.Since(start)
	if err := s.CloseSend(); err != nil {
		return figures{}, err
	}
	if _, err := s.Recv(); err != io.EOF {
		return figures{}, fmt.Errorf("stream end: %v", err)
	}
	f := figures{NsPerOp: float64(el.Nanoseconds()) / float64(n), RPS: float64(n) / el.Seconds(), Allocs: float64(mallocs()-a) / float64(n)}
	f.P50, f.P99 = percentiles(lat)
	return f, nil
}

// grpcStream: messages on one bidirectional stream (ping-pong), meshgrpc on
// both sides against plain grpc-go: p50 per exchange and exchanges per
// second.
func grpcStream(o options) (*result, error) {
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	p, err := newGRPCPair(mp)
	if err != nil {
		return nil, err
	}
	defer p.close()
	n := o.scale(5000, 1000)
	const plain, mesh = 0, 1
	rs, err := interleave(o.rounds,
		variant{"plain", func() (figures, error) { return grpcStreamPingPong(p.plain, n) }},
		variant{"meshgrpc", func() (figures, error) { return grpcStreamPingPong(p.mesh, n) }},
	)
	if err != nil {
		return nil, err
	}
	r := &result{
		ratio:     rs.ratio("", atMost(1.10), func(f []figures) float64 { return f[mesh].P50 / f[plain].P50 }),
		Candidate: rs.median(mesh), Baseline: rs.median(plain),
		Extra: []ratio{
			rs.ratio("exchanges per second: meshgrpc / plain", atLeast(0.9), func(f []figures) float64 { return f[mesh].RPS / f[plain].RPS }),
		},
	}
	r.Note = fmt.Sprintf("ratio = p50 of one message each way on an open FullDuplexCall stream, meshgrpc both sides / plain grpc-go; allocations per exchange: meshgrpc %.0f, plain %.0f",
		r.Candidate.Allocs, r.Baseline.Allocs)
	return r, nil
}
