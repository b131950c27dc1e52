package meshgrpc_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/policy"
)

const (
	booksID   = "books.default.serviceaccount.identity.linkerd.cluster.local"
	webID     = "web.default.serviceaccount.identity.linkerd.cluster.local"
	reviewsID = "reviews.default.serviceaccount.identity.linkerd.cluster.local"
)

var quiet = slog.New(slog.DiscardHandler)

// pki is a root, an issuer under it and the identities it certifies, in
// process.
type pki struct {
	anchors *x509.CertPool
	issuer  *controlplane.Issuer
}

func newPKI(t *testing.T) *pki {
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("issuer", time.Hour)
	require.NoError(t, err)
	p := &pki{anchors: x509.NewCertPool()}
	p.anchors.AddCert(root.Cert)
	p.issuer, err = controlplane.NewIssuer(p.anchors, [][]byte{iss.DER}, iss.Key, controlplane.StaticTokens{},
		controlplane.WithIssuerLogger(quiet))
	require.NoError(t, err)
	return p
}

func (p *pki) certify(t *testing.T, name string) *identity.Local {
	l, err := identity.NewLocal(name, p.anchors)
	require.NoError(t, err)
	require.NoError(t, p.issuer.CertifyLocal(l))
	return l
}

// peerApp is a TestService that tells its caller who it saw: UnaryCall
// answers with the identity identity.PeerFromContext found (Username) and
// whether there was one (OauthScope), and the x-added metadata it got.
type peerApp struct {
	testgrpc.UnimplementedTestServiceServer
}

func (peerApp) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func (peerApp) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if s := req.GetResponseStatus(); s != nil {
		return nil, status.Error(codes.Code(s.Code), s.Message)
	}
	p, ok := identity.PeerFromContext(ctx)
	md, _ := metadata.FromIncomingContext(ctx)
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-added-seen", firstMD(md, "x-added"), clientIDSeen, fmt.Sprint(md["l5d-client-id"])))
	return &testgrpc.SimpleResponse{Username: p.ID, OauthScope: strconv.FormatBool(ok)}, nil
}

func (peerApp) FullDuplexCall(stream testgrpc.TestService_FullDuplexCallServer) error {
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: req.GetPayload()}); err != nil {
			return err
		}
	}
}

func (peerApp) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, stream testgrpc.TestService_StreamingOutputCallServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	if err := stream.SendHeader(metadata.Pairs(clientIDSeen, fmt.Sprint(md["l5d-client-id"]))); err != nil {
		return err
	}
	for range req.GetResponseParameters() {
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	return nil
}

// clientIDSeen is the response header in which peerApp tells the
// l5d-client-id values its handler got, as fmt prints a slice.
const clientIDSeen = "x-client-id-seen"

