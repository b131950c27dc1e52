package e2e

import (
	"context"
	"crypto/x509"
	"fmt"
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
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/manifest"
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

// serveMeshInterop serves grpc-go's interop TestService with
// meshgrpc.ServerOptions on a new loopback port, with local's identity and
// the inbound policy of policy, and returns its address.
func serveMeshInterop(t *testing.T, local *identity.Local, policy ...authz.Option) string {
	srv := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithIdentity(local),
		meshgrpc.WithMeterProvider(noop.NewMeterProvider()), meshgrpc.WithLogger(slog.New(slog.DiscardHandler)),
		meshgrpc.WithInboundPolicy(policy...))...)
	testgrpc.RegisterTestServiceServer(srv, interop.NewTestServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(lis)
	// GracefulStop waits for the handlers, the sleeping one's included.
	t.Cleanup(srv.GracefulStop)
	return lis.Addr().String()
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
	addr := serveMeshInterop(t, books, authz.WithDefault(onlyWeb), authz.WithoutLocalhost())

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

// grpc-go's interop cases pass with meshgrpc on both sides over mTLS: the
// client resolves the service through the embedded control plane, which
// names the server's endpoint with its identity, and the server takes its
// inbound policy (only the client's identity may call) from the same
// control plane's InboundServerPolicies API, as a Linkerd user writes it.
func TestGRPCInteropMeshgrpcBothSides(t *testing.T) {
	ids := certifiedIdentities(t, booksID, webID)
	books, web := ids[0], ids[1]

	store := controlplane.NewStore()
	cpLis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cp := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(slog.New(slog.DiscardHandler))).Register(cp)
	go cp.Serve(cpLis)
	t.Cleanup(cp.Stop)

	// The server's port is known only once it listens; its policy comes
	// from the control plane under the pod's workload name.
	srvDst, err := destination.Dial(cpLis.Addr().String(), destination.WithLogger(slog.New(slog.DiscardHandler)),
		destination.WithWorkload("default:interop-0"))
	require.NoError(t, err)
	t.Cleanup(func() { srvDst.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := netip.MustParseAddrPort(lis.Addr().String())
	res, err := manifest.Parse([]byte(fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: interop-0, namespace: default, labels: {app: interop}}
spec:
  containers: [{name: interop, ports: [{name: grpc, containerPort: %d}]}]
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: interop-grpc, namespace: default}
spec:
  podSelector: {matchLabels: {app: interop}}
  port: grpc
  proxyProtocol: gRPC
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: web, namespace: default}
spec:
  identities: [%q]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: interop-from-web, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: interop-grpc}
  requiredAuthenticationRefs: [{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: web}]
`, addr.Port(), webID)))
	require.NoError(t, err)
	store.SetManifests(res)
	store.PutEndpoints(interopService, []endpoint.Endpoint{{Addr: addr, Identity: booksID, H2: true}})

	srv := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithIdentity(books),
		meshgrpc.WithMeterProvider(noop.NewMeterProvider()), meshgrpc.WithLogger(slog.New(slog.DiscardHandler)),
		meshgrpc.WithInboundPolicy(authz.WithSource(srvDst.InboundPolicies()), authz.WithoutLocalhost()))...)
	testgrpc.RegisterTestServiceServer(srv, interop.NewTestServer())
	go srv.Serve(lis)
	t.Cleanup(srv.GracefulStop)

	dst, err := destination.Dial(cpLis.Addr().String(), destination.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	t.Cleanup(func() { dst.Close() })
	client := func(local *identity.Local) *grpc.ClientConn {
		cc, err := grpc.NewClient("inmesh:///"+interopService, meshgrpc.DialOptions(dst, meshgrpc.WithIdentity(local),
			meshgrpc.WithMeterProvider(noop.NewMeterProvider()), meshgrpc.WithLogger(slog.New(slog.DiscardHandler)))...)
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	cc := client(web)

	// Until the server has its Server from the control plane, the default
	// policy admits everyone: wait for the policy to refuse another
	// identity before running the cases.
	other := testgrpc.NewTestServiceClient(client(books))
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := other.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
		return status.Code(err) == codes.PermissionDenied
	}, timeout, 20*time.Millisecond, "the Server's authorization never reached the server")
	runInteropOn(t, cc)
}
