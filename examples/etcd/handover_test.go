package etcd_test

import (
	"context"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/examples/internal/cpreplica"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/registration"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// setWatch follows the endpoints of books:7000 on one replica's
// Destination API, and remembers whether the set ever went empty once it
// held an endpoint, however briefly.
type setWatch struct {
	mu      sync.Mutex
	set     map[string]bool
	emptied time.Time // the first time it went empty; zero: never
}

func followBooks(t *testing.T, addr string) *setWatch {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := pb.NewDestinationClient(conn).Get(ctx, &pb.GetDestination{Path: regBooks})
	require.NoError(t, err)
	w := &setWatch{set: map[string]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			up, err := st.Recv()
			if err != nil {
				return
			}
			w.mu.Lock()
			for _, a := range up.GetAdd().GetAddrs() {
				w.set[fmt.Sprint(a.GetAddr().GetIp(), a.GetAddr().GetPort())] = true
			}
			for _, a := range up.GetRemove().GetAddrs() {
				delete(w.set, fmt.Sprint(a.GetIp(), a.GetPort()))
			}
			if len(w.set) == 0 && w.emptied.IsZero() {
				w.emptied = time.Now()
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close()
	})
	return w
}

func (w *setWatch) size() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.set)
}

// wentEmpty returns when the set first went empty; zero: never.
func (w *setWatch) wentEmpty() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.emptied
}

// registrationLeases returns the leases (hex) under which etcd holds a
// registration of addr for books:7000.
func registrationLeases(t *testing.T, cli *clientv3.Client, addr string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dir := prefix + "/" + etcdstore.RegistrationsDir + "/" + regBooks + "/" + addr + "/"
	resp, err := cli.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	var leases []string
	for _, kv := range resp.Kvs {
		leases = append(leases, path.Base(string(kv.Key)))
	}
	return leases
}

// registerBooks registers 127.0.0.9:7000 as books through the replicas
// addrs (comma-separated) and waits for the acceptance.
func registerBooks(t *testing.T, addrs string) *registration.Registration {
	t.Helper()
	conn, err := registration.Dial(addrs, nil, "")
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	fast, err := backoff.Fixed(100 * time.Millisecond)
	require.NoError(t, err)
	reg, err := registration.Register(ctx, conn, []registration.Endpoint{{Authority: regBooks, Addr: netip.MustParseAddrPort("127.0.0.9:7000")}},
		registration.WithLogger(quiet), registration.WithRetry(fast))
	require.NoError(t, err)
	select {
	case <-reg.Accepted():
	case <-time.After(timeout):
		t.Fatalf("the registration was not accepted: %v", reg.Err())
	}
	return reg
}

// movedFrom waits until etcd holds the registration of addr under another
// lease than first (the workload registered again, through another
// replica) and returns how long that took from since; it fails the test
// past deadline.
func movedFrom(t *testing.T, cli *clientv3.Client, addr, first string, since, deadline time.Time, reg *registration.Registration) time.Duration {
	t.Helper()
	for {
		if slices.ContainsFunc(registrationLeases(t, cli, addr), func(l string) bool { return l != first }) {
			return time.Since(since)
		}
		if time.Now().After(deadline) {
			require.FailNow(t, "the registration did not move",
				"%v after its replica was lost, the live workload is still not registered through another replica, and its lease (%s) expires from now on; registration err: %v",
				time.Since(since).Round(time.Millisecond), first, reg.Err())
		}
		time.Sleep(20 * time.Millisecond) // polling interval only
	}
}

