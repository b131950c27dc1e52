package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/regtest"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/registrationpb"
)

const regTimeout = 20 * time.Second

type regStream = grpc.BidiStreamingClient[registrationpb.RegisterRequest, registrationpb.RegisterResponse]

// register opens a registration stream as local (plaintext when nil) and
// sends eps.
func register(t *testing.T, c *regtest.ControlPlane, local *identity.Local, eps ...*registrationpb.Endpoint) (regStream, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), regTimeout)
	t.Cleanup(cancel)
	st, err := registrationpb.NewRegistrationClient(c.Dial(t, local)).Register(ctx)
	require.NoError(t, err)
	err = st.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Endpoints{
		Endpoints: &registrationpb.Endpoints{Endpoints: eps}}})
	if !errors.Is(err, io.EOF) { // io.EOF: the server already ended the stream; Recv has its status
		require.NoError(t, err)
	}
	return st, cancel
}

func books(addr string) *registrationpb.Endpoint {
	return &registrationpb.Endpoint{Authority: "books.default.svc.cluster.local:7000", Addr: addr,
		Protocol: registrationpb.ProtocolHint_PROTOCOL_HINT_H2, Labels: map[string]string{"zone": "zone-a"}}
}

// getStream watches the endpoints of authority on the control plane's
// Destination API.
func getStream(t *testing.T, c *regtest.ControlPlane, authority string) grpc.ServerStreamingClient[pb.Update] {
	t.Helper()
	ctx, dst := destinationOf(t, c)
	st, err := dst.Get(ctx, &pb.GetDestination{Path: authority})
	require.NoError(t, err)
	return st
}

// destinationOf is a Destination client of c, plaintext, and a context for
// its calls; both end with the test.
func destinationOf(t *testing.T, c *regtest.ControlPlane) (context.Context, pb.DestinationClient) {
	t.Helper()
	conn, err := grpc.NewClient(c.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), regTimeout)
	t.Cleanup(cancel)
	return ctx, pb.NewDestinationClient(conn)
}

// A workload registers over mTLS: its endpoint reaches a Get stream with
// the caller's identity, hint and labels; Deregister removes it at once
// (a remove on the stream) and the stream ends; a registration whose
// stream just ends (the workload died) is removed too.
func TestRegistrationAcceptedAndRemoved(t *testing.T) {
	c := regtest.Start(t, regtest.Manifests)
	local := c.Certify(t, regtest.BooksID)
	get := getStream(t, c, "books.default.svc.cluster.local:7000")

	st, cancel := register(t, c, local, books("127.0.0.1:4001"))
	resp, err := st.Recv()
	require.NoError(t, err)
	assert.Equal(t, regtest.BooksID, resp.GetAccepted().GetIdentity())
	assert.EqualValues(t, 1, resp.GetAccepted().GetEndpoints())

	up, err := get.Recv()
	require.NoError(t, err)
	addrs := up.GetAdd().GetAddrs()
	require.Len(t, addrs, 1)
	assert.Equal(t, regtest.BooksID, addrs[0].GetTlsIdentity().GetDnsLikeIdentity().GetName())
	assert.NotNil(t, addrs[0].GetProtocolHint().GetH2())
	assert.Equal(t, "zone-a", addrs[0].GetMetricLabels()["zone"])

	require.NoError(t, st.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Deregister{Deregister: &registrationpb.Deregister{}}}))
	resp, err = st.Recv()
	require.NoError(t, err)
	assert.NotNil(t, resp.GetDeregistered())
	up, err = get.Recv()
	require.NoError(t, err)
	require.Len(t, up.GetRemove().GetAddrs(), 1, "the deregistered endpoint is removed")

	// A workload that goes away without a word.
	_, cancel2 := register(t, c, local, books("127.0.0.1:4002"))
	up, err = get.Recv()
	require.NoError(t, err)
	require.Len(t, up.GetAdd().GetAddrs(), 1)
	cancel2()
	up, err = get.Recv()
	require.NoError(t, err)
	require.Len(t, up.GetRemove().GetAddrs(), 1, "a broken stream's endpoints are removed")
	cancel()
}

