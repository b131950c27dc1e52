package mesh

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/policy"
)

// emptyCounter is a TestService that counts the EmptyCalls it runs.
type emptyCounter struct {
	testgrpc.UnimplementedTestServiceServer
	calls atomic.Int32
}

func (a *emptyCounter) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	a.calls.Add(1)
	return &testgrpc.Empty{}, nil
}

// A gRPC method is authorized as the application dispatches it. A
// grpc.Server behind the stack (its ServeHTTP) dispatches on the decoded
// path, so a method name with an escape ("/grpc.testing.TestService/
// %45mptyCall") is refused, where it used to miss the route that refuses
// EmptyCall, be admitted by the service's catch-all route and run
// EmptyCall.
func TestEscapedGRPCMethodRefused(t *testing.T) {
	meta := func(kind, name string) authz.Meta {
		return authz.Meta{Group: "policy.linkerd.io", Kind: kind, Name: name}
	}
	admits := func(name, network string) []authz.Authz {
		return []authz.Authz{{Meta: meta("authorizationpolicy", name), Networks: []authz.Network{{Net: netip.MustParsePrefix(network)}}}}
	}
	route := func(name, method string, az []authz.Authz) authz.GRPCRoute {
		return authz.GRPCRoute{Meta: meta("GRPCRoute", name), Authorizations: az,
			Rules: []authz.GRPCRule{{Matches: []policy.GRPCRouteMatch{{Service: "grpc.testing.TestService", Method: method}}}}}
	}
	server := &authz.Server{Meta: meta("server", "grpc"), Protocol: authz.ProtocolGRPC, GRPCRoutes: []authz.GRPCRoute{
		route("service", "", admits("loopback", "127.0.0.0/8")),
		route("empty", "EmptyCall", admits("elsewhere", "10.0.0.0/8")),
	}}
	app := &emptyCounter{}
	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, app)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := netip.MustParseAddrPort(lis.Addr().String()).Port()
	srv := NewServer(gs, WithLogger(quiet),
		WithInboundPolicy(authz.WithSource(authz.StaticSource{port: server}), authz.WithoutLocalhost()))
	defer srv.Close()
	hs := origproto.NewServer(srv)
	hs.ErrorLog = quietLog
	served := make(chan struct{})
	go func() { defer close(served); _ = hs.Serve(srv.Listener(lis)) }()
	defer func() { hs.Close(); <-served }()

	cc, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	call := func(method string) error {
		return cc.Invoke(ctx, "/grpc.testing.TestService/"+method, &testgrpc.Empty{}, &testgrpc.Empty{})
	}

	require.Equal(t, codes.PermissionDenied, status.Code(call("EmptyCall")), "the empty route refuses loopback")
	require.Equal(t, codes.Unimplemented, status.Code(call("UnaryCall")), "the service route admits loopback; the app does not implement UnaryCall")
	for _, method := range []string{"%45mptyCall", "Empty%43all", "%45%6d%70%74%79%43%61%6c%6c", "EmptyCall%20", "%2545mptyCall"} {
		err := call(method)
		assert.NotEqual(t, codes.OK, status.Code(err), "%s: %v", method, err)
		assert.NotEqual(t, codes.Unimplemented, status.Code(err), "%s reached the app: %v", method, err)
	}
	assert.Zero(t, app.calls.Load(), "EmptyCall ran for a client its route refuses")
}