func firstMD(md metadata.MD, k string) string {
	if v := md[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

type env struct {
	pki     *pki
	addr    string
	port    string
	metrics *testutil.Metrics
}

// newEnv serves app as books with meshgrpc's server options on loopback.
func newEnv(t *testing.T, opts ...meshgrpc.Option) *env {
	e := &env{pki: newPKI(t), metrics: testutil.NewMetrics(t)}
	local := e.pki.certify(t, booksID)
	opts = append([]meshgrpc.Option{meshgrpc.WithIdentity(local), meshgrpc.WithMeterProvider(e.metrics.Provider),
		meshgrpc.WithLogger(quiet)}, opts...)
	srv := grpc.NewServer(meshgrpc.ServerOptions(opts...)...)
	testgrpc.RegisterTestServiceServer(srv, peerApp{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	e.addr = ln.Addr().String()
	_, e.port, _ = net.SplitHostPort(e.addr)
	return e
}

// dial returns a client of the server: plaintext without id, mTLS with
// the identity package's client configuration otherwise ("-": TLS
// without a certificate), with SNI the server's identity.
func (e *env) dial(t *testing.T, id string) testgrpc.TestServiceClient {
	creds := insecure.NewCredentials()
	if id != "" {
		var local *identity.Local
		if id == "-" {
			var err error
			local, err = identity.NewLocal(webID, e.pki.anchors) // never certified: shows no certificate
			require.NoError(t, err)
		} else {
			local = e.pki.certify(t, id)
		}
		// The configuration's server name, the server's identity, is
		// the channel's authority, which grpc-go sends as SNI.
		creds = credentials.NewTLS(local.ClientConfig(booksID))
	}
	cc, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(creds))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// The handler sees the caller as the HTTP stack's handlers do: a meshed
// client's verified identity, TLS without a certificate as TLS with no
// identity, plaintext on the same port as no peer at all.
func TestPeerIdentity(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name, id, wantID, wantOK string
	}{
		{"meshed", webID, webID, "true"},
		{"tls without certificate", "-", "", "true"},
		{"plaintext", "", "", "false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := e.dial(t, tc.id).UnaryCall(ctx, &testgrpc.SimpleRequest{})
			require.NoError(t, err)
			assert.Equal(t, tc.wantID, resp.GetUsername())
			assert.Equal(t, tc.wantOK, resp.GetOauthScope())
		})
	}
}

// A TLS client must name the server's identity as SNI, as the HTTP
// stack's listener requires.
func TestWrongServerName(t *testing.T) {
	e := newEnv(t)
	cfg := e.pki.certify(t, webID).ClientConfig(booksID) // would verify books
	cfg.ServerName = reviewsID                           // but asks for reviews
	cc, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(t, err)
	defer cc.Close()
	_, err = testgrpc.NewTestServiceClient(cc).EmptyCall(ctxT(t), &testgrpc.Empty{})
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
}

// An inmesh HTTP peer reaches the server as Linkerd's proxies do: mTLS
// without ALPN, HTTP/2 with prior knowledge inside; the handler sees its
// identity.
func TestMeshPeer(t *testing.T) {
	e := newEnv(t)
	tr := origproto.NewTransport(origproto.WithClientIdentity(e.pki.certify(t, webID)))
	t.Cleanup(tr.CloseIdleConnections)
	// An empty SimpleRequest, framed as gRPC frames it: uncompressed,
	// zero bytes long.
	req, err := http.NewRequestWithContext(origproto.WithServerIdentity(ctxT(t), booksID), "POST",
		"http://"+e.addr+"/grpc.testing.TestService/UnaryCall", strings.NewReader("\x00\x00\x00\x00\x00"))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "0", resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message"))
	assert.Contains(t, string(body), webID, "the handler saw the peer's identity")
}

var everywhere = []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}, {Net: netip.MustParsePrefix("::/0")}}

var (
	srvMeta   = authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-grpc"}
	routeMeta = authz.Meta{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Name: "books-rpc"}
	apMeta    = authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "web-ap"}
)

// booksGRPC admits web's identity to the TestService's EmptyCall,
// UnaryCall and FullDuplexCall; its other methods have no route.
func booksGRPC() *authz.Server {
	var matches []policy.GRPCRouteMatch
	for _, m := range []string{"EmptyCall", "UnaryCall", "FullDuplexCall"} {
		matches = append(matches, policy.GRPCRouteMatch{Service: "grpc.testing.TestService", Method: m})
	}
	return &authz.Server{
		Meta:     srvMeta,
		Protocol: authz.ProtocolGRPC,
		Authorizations: []authz.Authz{{Meta: apMeta, Networks: everywhere,
			Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{webID}}}}},
		GRPCRoutes: []authz.GRPCRoute{{Meta: routeMeta, Rules: []authz.GRPCRule{{Matches: matches,
			Filters: []policy.Filter{{RequestHeaders: &policy.HeaderModifier{Set: []policy.Header{{Name: "X-Added", Value: "yes"}}}}}}}}},
	}
}

