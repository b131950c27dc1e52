package meshgrpc_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/inmesh/inmesh/proxyapi/destinationpb"
)

// requireIDHeader is the metadata key of l5d-require-id, as an
// application spells it.
const requireIDHeader = "l5d-require-id"

// requireIDApp is a TestService served with meshgrpc's server options as
// books (mTLS, and plaintext on the same port): it counts the calls it
// gets and those that came with l5d-require-id.
type requireIDApp struct {
	app
	addr            string
	reached, withID atomic.Int64
}

func newRequireIDApp(t *testing.T, p *pki) *requireIDApp {
	t.Helper()
	a := &requireIDApp{}
	a.handle = func(ctx context.Context, _ int64) error {
		a.reached.Add(1)
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(requireIDHeader)) > 0 {
			a.withID.Add(1)
		}
		return nil
	}
	srv := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithIdentity(p.certify(t, booksID)), meshgrpc.WithLogger(quiet))...)
	testgrpc.RegisterTestServiceServer(srv, &a.app)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	a.addr = ln.Addr().String()
	return a
}

// serveDestinationOnly serves the Destination API of the embedded control
// plane over store on loopback, and no outbound policy (a control plane
// without the API: its targets have none), and returns a Destination
// client of it.
func serveDestinationOnly(t *testing.T, store *controlplane.Store) *destination.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	destinationpb.RegisterDestinationServer(g, controlplane.NewServer(store))
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	dst, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	return dst
}

// requireIDCall makes a unary call, or a server-streaming one read to its first
// answer, and returns its error.
func requireIDCall(ctx context.Context, c testgrpc.TestServiceClient, stream bool) error {
	if !stream {
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		return err
	}
	s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
	if err != nil {
		return err
	}
	_, err = s.Recv()
	return err
}

// allMethodsRoute routes every call of the TestService to books.
const allMethodsRoute = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: all, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService}}]
    backendRefs: [{name: books, port: 7000}]
`

// emptyCallProfile is a ServiceProfile whose route takes EmptyCall.
const emptyCallProfile = `
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  routes:
  - name: EmptyCall
    condition: {method: POST, pathRegex: /grpc\.testing\.TestService/EmptyCall}
