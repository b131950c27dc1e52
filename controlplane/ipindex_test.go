package controlplane_test

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/regtest"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/inmesh/inmesh/proxyapi/registrationpb"
)

// addrAnswer is what a control plane answers a lookup by address: its
// first message, or the status that refused it.
type addrAnswer struct {
	Msg    proto.Message
	Status string
}

// addrAnswers are the answers of a control plane, on a plaintext gRPC
// connection to addr, to GetProfile of each of profiles and to an
// OutboundPolicies lookup of each of policies.
func addrAnswers(t *testing.T, addr string, profiles, policies []string) map[string]addrAnswer {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	out := make(map[string]addrAnswer)
	answer := func(m proto.Message, err error) addrAnswer {
		if err != nil {
			return addrAnswer{Status: status.Code(err).String() + ": " + status.Convert(err).Message()}
		}
		return addrAnswer{Msg: m}
	}
	dst := pb.NewDestinationClient(conn)
	for _, path := range profiles {
		sctx, scancel := context.WithCancel(ctx)
		st, err := dst.GetProfile(sctx, &pb.GetDestination{Path: path})
		require.NoError(t, err)
		out["profile "+path] = answer(st.Recv())
		scancel()
	}
	pol := outboundpb.NewOutboundPoliciesClient(conn)
	for _, a := range policies {
		out["policy "+a] = answer(pol.Get(ctx, &outboundpb.TrafficSpec{SourceWorkload: "default:web-0",
			Target: &outboundpb.TrafficSpec_Addr{Addr: destination.AddrToProto(netip.MustParseAddrPort(a))}}))
	}
	return out
}

// serveStore serves store on a loopback port until the test ends.
func serveStore(t testing.TB, store *controlplane.Store) string {
	t.Helper()
	g := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(slog.New(slog.DiscardHandler))).Register(g)
	return controlplane.ServeGRPC(t, g)
}

// indexManifests are adsManifests and a Service db whose clusterIP is
// the first argument, and a Service cache whose clusterIP is the second
// (none when "").
func indexManifests(t *testing.T, dbIP, cacheIP string) *manifest.Resources {
	t.Helper()
	yaml := adsManifests + `
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: default}
spec: {clusterIP: ` + dbIP + `, ports: [{name: tcp, port: 5432}]}
`
	if cacheIP != "" {
		yaml += `---
apiVersion: v1
kind: Service
metadata: {name: cache, namespace: default}
spec: {clusterIP: ` + cacheIP + `, ports: [{name: tcp, port: 6379}]}
`
	}
	r, err := manifest.LoadFiles(manifest.File{Name: "manifests.yaml", Data: []byte(yaml)})
	require.NoError(t, err)
	return r
}