// What the control plane refuses, with the code, the words of the reason
// and its metric label: an endpoint carrying another identity than the
// caller's; a Service (or port) the caller's identity may not serve; a
// plaintext caller without insecure registration; the bounds.
func TestRegistrationRefused(t *testing.T) {
	m := testutil.NewMetrics(t)
	c := regtest.Start(t, regtest.Manifests, controlplane.WithMeterProvider(m.Provider),
		controlplane.WithRegistrationLimits(2, 1), controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	booksLocal := c.Certify(t, regtest.BooksID)
	webLocal := c.Certify(t, regtest.WebID)
	reviews := &registrationpb.Endpoint{Authority: "reviews.default.svc.cluster.local:9000", Addr: "127.0.0.1:4003"}
	bigLabels := map[string]string{}
	for i := range 40 {
		bigLabels[strings.Repeat("k", i+1)] = "v"
	}
	for _, tc := range []struct {
		name   string
		local  *identity.Local
		eps    []*registrationpb.Endpoint
		code   codes.Code
		words  []string
		reason string
	}{
		{"another identity", booksLocal, []*registrationpb.Endpoint{{Authority: "books.default.svc.cluster.local:7000", Addr: "127.0.0.1:4001", Identity: regtest.WebID}},
			codes.PermissionDenied, []string{regtest.WebID, regtest.BooksID}, controlplane.RefusedIdentity},
		{"a service by annotation, other identity", booksLocal, []*registrationpb.Endpoint{reviews},
			codes.PermissionDenied, []string{regtest.BooksID, "default/reviews"}, controlplane.RefusedService},
		{"a service by selector, other identity", webLocal, []*registrationpb.Endpoint{books("127.0.0.1:4001")},
			codes.PermissionDenied, []string{regtest.WebID, "default/books"}, controlplane.RefusedService},
		{"a port the service does not define", booksLocal, []*registrationpb.Endpoint{{Authority: "books.default.svc.cluster.local:7001", Addr: "127.0.0.1:4001"}},
			codes.PermissionDenied, []string{"port 7001", "default/books"}, controlplane.RefusedService},
		{"a service that does not exist", booksLocal, []*registrationpb.Endpoint{{Authority: "authors.default.svc.cluster.local:7000", Addr: "127.0.0.1:4001"}},
			codes.PermissionDenied, []string{"default/authors"}, controlplane.RefusedService},
		{"plaintext", nil, []*registrationpb.Endpoint{books("127.0.0.1:4001")},
			codes.PermissionDenied, []string{"no verified mTLS identity"}, controlplane.RefusedPlaintext},
		{"too many endpoints", booksLocal, []*registrationpb.Endpoint{books("127.0.0.1:4001"), books("127.0.0.1:4002"), books("127.0.0.1:4003")},
			codes.ResourceExhausted, []string{"3 endpoints, more than the 2"}, controlplane.RefusedLimit},
		{"too many labels", booksLocal, []*registrationpb.Endpoint{{Authority: "books.default.svc.cluster.local:7000", Addr: "127.0.0.1:4001", Labels: bigLabels}},
			codes.ResourceExhausted, []string{"40 labels"}, controlplane.RefusedLimit},
		{"not a cluster name", booksLocal, []*registrationpb.Endpoint{{Authority: "books.example.com:7000", Addr: "127.0.0.1:4001"}},
			codes.InvalidArgument, []string{"books.example.com:7000"}, controlplane.RefusedInvalid},
		{"unspecified address", booksLocal, []*registrationpb.Endpoint{books("0.0.0.0:4001")},
			codes.InvalidArgument, []string{"0.0.0.0:4001"}, controlplane.RefusedInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := m.Value(t, "registration_refused_total", `reason="`+tc.reason+`"`)
			st, _ := register(t, c, tc.local, tc.eps...)
			_, err := st.Recv()
			require.Error(t, err)
			assert.Equal(t, tc.code, status.Code(err), "%v", err)
			for _, w := range tc.words {
				assert.Contains(t, status.Convert(err).Message(), w)
			}
			after := m.Value(t, "registration_refused_total", `reason="`+tc.reason+`"`)
			assert.NotEqual(t, before, after, "the refusal is counted under reason %s", tc.reason)
		})
	}

	// The annotation lets web serve reviews; one registration per
	// identity (the limit set above): a second is refused while the first
	// is open.
	st, _ := register(t, c, webLocal, reviews)
	resp, err := st.Recv()
	require.NoError(t, err, "the annotation binds web to reviews")
	require.NotNil(t, resp.GetAccepted())
	st2, _ := register(t, c, webLocal, reviews)
	_, err = st2.Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), regtest.WebID)
	assert.Equal(t, "3", m.Value(t, "registration_refused_total", `reason="limit"`), "two bounds of a request and one of the streams")
}

