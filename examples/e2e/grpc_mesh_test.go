package e2e

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/interop"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/meshgrpc"
)

// certifiedIdentities returns the named identities, certified in process
// by one issuer under one root.
func certifiedIdentities(t *testing.T, names ...string) []*identity.Local {
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("issuer", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	issuer, err := controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key, controlplane.StaticTokens{},
		controlplane.WithIssuerLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	out := make([]*identity.Local, len(names))
	for i, n := range names {
		out[i], err = identity.NewLocal(n, anchors)
		require.NoError(t, err)
		require.NoError(t, issuer.CertifyLocal(out[i]))
	}
	return out
}

// grpc-go's interop cases pass against a grpc.Server built with
// meshgrpc.ServerOptions, over mTLS from a plain grpc-go client whose
// credentials are the identity package's client configuration, under an
// inbound policy that admits only the client's identity: a plaintext
// client of the same port is refused.
func TestGRPCInteropMeshgrpcServer(t *testing.T) {
	ids := certifiedIdentities(t, booksID, webID)
	books, web := ids[0], ids[1]
	onlyWeb := &authz.Server{
		Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "interop"},
		Protocol: authz.ProtocolGRPC,
		Authorizations: []authz.Authz{{
			Meta:           authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "web"},
			Networks:       []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}},
			Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{webID}}},
		}},
	}
	srv := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithIdentity(books),
		meshgrpc.WithMeterProvider(noop.NewMeterProvider()), meshgrpc.WithLogger(slog.New(slog.DiscardHandler)),
		meshgrpc.WithInboundPolicy(authz.WithDefault(onlyWeb), authz.WithoutLocalhost()))...)
	testgrpc.RegisterTestServiceServer(srv, interop.NewTestServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(lis)
	// GracefulStop waits for the handlers, the sleeping one's included.
	t.Cleanup(srv.GracefulStop)
	addr := lis.Addr().String()

	// The configuration's server name (books' identity) is the channel's
	// authority, which grpc-go sends as SNI.
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(web.ClientConfig(booksID))))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	runInteropOn(t, cc)

	plain, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plain.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err = testgrpc.NewTestServiceClient(plain).EmptyCall(ctx, &testgrpc.Empty{})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
}
