package meshgrpc_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/meshgrpc"
)

// A grpc-go server under an inbound policy that admits only meshed
// clients: a plaintext call is refused before the application, as
// Linkerd's proxy refuses it. With meshgrpc.WithIdentity the same port
// also terminates mTLS, and the callers' identities are admitted by name.
func ExampleServerOptions() {
	onlyMeshed := &authz.Server{
		Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-grpc"},
		Protocol: authz.ProtocolGRPC,
		Authorizations: []authz.Authz{{
			Meta:           authz.DefaultMeta("all-authenticated"),
			Networks:       []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}},
			Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Suffixes: [][]string{{}}}},
		}},
	}
	srv := grpc.NewServer(meshgrpc.ServerOptions(
		meshgrpc.WithLogger(quiet),
		meshgrpc.WithInboundPolicy(authz.WithDefault(onlyMeshed), authz.WithoutLocalhost()),
	)...)
	testgrpc.RegisterTestServiceServer(srv, peerApp{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	_, err = testgrpc.NewTestServiceClient(cc).EmptyCall(context.Background(), &testgrpc.Empty{})
	fmt.Println(status.Code(err))
	// Output: PermissionDenied
}
