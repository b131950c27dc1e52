package meshgrpc_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/inmesh/inmesh/policy"
)

// adminID is the identity a forging client claims.
const adminID = "admin.default.serviceaccount.identity.linkerd.cluster.local"

// seenClientID makes a unary and a server-streaming call on c, each with
// a forged l5d-client-id (twice, as a client may send it), and returns
// the l5d-client-id values each handler got.
func seenClientID(t *testing.T, c testgrpc.TestServiceClient) (unary, stream string) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "l5d-client-id", adminID, "l5d-client-id", adminID)
	var hdr metadata.MD
	_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.Header(&hdr))
	require.NoError(t, err)
	s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
	require.NoError(t, err)
	shdr, err := s.Header()
	require.NoError(t, err)
	return first(hdr, clientIDSeen), first(shdr, clientIDSeen)
}

func first(md metadata.MD, k string) string {
	if v := md.Get(k); len(v) > 0 {
		return v[0]
	}
	return "(no header)"
}

// No client can claim an identity in metadata: the handler gets
// l5d-client-id only with the identity the client proved over mesh TLS,
// every value the client sent removed, as Linkerd's proxy sets the header
// on inbound requests (linkerd2-proxy,
// linkerd/app/inbound/src/http/set_identity_header.rs) and as the HTTP
// stack does (orig-proto's listener). Plaintext, TLS without a
// certificate and meshed clients, on a server with an identity, with an
// inbound policy too, and with neither.
func TestForgedClientID(t *testing.T) {
	const none, web = "[]", "[" + webID + "]"
	e := newEnv(t)
	for _, tc := range []struct {
		name, id, want string
	}{
		{"plaintext", "", none},
		{"tls without certificate", "-", none},
		{"meshed", webID, web},
	} {
		t.Run("identity/"+tc.name, func(t *testing.T) {
			unary, stream := seenClientID(t, e.dial(t, tc.id))
			assert.Equal(t, tc.want, unary, "unary")
			assert.Equal(t, tc.want, stream, "stream")
		})
	}

	t.Run("identity and policy/meshed", func(t *testing.T) {
		all := booksGRPC()
		all.GRPCRoutes = nil // every method, for web
		p := newEnv(t, meshgrpc.WithInboundPolicy(authz.WithDefault(all), authz.WithoutLocalhost()))
		unary, stream := seenClientID(t, p.dial(t, webID))
		assert.Equal(t, web, unary, "unary")
		assert.Equal(t, web, stream, "stream")
	})

	t.Run("neither/plaintext", func(t *testing.T) {
		srv := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithLogger(quiet))...)
		testgrpc.RegisterTestServiceServer(srv, peerApp{})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Stop(); <-done })
		cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cc.Close() })
		unary, stream := seenClientID(t, testgrpc.NewTestServiceClient(cc))
		assert.Equal(t, none, unary, "unary")
		assert.Equal(t, none, stream, "stream")
	})
}

// The inbound policy judges a call by the l5d-client-id the handler will
// get: a route that matches the header admits the client that proved the
// identity, never one that only claims it.
func TestForgedClientIDPolicyRoute(t *testing.T) {
	srv := &authz.Server{
		Meta: srvMeta, Protocol: authz.ProtocolGRPC,
		Authorizations: []authz.Authz{{Meta: authz.DefaultMeta("all-unauthenticated"), Networks: everywhere}},
		GRPCRoutes: []authz.GRPCRoute{{Meta: routeMeta, Rules: []authz.GRPCRule{{Matches: []policy.GRPCRouteMatch{{
			Service: "grpc.testing.TestService", Method: "UnaryCall",
			Headers: []policy.HeaderMatch{{Name: "l5d-client-id", Value: webID}},
		}}}}}},
	}
	e := newEnv(t, meshgrpc.WithInboundPolicy(authz.WithDefault(srv), authz.WithoutLocalhost()))
	for _, tc := range []struct {
		name, id string
		claim    bool
		code     codes.Code
	}{
		{"meshed as web", webID, false, codes.OK},
		{"meshed as web claiming web", webID, true, codes.OK},
		{"plaintext claiming web", "", true, codes.NotFound},
		{"meshed as reviews claiming web", reviewsID, true, codes.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			if tc.claim {
				ctx = metadata.AppendToOutgoingContext(ctx, "l5d-client-id", webID)
			}
			_, err := e.dial(t, tc.id).UnaryCall(ctx, &testgrpc.SimpleRequest{})
			assert.Equal(t, tc.code, status.Code(err), "%v", err)
		})
	}
}