// The lookups by address (GetProfile of an IP, the OutboundPolicies of an
// address outside the cluster: the workload there or the egress
// fallback) answer after every kind of change what a control plane
// started with the state reached answers: endpoint sets added, moved,
// replaced and removed, registrations made, renewed at another address,
// deregistered and broken off, and manifest reloads that give, share and
// move a clusterIP. The store looks an address up in an index that each
// change updates; an update missed leaves answers that a fresh store
// does not give.
func TestAddressLookupsFollowEveryChange(t *testing.T) {
	c := regtest.Start(t, adsManifests, controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	profiles := []string{
		"127.0.0.1:4001", "127.0.0.1:4002", "127.0.0.1:4004", "127.0.0.1:4005", "127.0.0.1:4009",
		"127.0.0.2:4001", "127.0.0.2:5432", "127.0.0.3:4001", "127.0.0.5:5432",
		"10.1.0.1:8080", "10.1.0.1:9000", "10.1.0.1:7", "[::ffff:127.0.0.1]:4002",
	}
	policies := []string{
		"127.0.0.1:4001", "127.0.0.1:4004", "127.0.0.1:4005", "127.0.0.1:4009",
		"127.0.0.2:4001", "127.0.0.2:5432", "127.0.0.3:4001", "127.0.0.5:5432", "127.0.0.9:80", "10.1.0.1:8080",
	}
	ep := func(addr, id string) endpoint.Endpoint {
		return endpoint.Endpoint{Addr: netip.MustParseAddrPort(addr), Weight: endpoint.DefaultWeight, Identity: id}
	}
	const (
		booksAuthority   = "books.default.svc.cluster.local:7000"
		reviewsAuthority = "reviews.default.svc.cluster.local:9000"
	)
	var booksReg, webReg regStream
	var webCancel context.CancelFunc
	accepted := func(t *testing.T, st regStream) {
		t.Helper()
		resp, err := st.Recv()
		require.NoError(t, err)
		require.NotNil(t, resp.GetAccepted(), "refused: %v", resp)
	}

	for _, step := range []struct {
		name string
		do   func()
		// wantIdentity spot-checks GetProfile: the identity of the
		// endpoint answered, or the code of the refusal.
		wantIdentity map[string]string
	}{
		{"add a set", func() {
			c.Store.PutEndpoints(booksAuthority, []endpoint.Endpoint{
				ep("127.0.0.1:4001", regtest.BooksID), ep("127.0.0.2:4001", ""), ep("10.1.0.1:8080", regtest.BooksID)})
		}, map[string]string{"127.0.0.1:4001": regtest.BooksID, "127.0.0.2:4001": "", "10.1.0.1:7": regtest.BooksID}},
		{"add a set at the same IPs", func() {
			c.Store.PutEndpoints(reviewsAuthority, []endpoint.Endpoint{ep("127.0.0.1:4002", regtest.WebID), ep("10.1.0.1:9000", regtest.WebID)})
		}, map[string]string{"127.0.0.1:4002": regtest.WebID, "10.1.0.1:7": "", "127.0.0.1:4009": ""}},
		{"move an endpoint to another IP", func() {
			c.Store.PutEndpoints(booksAuthority, []endpoint.Endpoint{
				ep("127.0.0.3:4001", regtest.BooksID), ep("127.0.0.2:4001", ""), ep("10.1.0.1:8080", regtest.BooksID)})
		}, map[string]string{"127.0.0.3:4001": regtest.BooksID, "127.0.0.1:4001": regtest.WebID}},
		{"register a workload", func() {
			booksReg, _ = register(t, c, c.Certify(t, regtest.BooksID), books("127.0.0.1:4001"))
			accepted(t, booksReg)
		}, map[string]string{"127.0.0.1:4001": regtest.BooksID, "127.0.0.1:4009": ""}},
		{"register a second workload", func() {
			webReg, webCancel = register(t, c, c.Certify(t, regtest.WebID), &registrationpb.Endpoint{Authority: adsAuthority, Addr: "127.0.0.1:4004"})
			accepted(t, webReg)
		}, map[string]string{"127.0.0.1:4004": regtest.WebID}},
		{"a set gives a registered address to another workload", func() {
			c.Store.PutEndpoints(reviewsAuthority, []endpoint.Endpoint{
				ep("127.0.0.1:4001", regtest.WebID), ep("127.0.0.1:4002", regtest.WebID), ep("10.1.0.1:9000", regtest.WebID)})
		}, map[string]string{"127.0.0.1:4001": "FailedPrecondition"}},
		{"renew a registration at another address", func() {
			require.NoError(t, booksReg.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Endpoints{
				Endpoints: &registrationpb.Endpoints{Endpoints: []*registrationpb.Endpoint{books("127.0.0.1:4005")}}}}))
			accepted(t, booksReg)
		}, map[string]string{"127.0.0.1:4001": regtest.WebID, "127.0.0.1:4005": regtest.BooksID}},
		{"deregister", func() {
			require.NoError(t, booksReg.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Deregister{
				Deregister: &registrationpb.Deregister{}}}))
			resp, err := booksReg.Recv()
			require.NoError(t, err)
			require.NotNil(t, resp.GetDeregistered())
		}, map[string]string{"127.0.0.1:4005": regtest.WebID}},
		{"a registration's stream breaks", func() {
			get := getStream(t, c, adsAuthority)
			up, err := get.Recv()
			require.NoError(t, err)
			require.Len(t, up.GetAdd().GetAddrs(), 1)
			webCancel()
			up, err = get.Recv()
			require.NoError(t, err)
			require.Len(t, up.GetRemove().GetAddrs(), 1, "the broken registration's endpoint is removed")
		}, nil},
		{"remove a set", func() {
			c.Store.DeleteEndpoints(reviewsAuthority)
		}, map[string]string{"127.0.0.1:4001": "", "127.0.0.1:4002": "", "10.1.0.1:7": regtest.BooksID}},
		{"register at an address of the removed set", func() {
			booksReg, _ = register(t, c, c.Certify(t, regtest.BooksID), books("127.0.0.1:4002"))
			accepted(t, booksReg)
		}, map[string]string{"127.0.0.1:4002": regtest.BooksID}},
		{"reload manifests: a Service at an IP of a workload", func() {
			c.Store.SetManifests(indexManifests(t, "127.0.0.2", ""))
		}, nil},
		{"reload manifests: two Services share the IP", func() {
			c.Store.SetManifests(indexManifests(t, "127.0.0.2", "127.0.0.2"))
		}, map[string]string{"127.0.0.2:5432": "FailedPrecondition", "127.0.0.2:4001": "FailedPrecondition"}},
		{"reload manifests: the Service moves", func() {
			c.Store.SetManifests(indexManifests(t, "127.0.0.5", ""))
		}, map[string]string{"127.0.0.2:4001": ""}},
		{"replace every set", func() {
			c.Store.SetEndpoints(map[string][]endpoint.Endpoint{
				reviewsAuthority: {ep("127.0.0.2:4001", regtest.WebID), ep("127.0.0.3:4001", regtest.WebID)}})
		}, map[string]string{"127.0.0.2:4001": regtest.WebID, "10.1.0.1:8080": ""}},
		{"remove every set", func() {
			c.Store.SetEndpoints(nil)
		}, map[string]string{"127.0.0.2:4001": "", "127.0.0.3:4001": ""}},
	} {
		// Steps share the registrations, which end with the test: no
		// subtests.
		step.do()
		got := addrAnswers(t, c.Addr, profiles, policies)
		want := addrAnswers(t, serveStore(t, c.Store.Fresh()), profiles, policies)
		if !assert.Empty(t, cmp.Diff(want, got, protocmp.Transform()), "%s: answers of the store after the changes (+) and of a fresh store with its state (-)", step.name) {
			break
		}
		for path, id := range step.wantIdentity {
			a := got["profile "+path]
			if a.Status != "" {
				assert.Contains(t, a.Status, id+": ", "%s: GetProfile %s", step.name, path)
				continue
			}
			assert.Equal(t, id, identityOf(a.Msg.(*pb.DestinationProfile)), "%s: GetProfile %s", step.name, path)
		}
	}
}
