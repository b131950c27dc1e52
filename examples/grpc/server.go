package main

import (
	"context"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/meshgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/interop"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// flakyKey is the metadata key a client sets on a call that the service
// fails once: its first attempt, whichever instance gets it, answers
// UNAVAILABLE, as an instance going away would; the retry succeeds.
const flakyKey = "x-flaky-call"

// slowFor is how long StreamingOutputCall waits before it answers, well
// past the route's 200ms timeout.
const slowFor = 5 * time.Second

// flaky is the state the instances share: the flaky calls already failed
// once.
type flaky struct {
	mu     sync.Mutex
	failed map[string]bool
}

// fail reports whether the call of ctx is a flaky one seen for the first
// time.
func (f *flaky) fail(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	id := md.Get(flakyKey)
	if len(id) == 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed[id[0]] {
		return false
	}
	f.failed[id[0]] = true
	return true
}

// instance is one instance of the interop service: grpc-go's own
// TestService behind meshgrpc's server options, counting its calls by the
// caller's identity (as identity.PeerFromContext tells it).
type instance struct {
	testgrpc.TestServiceServer
	name  string
	addr  netip.AddrPort
	flaky *flaky

	mu      sync.Mutex
	callers map[string]int
	failed  int
}

func (s *instance) saw(ctx context.Context) {
	id := "(plaintext)"
	if p, ok := identity.PeerFromContext(ctx); ok {
		id = p.ID
	}
	s.mu.Lock()
	s.callers[id]++
	s.mu.Unlock()
}

func (s *instance) EmptyCall(ctx context.Context, req *testgrpc.Empty) (*testgrpc.Empty, error) {
	s.saw(ctx)
	return s.TestServiceServer.EmptyCall(ctx, req)
}

func (s *instance) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	s.saw(ctx)
	if s.flaky.fail(ctx) {
		s.mu.Lock()
		s.failed++
		s.mu.Unlock()
		return nil, status.Error(codes.Unavailable, s.name+" is going away")
	}
	return s.TestServiceServer.UnaryCall(ctx, req)
}

// StreamingOutputCall is the slow method: it answers after slowFor, or
// ends when the caller gives up.
func (s *instance) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, stream testgrpc.TestService_StreamingOutputCallServer) error {
	s.saw(stream.Context())
	t := time.NewTimer(slowFor)
	defer t.Stop()
	select {
	case <-t.C:
		return s.TestServiceServer.StreamingOutputCall(req, stream)
	case <-stream.Context().Done():
		return status.FromContextError(stream.Context().Err()).Err()
	}
}

func (s *instance) FullDuplexCall(stream testgrpc.TestService_FullDuplexCallServer) error {
	s.saw(stream.Context())
	return s.TestServiceServer.FullDuplexCall(stream)
}

// view returns the callers the instance saw, as "id×n", sorted, and the
// calls it failed.
func (s *instance) view() (callers []string, calls, failed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, n := range s.callers {
		callers = append(callers, id+" ×"+strconv.Itoa(n))
		calls += n
	}
	sort.Strings(callers)
	return callers, calls, s.failed
}

// onlyCaller reports whether every call came from id (the balancer may
// have sent none).
func (s *instance) onlyCaller(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.callers) == 0 || len(s.callers) == 1 && s.callers[id] > 0
}

// startInstance serves a new instance named name on 127.0.0.1 with opts
// (its identity among them); stop stops it and waits for its handlers.
func startInstance(name string, f *flaky, opts ...meshgrpc.Option) (s *instance, stop func(), err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	s = &instance{TestServiceServer: interop.NewTestServer(), name: name, flaky: f,
		addr: netip.MustParseAddrPort(lis.Addr().String()), callers: make(map[string]int)}
	srv := grpc.NewServer(append(meshgrpc.ServerOptions(opts...), grpc.WaitForHandlers(true))...)
	testgrpc.RegisterTestServiceServer(srv, s)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	return s, func() { srv.Stop(); <-done }, nil
}
