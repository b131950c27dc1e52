package controlplane

import (
	"context"
	"net"
	"testing"

	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// serveGRPC serves g on a loopback port of the kernel's choice until the
// test ends and returns its address.
func serveGRPC(t testing.TB, g *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return lis.Addr().String()
}

// appHealth is a program's own health service: its own service "app",
// and the control plane's names passed to the Server's.
type appHealth struct {
	healthpb.UnimplementedHealthServer
	cp healthpb.HealthServer
}

func (h *appHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if req.GetService() == "app" {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	return h.cp.Check(ctx, req)
}

// A program that registers its own health service on the gRPC server
// before Register keeps it, and the process goes on (grpc-go ends it, with
// a fatal log, on a service registered twice); the control plane's
// services are served beside it.
func TestRegisterKeepsAHealthServiceRegisteredBefore(t *testing.T) {
	g := grpc.NewServer()
	own := health.NewServer()
	own.SetServingStatus("app", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, own)
	s := NewServer(NewStore(), WithLogger(quietLogger))
	s.Register(g)
	addr := serveGRPC(t, g)

	st, err := healthOf(t, addr, "app")
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, st, "the program's own health service answers")
	_, err = healthOf(t, addr, CurrentHealthService)
	assert.Equal(t, codes.NotFound, status.Code(err), "the program's service knows nothing of the Server's: %v", err)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	stream, err := rawClient(t, addr).GetProfile(ctx, &pb.GetDestination{Path: booksSvc + ":7000"})
	require.NoError(t, err)
	_, err = stream.Recv()
	assert.NotEqual(t, codes.Unimplemented, status.Code(err), "Destination is served beside it: %v", err)
}

// With WithoutHealthService, Register leaves the health service to the
// program, which registers its own after it and passes the Server's names
// to HealthServer: the replica states drive those answers as they drive
// the Server's own service.
func TestRegisterWithoutHealthServiceLeavesItToTheProgram(t *testing.T) {
	g := grpc.NewServer()
	s := NewServer(NewStore(), WithLogger(quietLogger), WithoutHealthService())
	s.Register(g)
	healthpb.RegisterHealthServer(g, &appHealth{cp: s.HealthServer()})
	addr := serveGRPC(t, g)

	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		st, err := healthOf(t, addr, service)
		require.NoError(t, err)
		return st
	}
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, check("app"))
	for _, tc := range []struct {
		h        Health
		any, cur healthpb.HealthCheckResponse_ServingStatus
	}{
		{Current, healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_SERVING},
		{Stale, healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING},
		{Standby, healthpb.HealthCheckResponse_NOT_SERVING, healthpb.HealthCheckResponse_NOT_SERVING},
		{Current, healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_SERVING},
	} {
		s.SetHealth(tc.h)
		assert.Equal(t, tc.any, check(""), "%s: the empty name", tc.h)
		assert.Equal(t, tc.cur, check(CurrentHealthService), "%s: %s", tc.h, CurrentHealthService)
	}
}