// The port's authorizations and GRPCRoutes per call, answered and
// counted as authz.Handler answers and counts HTTP requests: the named
// identity passes (with the route's header modifier applied), another
// identity and a plaintext client get PERMISSION_DENIED (Linkerd's
// message to the meshed one only), a method no route names NOT_FOUND.
func TestInboundPolicy(t *testing.T) {
	e := newEnv(t, meshgrpc.WithInboundPolicy(authz.WithDefault(booksGRPC()), authz.WithoutLocalhost()))
	ctx := ctxT(t)
	web, reviews, plain := e.dial(t, webID), e.dial(t, reviewsID), e.dial(t, "")

	var hdr metadata.MD
	_, err := web.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.Header(&hdr))
	require.NoError(t, err)
	assert.Equal(t, []string{"yes"}, hdr.Get("x-added-seen"), "the route's header modifier reaches the handler")

	_, err = reviews.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Regexp(t, `^client 127\.0\.0\.1:\d+: server: 127\.0\.0\.1:`+e.port+`: unauthorized request on route$`, status.Convert(err).Message())

	_, err = plain.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Empty(t, status.Convert(err).Message(), "no reason to a client that is not meshed")

	duplex, err := web.FullDuplexCall(ctx)
	require.NoError(t, err)
	require.NoError(t, duplex.Send(&testgrpc.StreamingOutputCallRequest{}))
	_, err = duplex.Recv()
	require.NoError(t, err, "a streaming call passes the policy as a unary one")
	require.NoError(t, duplex.CloseSend())
	_, err = duplex.Recv()
	require.Equal(t, io.EOF, err)

	stream, err := web.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	assert.Equal(t, codes.NotFound, status.Code(err))
	assert.Regexp(t, `: no route found for request$`, status.Convert(err).Message())

	target := `target_addr="127.0.0.1:` + e.port + `",target_ip="127.0.0.1",target_port="` + e.port + `"`
	srv := `srv_group="policy.linkerd.io",srv_kind="server",srv_name="books-grpc",srv_port="` + e.port + `"`
	route := `route_group="gateway.networking.k8s.io",route_kind="GRPCRoute",route_name="books-rpc"`
	want := []string{
		`inbound_http_authz_allow_total{authz_group="policy.linkerd.io",authz_kind="authorizationpolicy",authz_name="web-ap",client_id="` + webID + `",` + route + `,` + srv + `,` + target + `,tls="true"} 2`,
		`inbound_http_authz_deny_total{client_id="` + reviewsID + `",` + route + `,` + srv + `,` + target + `,tls="true"} 1`,
		`inbound_http_authz_deny_total{no_tls_reason="loopback",` + route + `,` + srv + `,` + target + `,tls="no_identity"} 1`,
		`inbound_http_route_not_found_total{client_id="` + webID + `",` + srv + `,` + target + `,tls="true"} 1`,
	}
	scraped := e.metrics.Scrape(t)
	for _, w := range want {
		assert.Contains(t, scraped, w+"\n")
	}
	assert.Len(t, e.metrics.Lines(t, "inbound_http_authz_deny_total"), 2)
	assert.Len(t, e.metrics.Lines(t, "inbound_http_authz_allow_total"), 1)
	assert.Len(t, e.metrics.Lines(t, "inbound_http_route_not_found_total"), 1)
	assert.Equal(t, "2", e.metrics.Value(t, "request_total"), "refused calls reach no request metrics, as in Linkerd's proxy")
	assert.Equal(t, "2", e.metrics.Value(t, "response_total", `direction="inbound"`, `srv_name="books-grpc"`, `route_name="books-rpc"`,
		`authz_name="web-ap"`, `client_id="`+webID+`"`, `grpc_status="0"`), "allowed calls carry their Server, route and authorization")
}