`

// l5d-require-id names the identity that a call's endpoint must prove over
// mTLS, as Linkerd's outbound proxy honours the header
// (linkerd/app/outbound/src/http/require_id_header.rs, the error answered
// as a bad gateway, gRPC UNAVAILABLE, by http/server.rs) and as the HTTP
// stack does (mesh TestRequireIDHeader): the metadata is removed before
// the call leaves, honoured or not; an endpoint that proves another
// identity, or none (plaintext, also when only discovery names an
// identity and the channel has none of its own), fails the call
// UNAVAILABLE and the server is not reached. Each row is the first call on
// a fresh channel, unary and server-streaming, to a target without policy,
// with the default policy, a GRPCRoute, and a ServiceProfile route.
func TestRequireIDMetadata(t *testing.T) {
	p := newPKI(t)
	a := newRequireIDApp(t, p)
	addr, err := netip.ParseAddrPort(a.addr)
	require.NoError(t, err)
	web := p.certify(t, webID)

	modes := []struct {
		name      string
		manifests string
		profile   bool
		noPolicy  bool // a control plane without the policy API
		unaryOnly bool // a ServiceProfile routes unary calls only
	}{
		{name: "no policy", noPolicy: true},
		{name: "default policy"},
		{name: "GRPCRoute", manifests: booksService + allMethodsRoute},
		{name: "ServiceProfile", profile: true, unaryOnly: true},
	}
	rows := []struct {
		name        string
		epID        string   // the endpoint's identity by discovery
		clientID    bool     // the channel has an identity of its own
		require     []string // the call's l5d-require-id values
		wantCode    codes.Code
		wantReached bool
	}{
		{name: "its own identity", epID: booksID, clientID: true, require: []string{booksID}, wantReached: true},
		{name: "its own identity in upper case", epID: booksID, clientID: true, require: []string{strings.ToUpper(booksID)}, wantReached: true},
		{name: "two values, the first its own", epID: booksID, clientID: true, require: []string{booksID, reviewsID}, wantReached: true},
		{name: "another identity", epID: booksID, clientID: true, require: []string{reviewsID}, wantCode: codes.Unavailable},
		{name: "plaintext endpoint", clientID: true, require: []string{booksID}, wantCode: codes.Unavailable},
		{name: "identity named by discovery only, channel without identity", epID: booksID, require: []string{booksID}, wantCode: codes.Unavailable},
		{name: "empty value", epID: booksID, clientID: true, require: []string{" "}, wantReached: true},
		// A value that is no identity is ignored, as Linkerd's proxy
		// ignores it (require_id_header.rs, extract_id).
		{name: "a value that is no identity, plaintext endpoint", clientID: true, require: []string{"books..default"}, wantReached: true},
		{name: "no metadata", epID: booksID, clientID: true, wantReached: true},
		{name: "no metadata, plaintext endpoint", clientID: true, wantReached: true},
	}
	for _, mode := range modes {
		for _, tc := range rows {
			for _, stream := range []bool{false, true} {
				if stream && mode.unaryOnly {
					continue
				}
				kind := "unary"
				if stream {
					kind = "stream"
				}
				t.Run(mode.name+"/"+tc.name+"/"+kind, func(t *testing.T) {
					store := controlplane.NewStore()
					if mode.manifests != "" {
						manifests(t, store, mode.manifests)
					}
					if mode.profile {
						setProfiles(t, store, emptyCallProfile)
					}
					store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: addr, Identity: tc.epID}}})
					opts := []meshgrpc.Option{meshgrpc.WithLogger(quiet)}
					if tc.clientID {
						opts = append(opts, meshgrpc.WithIdentity(web))
					}
					var dst *destination.Client
					if mode.noPolicy {
						dst = serveDestinationOnly(t, store)
					} else {
						dst = serveStore(t, store)
					}
					c := dial(t, dst, opts...)

					ctx := callCtx(t)
					for _, v := range tc.require {
						ctx = metadata.AppendToOutgoingContext(ctx, requireIDHeader, v)
					}
					reached, withID := a.reached.Load(), a.withID.Load()
					err := requireIDCall(ctx, c, stream)

					assert.Equal(t, tc.wantCode, status.Code(err), "%v", err)
					assert.Equal(t, withID, a.withID.Load(), "the server never sees l5d-require-id")
					if tc.wantReached {
						assert.Equal(t, reached+1, a.reached.Load(), "the server is reached")
						return
					}
					assert.Equal(t, reached, a.reached.Load(), "the server is not reached")
					assert.Contains(t, status.Convert(err).Message(), "identity required")
				})
			}
		}
	}
}

// An l5d-require-id that an interceptor chained after the channel's own
// adds is still checked against the endpoint: it can never send a call to
// an endpoint that does not prove the identity.
func TestRequireIDMetadataAddedAfterTheMeshInterceptors(t *testing.T) {
	p := newPKI(t)
	a := newRequireIDApp(t, p)
	addr, err := netip.ParseAddrPort(a.addr)
	require.NoError(t, err)
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: addr, Identity: booksID}}})
	late := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(metadata.AppendToOutgoingContext(ctx, requireIDHeader, reviewsID), method, req, reply, cc, opts...)
	}
	dopts := append(meshgrpc.DialOptions(serveStore(t, store), meshgrpc.WithIdentity(p.certify(t, webID)), meshgrpc.WithLogger(quiet)),
		grpc.WithChainUnaryInterceptor(late))
	cc, err := grpc.NewClient(booksTarget, dopts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })

	_, err = testgrpc.NewTestServiceClient(cc).EmptyCall(callCtx(t), &testgrpc.Empty{})
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "identity required: "+reviewsID)
	assert.Zero(t, a.reached.Load())
}
