package testutil

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/inmesh/inmesh/proxyapi/inboundpb"
)

// SilentInbound is an InboundServerPolicies server that accepts every port
// watch and never answers: a control plane that is up and has not
// answered yet.
type SilentInbound struct {
	inboundpb.UnimplementedInboundServerPoliciesServer
}

// WatchPort holds the stream open until the client ends it.
func (SilentInbound) WatchPort(_ *inboundpb.PortSpec, s grpc.ServerStreamingServer[inboundpb.Server]) error {
	<-s.Context().Done()
	return s.Context().Err()
}

// ServeInbound serves srv as the InboundServerPolicies API on loopback
// until the test ends, and returns its address.
func ServeInbound(t testing.TB, srv inboundpb.InboundServerPoliciesServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	inboundpb.RegisterInboundServerPoliciesServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}