// A total rate limit of 20 lets the first 20 calls of a burst of 100
// through, and about as many more as refill while the burst lasts; the
// rest are RESOURCE_EXHAUSTED with Linkerd's message, and counted.
func TestRateLimit(t *testing.T) {
	srv := &authz.Server{
		Meta: srvMeta, Protocol: authz.ProtocolHTTP2,
		Authorizations: []authz.Authz{{Meta: authz.DefaultMeta("all-unauthenticated"), Networks: everywhere}},
		RateLimit:      &authz.RateLimit{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPLocalRateLimitPolicy", Name: "books-rl"}, Total: 20},
	}
	e := newEnv(t, meshgrpc.WithInboundPolicy(authz.WithDefault(srv)))
	ctx := ctxT(t)
	web := e.dial(t, webID)
	_, err := web.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
	require.NoError(t, err) // connected; this call takes a token

	start := time.Now()
	ok, limited := 1, 0
	for range 99 {
		_, err := web.EmptyCall(ctx, &testgrpc.Empty{})
		switch status.Code(err) {
		case codes.OK:
			ok++
		case codes.ResourceExhausted:
			limited++
			assert.Regexp(t, `^client 127\.0\.0\.1:\d+: server: 127\.0\.0\.1:`+e.port+`: total rate limit exceeded: 20rps$`, status.Convert(err).Message())
		default:
			t.Fatalf("unexpected %v", err)
		}
	}
	refill := int(time.Since(start).Seconds()*20) + 1
	assert.GreaterOrEqual(t, ok, 20)
	assert.LessOrEqual(t, ok, 20+refill, "the burst took %s", time.Since(start))
	assert.Equal(t, strconv.Itoa(limited), e.metrics.Value(t, "inbound_http_local_ratelimit_total", `ratelimit_scope="total"`,
		`ratelimit_name="books-rl"`, `client_id="`+webID+`"`))
	assert.Equal(t, strconv.Itoa(ok), e.metrics.Value(t, "response_total", `grpc_status="0"`))
}

// Linkerd's inbound request metrics, series by series: every call the
// server handles, unary and streaming, with direction="inbound", its
// authority, the tls labels of its client, the address its connection was
// accepted on (target_*), and for the response HTTP status 200, the gRPC
// status and its classification.
func TestMetrics(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	web, plain := e.dial(t, webID), e.dial(t, "")
	_, err := web.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	require.NoError(t, err)
	_, err = plain.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.Unavailable)}})
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, err = plain.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.NotFound)}})
	require.Equal(t, codes.NotFound, status.Code(err))

	stream, err := web.FullDuplexCall(ctx)
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, stream.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte{byte(i)}}}))
		resp, err := stream.Recv()
		require.NoError(t, err)
		assert.Equal(t, []byte{byte(i)}, resp.GetPayload().GetBody())
	}
	require.NoError(t, stream.CloseSend())
	_, err = stream.Recv()
	require.Equal(t, io.EOF, err)
	out, err := web.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{
		ResponseParameters: []*testgrpc.ResponseParameters{{}, {}}})
	require.NoError(t, err)
	for range 2 {
		_, err = out.Recv()
		require.NoError(t, err)
	}
	_, err = out.Recv()
	require.Equal(t, io.EOF, err)

	meshed := `authority="` + booksID + `:80",client_id="` + webID + `",direction="inbound"`
	plainL := `authority="` + e.addr + `",direction="inbound"`
	noTLS := `no_tls_reason="no_tls_from_remote",`
	// The address the calls' connections were accepted on.
	_, port, _ := net.SplitHostPort(e.addr)
	target := `target_addr="` + e.addr + `",target_ip="127.0.0.1",target_port="` + port + `",`
	want := map[string][]string{
		"request_total": {
			`request_total{` + plainL + `,` + noTLS + target + `tls="no_identity"} 2`,
			`request_total{` + meshed + `,` + target + `tls="true"} 3`,
		},
		"response_total": {
			`response_total{authority="` + e.addr + `",classification="failure",direction="inbound",error="",grpc_status="14",` + noTLS + `status_code="200",` + target + `tls="no_identity"} 1`,
			`response_total{authority="` + e.addr + `",classification="success",direction="inbound",error="",grpc_status="5",` + noTLS + `status_code="200",` + target + `tls="no_identity"} 1`,
			`response_total{authority="` + booksID + `:80",classification="success",client_id="` + webID + `",direction="inbound",error="",grpc_status="0",status_code="200",` + target + `tls="true"} 3`,
		},
		"response_latency_ms_count": {
			`response_latency_ms_count{` + plainL + `,` + noTLS + `status_code="200",` + target + `tls="no_identity"} 2`,
			`response_latency_ms_count{` + meshed + `,status_code="200",` + target + `tls="true"} 3`,
		},
	}
	// The server counts a response when the call ends, which may be
	// after the client has it.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for fam, lines := range want {
			assert.ElementsMatch(c, lines, e.metrics.Lines(t, fam), fam)
		}
	}, testutil.Timeout, 10*time.Millisecond)
}

