package controlplane_test

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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

// adsManifests bind books:7000 to the books identity (selector and Pod)
// and ads:80 to web's identity (annotation): web may serve ads, not
// books.
const adsManifests = regtest.Manifests + `
---
apiVersion: v1
kind: Service
metadata:
  name: ads
  namespace: default
  annotations: {inmesh.io/registration-identities: "web.default.serviceaccount.identity.linkerd.cluster.local"}
spec: {ports: [{name: http, port: 80}]}
`

const adsAuthority = "ads.default.svc.cluster.local:80"

// getProfile opens a GetProfile stream of path on c.
func getProfile(t *testing.T, c *regtest.ControlPlane, path string) grpc.ServerStreamingClient[pb.DestinationProfile] {
	t.Helper()
	ctx, dst := destinationOf(t, c)
	st, err := dst.GetProfile(ctx, &pb.GetDestination{Path: path})
	require.NoError(t, err)
	return st
}

func identityOf(p *pb.DestinationProfile) string {
	return p.GetEndpoint().GetTlsIdentity().GetDnsLikeIdentity().GetName()
}

// A workload may not register the address of a workload of another
// identity, whether the endpoints file gives it (with an identity or
// without) or another identity's registration holds it: web, which may
// serve ads only, registers ads:80 at books-0's address with the opaque
// hint, and is refused FailedPrecondition naming the holder, counted
// under reason "address". GetProfile of the address (what a proxy asks
// when its application dials that IP) keeps the holder's identity and
// hint. Before, the registration was accepted and the address answered
// with web's identity and the opaque hint, the first authority by name
// (ads) winning.
func TestRegistrationRefusesAnAddressAnotherWorkloadHolds(t *testing.T) {
	m := testutil.NewMetrics(t)
	c := regtest.Start(t, adsManifests, controlplane.WithMeterProvider(m.Provider), controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	c.Store.SetEndpoints(map[string][]endpoint.Endpoint{
		"books.default.svc.cluster.local:7000": {
			{Addr: netip.MustParseAddrPort("127.0.0.1:4001"), Weight: endpoint.DefaultWeight, H2: true, Identity: regtest.BooksID},
			{Addr: netip.MustParseAddrPort("127.0.0.1:4003"), Weight: endpoint.DefaultWeight},
		},
	})
	st, _ := register(t, c, c.Certify(t, regtest.BooksID), books("127.0.0.1:4002"))
	resp, err := st.Recv()
	require.NoError(t, err)
	require.NotNil(t, resp.GetAccepted(), "books registers its own address")
	web := c.Certify(t, regtest.WebID)

	for _, tc := range []struct {
		addr, holder, want string
	}{
		{"127.0.0.1:4001", regtest.BooksID, `identity "` + regtest.BooksID + `" (the endpoints file's books.default.svc.cluster.local:7000)`},
		{"127.0.0.1:4002", regtest.BooksID, `identity "` + regtest.BooksID + `" (registered for books.default.svc.cluster.local:7000)`},
		{"127.0.0.1:4003", "", `no identity (the endpoints file's books.default.svc.cluster.local:7000)`},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			prof := getProfile(t, c, tc.addr)
			before, err := prof.Recv()
			require.NoError(t, err)
			require.Equal(t, tc.holder, identityOf(before))
			refused := m.Value(t, "registration_refused_total", `reason="address"`)

			st, _ := register(t, c, web, &registrationpb.Endpoint{Authority: adsAuthority, Addr: tc.addr,
				Protocol: registrationpb.ProtocolHint_PROTOCOL_HINT_OPAQUE})
			resp, err := st.Recv()
			if assert.Equal(t, codes.FailedPrecondition, status.Code(err), "web registered %s: %v", tc.addr, resp) {
				assert.Equal(t, `registration: endpoints[0] (`+tc.addr+` of `+adsAuthority+`, identity "`+regtest.WebID+`"): the address is held by `+
					tc.want+`; a workload may not register another's address`, status.Convert(err).Message())
				assert.NotEqual(t, refused, m.Value(t, "registration_refused_total", `reason="address"`), "counted")
			}

			after, err := getProfile(t, c, tc.addr).Recv()
			require.NoError(t, err)
			assert.Equal(t, tc.holder, identityOf(after), "GetProfile of %s names the registrant's identity", tc.addr)
			assert.True(t, proto.Equal(before, after), "GetProfile of %s changed:\nbefore %v\nafter  %v", tc.addr, before, after)
		})
	}
}