// A replica that loses its etcd (here the one member it reads, as the
// fleet demo's replica A reads only the member on its machine; likewise a
// partition between it and the etcd cluster) while the cluster keeps its
// quorum and another replica reads it. A live workload registered
// through that replica (its list "A,B") must stay in every answer: the
// replica can no longer keep its lease alive, so the registration must
// reach B before the lease expires, two thirds of the TTL after the loss
// at the earliest. It did not: the replica kept accepting the workload,
// which registered again with it after the lease expired, and waited for
// etcd for as long as the member was down; the workload was gone from
// every answer meanwhile.
func TestLiveRegistrationMovesOffAReplicaThatLostEtcd(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	var lead int
	require.Eventually(t, func() bool { lead = c.Leader(); return lead >= 0 }, timeout, 10*time.Millisecond, "no etcd leader")
	aMember := (lead + 1) % 3 // not the leader: no election follows its loss
	cli := newClient(t, c.Members[lead].Endpoint)
	put(t, cli, etcdstore.ManifestKey(prefix, "books"), regManifests)

	replicaA := startCP(t, []string{c.Members[aMember].Endpoint}, cpreplica.WithInsecureRegistration())
	replicaB := startCP(t, c.Endpoints(), cpreplica.WithInsecureRegistration())

	reg := registerBooks(t, replicaA.Addr+","+replicaB.Addr)
	onA, onB := followBooks(t, replicaA.Addr), followBooks(t, replicaB.Addr)
	// Both serve it: A has read etcd past B's start.
	require.Eventually(t, func() bool { return onA.size() == 1 && onB.size() == 1 }, timeout, 10*time.Millisecond, "the replicas do not serve the registration")
	leases := registrationLeases(t, cli, "127.0.0.9:7000")
	require.Len(t, leases, 1)

	c.Kill(aMember)
	killed := time.Now()
	ttl := etcdstore.DefaultRegistrationTTL
	took := movedFrom(t, cli, "127.0.0.9:7000", leases[0], killed, killed.Add(ttl*2/3), reg)
	t.Logf("registered through replica B %v after A lost its etcd member", took.Round(time.Millisecond))
	require.Eventually(t, func() bool { return reg.Err() == nil }, timeout, 10*time.Millisecond, "registered: %v", reg.Err())
	assert.Equal(t, 1, onB.size())
	if gone := onB.wentEmpty(); !gone.IsZero() {
		t.Errorf("the live workload left replica B's answers %v after A lost its etcd member", gone.Sub(killed).Round(time.Millisecond))
	}
}

// A replica that can no longer read etcd while the cluster keeps its
// quorum and another replica reads it: a client of "A,B" on A must move to
// B, where the changes made since go on arriving (every replica over one
// etcd serves the same answers). It did not: A accepted and kept its
// streams, and the client kept an endpoint etcd and B had dropped for as
// long as A's member was down.
func TestClientMovesOffAReplicaThatLostEtcd(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	var lead int
	require.Eventually(t, func() bool { lead = c.Leader(); return lead >= 0 }, timeout, 10*time.Millisecond, "no etcd leader")
	aMember := (lead + 1) % 3
	cli := newClient(t, c.Members[lead].Endpoint)

	replicaA := startCP(t, []string{c.Members[aMember].Endpoint})
	replicaB := startCP(t, c.Endpoints())
	// Written once both run: what A serves is past B's start.
	put(t, cli, etcdstore.EndpointsKey(prefix, "all"), endpointsYAML("127.0.0.1:9001"))

	got := watchThrough(t, []string{"127.0.0.1:9001"}, replicaA, replicaB)

	c.Kill(aMember)
	killed := time.Now()
	// The endpoint moves; replica B serves the move at once.
	put(t, cli, etcdstore.EndpointsKey(prefix, "all"), endpointsYAML("127.0.0.2:9002"))
	b := rawReplica(t, replicaB.Addr)
	require.Eventually(t, func() bool { return slices.Equal(b.endpoints(), []string{"127.0.0.2"}) }, timeout, 50*time.Millisecond, "replica B never served the change")
	for !slices.Equal(got(), []string{"127.0.0.2:9002"}) {
		if time.Since(killed) > timeout {
			require.FailNow(t, "the client stayed on the replica that lost etcd",
				"%v after replica A lost etcd, the client of A,B still uses %v, an endpoint etcd and replica B dropped; B serves 127.0.0.2:9002",
				time.Since(killed).Round(time.Millisecond), got())
		}
		time.Sleep(20 * time.Millisecond) // polling interval only
	}
	t.Logf("the client had the change through replica B %v after A lost its etcd member", time.Since(killed).Round(time.Millisecond))
}

// rawConn is a plaintext connection to one replica's Destination API.
type rawConn struct {
	t  *testing.T
	cc *grpc.ClientConn
}

func rawReplica(t *testing.T, addr string) rawConn {
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return rawConn{t: t, cc: cc}
}

// endpoints returns the IP addresses of the first answer of a new Get of
// authority, nil when the replica gives none within 5 s.
func (r rawConn) endpoints() []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := pb.NewDestinationClient(r.cc).Get(ctx, &pb.GetDestination{Path: authority})
	if err != nil {
		return nil
	}
	u, err := st.Recv()
	if err != nil {
		return nil
	}
	return addrs(u)
}