// The Server's limit of calls in flight holds a streaming call's place
// until it ends: a call past the limit is UNAVAILABLE, the next one after
// the stream ended passes.
func TestConcurrencyLimit(t *testing.T) {
	srv := &authz.Server{
		Meta: srvMeta, Protocol: authz.ProtocolGRPC, MaxConcurrentRequests: 1,
		Authorizations: []authz.Authz{{Meta: authz.DefaultMeta("all-unauthenticated"), Networks: everywhere}},
	}
	e := newEnv(t, meshgrpc.WithInboundPolicy(authz.WithDefault(srv)))
	ctx := ctxT(t)
	web := e.dial(t, webID)
	stream, err := web.FullDuplexCall(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&testgrpc.StreamingOutputCallRequest{}))
	_, err = stream.Recv()
	require.NoError(t, err)

	_, err = web.EmptyCall(ctx, &testgrpc.Empty{})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Regexp(t, `: concurrency limit exceeded: 1 requests$`, status.Convert(err).Message())

	require.NoError(t, stream.CloseSend())
	_, err = stream.Recv()
	require.Equal(t, io.EOF, err)
	_, err = web.EmptyCall(ctx, &testgrpc.Empty{})
	assert.NoError(t, err, "the stream's place was given back when it ended")
}

// A GRPCRoute's failure injector answers the call with its status and
// message, to every client, before the application.
func TestServerFailureInjector(t *testing.T) {
	srv := &authz.Server{
		Meta: srvMeta, Protocol: authz.ProtocolGRPC,
		Authorizations: []authz.Authz{{Meta: authz.DefaultMeta("all-unauthenticated"), Networks: everywhere}},
		GRPCRoutes: []authz.GRPCRoute{{Meta: routeMeta, Rules: []authz.GRPCRule{
			{Matches: []policy.GRPCRouteMatch{{Method: "EmptyCall"}},
				Filters: []policy.Filter{{GRPCFailureInjector: &policy.GRPCFailureInjector{Code: codes.Unavailable, Message: "injected"}}}},
			{Matches: []policy.GRPCRouteMatch{{Method: "UnaryCall"}}},
		}}},
	}
	e := newEnv(t, meshgrpc.WithInboundPolicy(authz.WithDefault(srv)))
	ctx := ctxT(t)
	plain := e.dial(t, "")
	_, err := plain.EmptyCall(ctx, &testgrpc.Empty{})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, "injected", status.Convert(err).Message())
	_, err = plain.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	assert.NoError(t, err)
	assert.Equal(t, "1", e.metrics.Value(t, "request_total"), "the injected failure reached no request metrics")
}

// A server with metrics alone (no identity, no policy) counts its calls
// as one with either does: requests, responses by grpc_status, latency,
// with the plaintext tls labels and the address the connection was
// accepted on (target_*, as Linkerd's inbound endpoint labels), for unary
// and streaming calls.
func TestMetricsWithoutIdentity(t *testing.T) {
	m := testutil.NewMetrics(t)
	srv := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithMeterProvider(m.Provider), meshgrpc.WithLogger(quiet))...)
	testgrpc.RegisterTestServiceServer(srv, peerApp{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	c := testgrpc.NewTestServiceClient(cc)
	ctx := ctxT(t)

	_, err = c.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	require.NoError(t, err)
	_, err = c.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.Unavailable)}})
	require.Equal(t, codes.Unavailable, status.Code(err))
	out, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{
		ResponseParameters: []*testgrpc.ResponseParameters{{}, {}}})
	require.NoError(t, err)
	for range 2 {
		_, err = out.Recv()
		require.NoError(t, err)
	}
	_, err = out.Recv()
	require.Equal(t, io.EOF, err)

	a := `authority="` + ln.Addr().String() + `",`
	// The address the calls' connections were accepted on.
	target := `target_addr="` + ln.Addr().String() + `",target_ip="127.0.0.1",target_port="` + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port) + `",`
	want := map[string][]string{
		"request_total": {`request_total{` + a + `direction="inbound",` + target + `tls="disabled"} 3`},
		"response_total": {
			`response_total{` + a + `classification="failure",direction="inbound",error="",grpc_status="14",status_code="200",` + target + `tls="disabled"} 1`,
			`response_total{` + a + `classification="success",direction="inbound",error="",grpc_status="0",status_code="200",` + target + `tls="disabled"} 2`,
		},
		"response_latency_ms_count": {`response_latency_ms_count{` + a + `direction="inbound",status_code="200",` + target + `tls="disabled"} 3`},
	}
	// The server may count a response after the client has it.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for fam, lines := range want {
			assert.ElementsMatch(c, lines, m.Lines(t, fam), fam)
		}
	}, testutil.Timeout, 10*time.Millisecond)
}