// An address that workloads of two identities still claim (a
// registration accepted before the endpoints file gave its address to
// another identity, or two replicas that each accepted one) is answered
// as Linkerd's controller answers an IP two pods claim
// (watcher/workload_watcher.go getPodByPodIP): GetProfile of it is
// FailedPrecondition naming both, and an open GetProfile stream ends so,
// never answering with whichever came first. Once one claim goes, the
// address answers with the other. An IP that several workloads share on
// different ports (loopback, a host) is no conflict, but says nothing of
// a port none of them has: no identity there, rather than the first
// one's.
func TestGetProfileOfAnAddressTwoWorkloadsClaim(t *testing.T) {
	c := regtest.Start(t, adsManifests, controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	const addr = "127.0.0.1:4001"
	st, _ := register(t, c, c.Certify(t, regtest.WebID), &registrationpb.Endpoint{Authority: adsAuthority, Addr: addr})
	resp, err := st.Recv()
	require.NoError(t, err)
	require.NotNil(t, resp.GetAccepted())
	open := getProfile(t, c, addr)
	first, err := open.Recv()
	require.NoError(t, err)
	require.Equal(t, regtest.WebID, identityOf(first))

	booksFile := map[string][]endpoint.Endpoint{"books.default.svc.cluster.local:7000": {
		{Addr: netip.MustParseAddrPort(addr), Weight: endpoint.DefaultWeight, Identity: regtest.BooksID},
		{Addr: netip.MustParseAddrPort("127.0.0.1:4002"), Weight: endpoint.DefaultWeight, Identity: regtest.BooksID},
	}}
	c.Store.SetEndpoints(booksFile)
	const want = `found 2 workloads with a conflicting address 127.0.0.1:4001: identity "` + regtest.BooksID +
		`" (the endpoints file's books.default.svc.cluster.local:7000), identity "` + regtest.WebID + `" (registered for ` + adsAuthority + `)`
	p, err := getProfile(t, c, addr).Recv()
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "a new stream answered %v", p)
	assert.Equal(t, want, status.Convert(err).Message())
	p, err = open.Recv()
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "the open stream answered %v", p)
	assert.Equal(t, want, status.Convert(err).Message())

	// web also on 127.0.0.1:4004, books on 4002: port 4009 has neither.
	require.NoError(t, st.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Endpoints{Endpoints: &registrationpb.Endpoints{
		Endpoints: []*registrationpb.Endpoint{{Authority: adsAuthority, Addr: "127.0.0.1:4004"}}}}}))
	resp, err = st.Recv()
	require.NoError(t, err)
	require.NotNil(t, resp.GetAccepted(), "web leaves 4001 for 4004")
	p, err = getProfile(t, c, addr).Recv()
	require.NoError(t, err)
	assert.Equal(t, regtest.BooksID, identityOf(p), "4001 is books' alone")
	p, err = getProfile(t, c, "127.0.0.1:4009").Recv()
	require.NoError(t, err)
	assert.Empty(t, identityOf(p), "a port of a shared IP that no endpoint has")
	assert.Empty(t, p.GetEndpoint().GetMetricLabels())

	c.Store.SetEndpoints(nil)
	p, err = getProfile(t, c, "127.0.0.1:4009").Recv()
	require.NoError(t, err)
	assert.Equal(t, regtest.WebID, identityOf(p), "an IP of one workload gives its identity to its other ports, as a pod IP")
}

// Two Services given one spec.clusterIP (a copied manifest whose
// clusterIP was left as it was) load with a problem naming both files
// and documents, and a GetProfile of that address is refused as Linkerd's
// controller refuses it (server.go getSvcID: FailedPrecondition "found 2
// services with conflicting cluster IP ..."), where it answered the first
// Service's profile (and opaque ports) before; an OutboundPolicies lookup of
// the address is refused alike. Fixed, the address answers its Service's
// profile and policy.
func TestGetProfileOfAClusterIPTwoServicesShare(t *testing.T) {
	db := manifest.File{Name: "db.yaml", Data: []byte("apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: default}\nspec: {clusterIP: 10.96.0.10, ports: [{name: tcp, port: 5432}]}\n")}
	web := func(clusterIP string) manifest.File {
		return manifest.File{Name: "web.yaml", Data: []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default, annotations: {config.linkerd.io/opaque-ports: \"5432\"}}\n" +
			"spec: {clusterIP: " + clusterIP + ", ports: [{name: http, port: 5432}]}\n")}
	}
	r, err := manifest.LoadFiles(db, web("10.96.0.10"))
	require.NoError(t, err)
	var problems []string
	for _, p := range r.Problems() {
		problems = append(problems, p.Error())
	}
	assert.Equal(t, []string{"db.yaml: document 1 (Service default/db): spec.clusterIP: 10.96.0.10 is also the clusterIP of web.yaml: document 1 (Service default/web); " +
		"a GetProfile or an OutboundPolicies lookup of 10.96.0.10 is refused (FailedPrecondition) until one Service alone has it"}, problems)

	c := regtest.Start(t, "")
	c.Store.SetManifests(r)
	p, err := getProfile(t, c, "10.96.0.10:5432").Recv()
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "answered the profile of %s", p.GetFullyQualifiedName())
	assert.Equal(t, "found 2 services with conflicting cluster IP 10.96.0.10", status.Convert(err).Message())
	policyOf := func(addr string) (*outboundpb.OutboundPolicy, error) {
		conn, err := grpc.NewClient(c.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
		defer cancel()
		return outboundpb.NewOutboundPoliciesClient(conn).Get(ctx, &outboundpb.TrafficSpec{SourceWorkload: "default:web-0",
			Target: &outboundpb.TrafficSpec_Addr{Addr: destination.AddrToProto(netip.MustParseAddrPort(addr))}})
	}
	pol, err := policyOf("10.96.0.10:5432")
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "answered the policy of %s", pol.GetMetadata().GetResource().GetName())

	r, err = manifest.LoadFiles(db, web("10.96.0.11"))
	require.NoError(t, err)
	assert.Empty(t, r.Problems())
	c.Store.SetManifests(r)
	for ip, want := range map[string]string{"10.96.0.10": "db", "10.96.0.11": "web"} {
		p, err = getProfile(t, c, ip+":5432").Recv()
		require.NoError(t, err)
		assert.Equal(t, want+".default.svc.cluster.local", p.GetFullyQualifiedName())
		pol, err := policyOf(ip + ":5432")
		require.NoError(t, err)
		assert.Equal(t, want, pol.GetMetadata().GetResource().GetName())
	}
}
