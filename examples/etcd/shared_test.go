package etcd_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/regtest"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/proxyapi/registrationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// sharedManifests bind the books Service to two identities: the books
// service account by its Pod (regManifests), and web by the registration
// annotation.
var sharedManifests = strings.Replace(regManifests, "metadata: {name: books, namespace: default}",
	`metadata: {name: books, namespace: default, annotations: {inmesh.io/registration-identities: "`+regtest.WebID+`"}}`, 1)

type sharedStream = grpc.BidiStreamingClient[registrationpb.RegisterRequest, registrationpb.RegisterResponse]

// registerAs opens a registration as local for addr of books and waits
// for its acceptance.
func registerAs(t *testing.T, c *regtest.ControlPlane, local *identity.Local, addr string) sharedStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	st, err := registrationpb.NewRegistrationClient(c.Dial(t, local)).Register(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Endpoints{
		Endpoints: &registrationpb.Endpoints{Endpoints: []*registrationpb.Endpoint{{Authority: regBooks, Addr: addr}}}}}))
	resp, err := st.Recv()
	require.NoError(t, err)
	require.NotNil(t, resp.GetAccepted(), "accepted")
	return st
}

// etcdControlPlane is a control plane whose registrations live in a real
// etcd, and its client.
func etcdControlPlane(t *testing.T, manifests string) (*regtest.ControlPlane, *clientv3.Client) {
	m := etcdtest.Start(t)
	cli := newClient(t, m.Endpoint)
	quiet := slog.New(slog.DiscardHandler)
	c := regtest.Start(t, manifests, controlplane.WithLogger(quiet), controlplane.WithRegistry(etcdstore.NewRegistry(cli, prefix, 0)))
	return c, cli
}

// registrationIdentities returns the identity of each registration key
// under prefix.
func registrationIdentities(t *testing.T, cli *clientv3.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := cli.Get(ctx, prefix+"/"+etcdstore.RegistrationsDir+"/", clientv3.WithPrefix())
	require.NoError(t, err)
	ids := map[string]bool{}
	for _, kv := range r.Kvs {
		var v struct{ Identity string }
		require.NoError(t, json.Unmarshal(kv.Value, &v), "%s", kv.Key)
		ids[v.Identity] = true
	}
	return slices.Sorted(maps.Keys(ids))
}

// Two registrations of one address (one workload registering again while
// its last lease runs: a restart, or a move to another replica) each own
// their key in etcd: the second neither overwrites the first's nor takes
// it onto its lease, and the second's Deregister leaves the first's
// endpoint registered. (Another identity may not register an address
// that one holds: TestRegistrantCannotTakeAnAddressRegisteredThroughAnotherReplica.)
func TestSharedAddressRegistrations(t *testing.T) {
	c, cli := etcdControlPlane(t, regManifests)
	first := registerAs(t, c, c.Certify(t, regtest.BooksID), "127.0.0.1:4001")
	firstKeys := registrationKeys(t, cli)
	require.Len(t, firstKeys, 1)
	second := registerAs(t, c, c.Certify(t, regtest.BooksID), "127.0.0.1:4001")
	assert.Len(t, registrationKeys(t, cli), 2, "both registrations are held")

	require.NoError(t, second.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Deregister{Deregister: &registrationpb.Deregister{}}}))
	resp, err := second.Recv()
	require.NoError(t, err)
	require.NotNil(t, resp.GetDeregistered())
	assert.Equal(t, firstKeys, registrationKeys(t, cli), "the first registration outlives the second's")
	assert.Equal(t, []string{regtest.BooksID}, registrationIdentities(t, cli))
	require.NoError(t, first.CloseSend())
}

// registrationKeys returns the registration keys under prefix.
func registrationKeys(t *testing.T, cli *clientv3.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := cli.Get(ctx, prefix+"/"+etcdstore.RegistrationsDir+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	var out []string
	for _, kv := range r.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

// apply and delete work while workloads are registered: the registration
// keys under the prefix are neither validated nor in the way.
func TestApplyWhileRegistered(t *testing.T) {
	c, cli := etcdControlPlane(t, regtest.Manifests)
	registerAs(t, c, c.Certify(t, regtest.BooksID), "127.0.0.1:4001")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	change := etcdstore.Change{Manifests: []manifest.File{{Name: "books.yaml", Data: []byte(regManifests)}}}
	_, err := etcdstore.Apply(ctx, cli, prefix, change)
	require.NoError(t, err, "apply")
	names, err := etcdstore.Names(change)
	require.NoError(t, err)
	require.NotEmpty(t, names)
	_, err = etcdstore.Delete(ctx, cli, prefix, names)
	require.NoError(t, err, "delete")
}

// interposingKV is the client's KV with a write of the test's placed
// between a transaction's read and its commit: write runs once, just
// before the first transaction is built.
type interposingKV struct {
	clientv3.KV
	write func()
	txns  *int
}

func (k interposingKV) Txn(ctx context.Context) clientv3.Txn {
	if *k.txns++; *k.txns == 1 {
		k.write()
	}
	return k.KV.Txn(ctx)
}

// Apply commits at its first attempt when only a registration changed
// between its read and its commit, and reads again when a manifest did:
// its transaction compares the manifests' and endpoints' keys, not the
// registrations that workloads write all the time.
func TestApplyConflictsOnlyWithManifests(t *testing.T) {
	books := netip.MustParseAddrPort("127.0.0.1:4001")
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, cli *clientv3.Client)
		txns  int
	}{
		{"a registration", func(t *testing.T, cli *clientv3.Client) {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			l, err := etcdstore.NewRegistry(cli, prefix, 0).Open(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Release(context.Background(), true) })
			require.NoError(t, l.Put(ctx, map[string][]endpoint.Endpoint{regBooks: {{Addr: books}}}))
		}, 1},
		{"a manifest", func(t *testing.T, cli *clientv3.Client) {
			put(t, cli, prefix+"/"+etcdstore.ManifestsDir+"/Service/default/other", "apiVersion: v1\nkind: Service\nmetadata: {name: other, namespace: default}\nspec: {ports: [{port: 80}]}\n")
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := etcdtest.Start(t)
			cli := newClient(t, m.Endpoint)
			raw := newClient(t, m.Endpoint)
			var txns int
			cli.KV = interposingKV{KV: cli.KV, txns: &txns, write: func() { tc.write(t, raw) }}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			change := etcdstore.Change{Manifests: []manifest.File{{Name: "books.yaml", Data: []byte(regManifests)}}}
			_, err := etcdstore.Apply(ctx, cli, prefix, change)
			require.NoError(t, err, "apply")
			assert.Equal(t, tc.txns, txns, "transactions tried")
			keys, err := etcdstore.List(ctx, raw, prefix)
			require.NoError(t, err)
			names, err := etcdstore.Names(change)
			require.NoError(t, err)
			var listed []string
			for _, k := range keys {
				listed = append(listed, k.Name)
			}
			for _, n := range names {
				assert.Contains(t, listed, n, "applied")
			}
		})
	}
}
