package etcd_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/inmesh/inmesh/internal/regtest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/registrationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// registeringReplica is a control-plane replica as examples/destination
// runs one on etcd: its Store follows the keys under prefix (manifests,
// endpoints, every replica's registrations) and its registrations are
// leases in etcd.
func registeringReplica(t *testing.T, endpoint string) *regtest.ControlPlane {
	t.Helper()
	cli := newClient(t, endpoint)
	quiet := slog.New(slog.DiscardHandler)
	c := regtest.Start(t, "", controlplane.WithLogger(quiet), controlplane.WithRegistry(etcdstore.NewRegistry(cli, prefix, 0)))
	ctx, cancel := context.WithCancel(context.Background())
	wait, err := etcdstore.Watch(ctx, c.Store, cli, prefix, etcdstore.WithLogger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { cancel(); wait() })
	return c
}

// sendEndpoints opens a registration as local on c and sends eps.
func sendEndpoints(t *testing.T, c *regtest.ControlPlane, id string, eps ...*registrationpb.Endpoint) sharedStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	st, err := registrationpb.NewRegistrationClient(c.Dial(t, c.Certify(t, id))).Register(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Endpoints{
		Endpoints: &registrationpb.Endpoints{Endpoints: eps}}}))
	return st
}

// profileIdentity returns a function that reads the next GetProfile
// answer of path on c and returns its endpoint's identity.
func profileIdentity(t *testing.T, c *regtest.ControlPlane, path string) func() (string, error) {
	t.Helper()
	conn, err := grpc.NewClient(c.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	st, err := pb.NewDestinationClient(conn).GetProfile(ctx, &pb.GetDestination{Path: path})
	require.NoError(t, err)
	return func() (string, error) {
		p, err := st.Recv()
		return p.GetEndpoint().GetTlsIdentity().GetDnsLikeIdentity().GetName(), err
	}
}

// A registration that lists one endpoint twice (one authority, one
// address) is refused InvalidArgument naming both entries, by a control
// plane that keeps registrations in memory and by one that keeps them in
// etcd alike. Over etcd both entries would be one key, and one
// transaction that puts a key twice fails ("duplicate key given in txn
// request"): the workload got Unavailable there, and retried it forever,
// where the in-memory control plane accepted it. Nothing is written.
func TestDuplicateEndpointRefusedAlikeInMemoryAndOverEtcd(t *testing.T) {
	ep := &registrationpb.Endpoint{Authority: regBooks, Addr: "127.0.0.1:4001"}
	const want = "registration: endpoints[1] repeats endpoints[0] (127.0.0.1:4001 of " + regBooks + "): list each endpoint once"

	_, err := sendEndpoints(t, regtest.Start(t, regtest.Manifests), regtest.BooksID, ep, ep).Recv()
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "in memory: %v", err)
	assert.Equal(t, want, status.Convert(err).Message(), "in memory")

	c, cli := etcdControlPlane(t, regtest.Manifests)
	_, err = sendEndpoints(t, c, regtest.BooksID, ep, ep).Recv()
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "over etcd: %v", err)
	assert.Equal(t, want, status.Convert(err).Message(), "over etcd")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	keys, err := cli.Get(ctx, prefix+"/"+etcdstore.RegistrationsDir+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	assert.Zero(t, keys.Count, "nothing registered")
}

// Over etcd, a registrant cannot take the address that a workload of
// another identity registered through another replica: every replica's
// store holds every registration (etcd's watch), so replica B refuses web
// (which the manifests let serve books too) the address books registered
// through replica A, FailedPrecondition naming books' identity, and
// GetProfile of that address on B still names books. Before, B accepted
// it, and the address answered with whichever identity came first. The
// same identity may register the address again through B (a workload
// that moved to another replica while its lease runs).
func TestRegistrantCannotTakeAnAddressRegisteredThroughAnotherReplica(t *testing.T) {
	m := etcdtest.Start(t)
	put(t, newClient(t, m.Endpoint), etcdstore.ManifestKey(prefix, "books"), sharedManifests)
	a, b := registeringReplica(t, m.Endpoint), registeringReplica(t, m.Endpoint)
	const addr = "127.0.0.1:4001"

	resp, err := sendEndpoints(t, a, regtest.BooksID, &registrationpb.Endpoint{Authority: regBooks, Addr: addr}).Recv()
	require.NoError(t, err)
	require.NotNil(t, resp.GetAccepted(), "books registers through A")
	onB := profileIdentity(t, b, addr)
	for {
		id, err := onB()
		require.NoError(t, err)
		if id == regtest.BooksID {
			break // B holds A's registration
		}
	}

	_, err = sendEndpoints(t, b, regtest.WebID, &registrationpb.Endpoint{Authority: regBooks, Addr: addr,
		Protocol: registrationpb.ProtocolHint_PROTOCOL_HINT_OPAQUE}).Recv()
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "web takes books' address through B: %v", err)
	assert.Equal(t, `registration: endpoints[0] (127.0.0.1:4001 of `+regBooks+`, identity "`+regtest.WebID+`"): the address is held by identity "`+
		regtest.BooksID+`" (registered for `+regBooks+`); a workload may not register another's address`, status.Convert(err).Message())
	id, err := profileIdentity(t, b, addr)()
	require.NoError(t, err)
	assert.Equal(t, regtest.BooksID, id, "GetProfile of the address on B")

	resp, err = sendEndpoints(t, b, regtest.BooksID, &registrationpb.Endpoint{Authority: regBooks, Addr: addr}).Recv()
	require.NoError(t, err, "the same identity again, through B")
	assert.NotNil(t, resp.GetAccepted())
}

// Two Services with one spec.clusterIP, written to etcd, load on every
// replica; each names the conflict in its log (manifest.Resources.Problems)
// and answers a GetProfile of that address FailedPrecondition, as
// Linkerd's controller does, instead of the first Service's profile.
func TestConflictingClusterIPNamedAndRefusedByEveryReplica(t *testing.T) {
	m := etcdtest.Start(t)
	put(t, newClient(t, m.Endpoint), etcdstore.ManifestKey(prefix, "services"), `apiVersion: v1
kind: Service
metadata: {name: db, namespace: default}
spec: {clusterIP: 10.96.0.10, ports: [{port: 5432}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {clusterIP: 10.96.0.10, ports: [{port: 5432}]}
`)
	for i, r := range []*replica{startReplica(t, m.Endpoint), startReplica(t, m.Endpoint)} {
		assert.Equal(t, 1, r.logs.Count("a loaded policy manifest cannot work as written",
			"document 1 (Service default/db): spec.clusterIP: 10.96.0.10 is also the clusterIP of", "document 2 (Service default/web)"),
			"replica %d names the conflict:\n%s", i, r.logs.String())
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		st, err := r.dst.GetProfile(ctx, &pb.GetDestination{Path: "10.96.0.10:5432"})
		require.NoError(t, err)
		p, err := st.Recv()
		assert.Equal(t, codes.FailedPrecondition, status.Code(err), "replica %d answered the profile of %s", i, p.GetFullyQualifiedName())
		assert.Equal(t, "found 2 services with conflicting cluster IP 10.96.0.10", status.Convert(err).Message())
	}
}