// With insecure registration, a plaintext caller is accepted, for
// development: its endpoint carries no identity.
func TestRegistrationInsecure(t *testing.T) {
	c := regtest.Start(t, regtest.Manifests, controlplane.WithInsecureRegistration(), controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	get := getStream(t, c, "books.default.svc.cluster.local:7000")
	st, _ := register(t, c, nil, books("127.0.0.1:4001"))
	resp, err := st.Recv()
	require.NoError(t, err)
	assert.Empty(t, resp.GetAccepted().GetIdentity())
	up, err := get.Recv()
	require.NoError(t, err)
	require.Len(t, up.GetAdd().GetAddrs(), 1)
	assert.Nil(t, up.GetAdd().GetAddrs()[0].GetTlsIdentity())
}

// Over files, registered endpoints are served beside the endpoints file's
// set of the same authority; an address in both (with one identity: the
// workload registers the address the file gives it) is served as the
// file gives it; deregistered, the file's set stays.
func TestRegisteredMergeWithFiles(t *testing.T) {
	c := regtest.Start(t, regtest.Manifests)
	c.Store.PutEndpoints("books.default.svc.cluster.local:7000", []endpoint.Endpoint{
		{Addr: netip.MustParseAddrPort("127.0.0.1:4001"), Identity: regtest.BooksID, Labels: map[string]string{"from": "file"}}})
	get := getStream(t, c, "books.default.svc.cluster.local:7000")
	up, err := get.Recv()
	require.NoError(t, err)
	require.Len(t, up.GetAdd().GetAddrs(), 1)

	st, cancel := register(t, c, c.Certify(t, regtest.BooksID), books("127.0.0.1:4001"), books("127.0.0.1:4002"))
	_, err = st.Recv()
	require.NoError(t, err)
	up, err = get.Recv()
	require.NoError(t, err)
	added := up.GetAdd().GetAddrs()
	require.Len(t, added, 1, "only the new address is added: %v", added)
	assert.EqualValues(t, 4002, added[0].GetAddr().GetPort())
	cancel()
	up, err = get.Recv()
	require.NoError(t, err)
	removed := up.GetRemove().GetAddrs()
	require.Len(t, removed, 1, "the file's address stays")
	assert.EqualValues(t, 4002, removed[0].GetPort())
}

// A registration lasts only as long as the manifests bind the caller to
// its Service: a change that keeps the binding keeps it; one that removes
// the binding (the Pod that gave the identity gone) ends the stream as a
// refusal, counted, and the endpoint leaves the answers at once.
func TestRegistrationEndsWhenUnbound(t *testing.T) {
	m := testutil.NewMetrics(t)
	c := regtest.Start(t, regtest.Manifests, controlplane.WithMeterProvider(m.Provider), controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	local := c.Certify(t, regtest.BooksID)
	get := getStream(t, c, "books.default.svc.cluster.local:7000")
	load := func(docs string) {
		r, err := manifest.LoadFiles(manifest.File{Name: "manifests.yaml", Data: []byte(docs)})
		require.NoError(t, err)
		c.Store.SetManifests(r)
	}

	st, cancel := register(t, c, local, books("127.0.0.1:4001"))
	defer cancel()
	resp, err := st.Recv()
	require.NoError(t, err)
	require.NotNil(t, resp.GetAccepted())
	up, err := get.Recv()
	require.NoError(t, err)
	require.Len(t, up.GetAdd().GetAddrs(), 1)

	// Another Service added: the binding stands, the stream still serves.
	load(regtest.Manifests + `
---
apiVersion: v1
kind: Service
metadata: {name: authors, namespace: default}
spec: {ports: [{name: http, port: 7000}]}
`)
	require.NoError(t, st.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Endpoints{
		Endpoints: &registrationpb.Endpoints{Endpoints: []*registrationpb.Endpoint{books("127.0.0.1:4001"), books("127.0.0.1:4002")}}}}))
	resp, err = st.Recv()
	require.NoError(t, err, "a change that keeps the binding keeps the registration")
	require.NotNil(t, resp.GetAccepted())
	up, err = get.Recv()
	require.NoError(t, err)
	require.Len(t, up.GetAdd().GetAddrs(), 1, "the second endpoint added")

	// The books Pod gone: nothing binds the books identity to the Service.
	before := m.Value(t, "registration_refused_total", `reason="service"`)
	load(`
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec: {selector: {app: books}, ports: [{name: http, port: 7000}]}
`)
	_, err = st.Recv()
	require.Error(t, err)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "manifests changed")
	assert.Contains(t, status.Convert(err).Message(), "default/books")
	assert.NotEqual(t, before, m.Value(t, "registration_refused_total", `reason="service"`), "counted")
	up, err = get.Recv()
	require.NoError(t, err)
	assert.Len(t, up.GetRemove().GetAddrs(), 2, "both endpoints leave the answers")
}

// A change to what binds a registration can come between its subscription
// to the binding and its own first check: the handler still answers
// Deregister (and so still notices a workload that goes away), instead of
// blocking on the notice the change already gave.
func TestRegistrationChangeWhileBinding(t *testing.T) {
	c := regtest.Start(t, regtest.Manifests, controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	local := c.Certify(t, regtest.BooksID)
	edited, err := manifest.LoadFiles(manifest.File{Name: "manifests.yaml", Data: []byte(strings.Replace(regtest.Manifests,
		"metadata: {name: books, namespace: default}", "metadata: {name: books, namespace: default, annotations: {note: edited}}", 1))})
	require.NoError(t, err)
	require.Contains(t, fmt.Sprint(edited.Service("default", "books").Annotations), "edited", "the edit changes the books Service")
	restore := controlplane.SetBoundHook(func() { c.Store.SetManifests(edited) })
	defer restore()

	st, cancel := register(t, c, local, books("127.0.0.1:4001"))
	defer cancel()
	resp, err := st.Recv()
	require.NoError(t, err)
	require.NotNil(t, resp.GetAccepted())
	require.NoError(t, st.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Deregister{Deregister: &registrationpb.Deregister{}}}))
	resp, err = st.Recv()
	require.NoError(t, err, "Deregister is answered")
	assert.NotNil(t, resp.GetDeregistered())
}
