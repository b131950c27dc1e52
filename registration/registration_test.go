package registration_test

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/cpaddr"
	"github.com/inmesh/inmesh/internal/regtest"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/registration"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

func books(addr string) []registration.Endpoint {
	return []registration.Endpoint{{Authority: "books.default.svc.cluster.local:7000", Addr: netip.MustParseAddrPort(addr), H2: true}}
}

func waitAccepted(t *testing.T, r *registration.Registration) {
	t.Helper()
	select {
	case <-r.Accepted():
	case <-time.After(testutil.Timeout):
		t.Fatalf("not accepted: %v", r.Err())
	}
}

// Register waits for no control plane: it returns at once while none
// listens, and the endpoints are registered once one starts.
func TestRegisterBeforeTheControlPlane(t *testing.T) {
	addr := testutil.FreeAddr(t)
	conn, err := registration.Dial(addr, nil, "")
	require.NoError(t, err)
	defer conn.Close()
	fast, err := backoff.Fixed(50 * time.Millisecond)
	require.NoError(t, err)
	start := time.Now()
	var logs testutil.LogLines
	r, err := registration.Register(context.Background(), conn, books("127.0.0.1:4001"),
		registration.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), registration.WithRetry(fast))
	require.NoError(t, err)
	assert.Less(t, time.Since(start), time.Second, "Register returned at once")
	assert.ErrorIs(t, r.Err(), registration.ErrPending, "not registered while no control plane answers")

	regtest.StartOn(t, addr, regtest.Manifests, controlplane.WithInsecureRegistration(), controlplane.WithLogger(quiet))
	waitAccepted(t, r)
	assert.NoError(t, r.Err())
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `accepted the endpoints" endpoints=1`) },
		testutil.Timeout, 10*time.Millisecond, "the acceptance is confirmed in the log: %s", &logs)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	require.NoError(t, r.Deregister(ctx))
}

// A refused registration keeps its reason in Err and is retried; a
// control plane that refuses plaintext names it.
func TestRefusedIsRetried(t *testing.T) {
	c := regtest.Start(t, regtest.Manifests, controlplane.WithLogger(quiet))
	fast, err := backoff.Fixed(20 * time.Millisecond)
	require.NoError(t, err)
	r, err := registration.Register(context.Background(), c.Dial(t, nil), books("127.0.0.1:4001"), registration.WithLogger(quiet), registration.WithRetry(fast))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return status.Code(r.Err()) == codes.PermissionDenied }, testutil.Timeout, 10*time.Millisecond)
	assert.Contains(t, r.Err().Error(), "no verified mTLS identity")
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	require.NoError(t, r.Deregister(ctx))
}

// A registration the control plane refuses as invalid (InvalidArgument:
// here an authority outside the cluster's names, which only the control
// plane checks) is not retried: no attempt would be read otherwise. It
// ends (Done), Err keeps the refusal, and the control plane counted one
// refusal although the retry policy would have tried every 10 ms.
func TestInvalidIsNotRetried(t *testing.T) {
	m := testutil.NewMetrics(t)
	c := regtest.Start(t, regtest.Manifests, controlplane.WithInsecureRegistration(), controlplane.WithLogger(quiet), controlplane.WithMeterProvider(m.Provider))
	fast, err := backoff.Fixed(10 * time.Millisecond)
	require.NoError(t, err)
	r, err := registration.Register(context.Background(), c.Dial(t, nil),
		[]registration.Endpoint{{Authority: "books.example.com:7000", Addr: netip.MustParseAddrPort("127.0.0.1:4001")}},
		registration.WithLogger(quiet), registration.WithRetry(fast))
	require.NoError(t, err)
	select {
	case <-r.Done():
	case <-time.After(testutil.Timeout):
		t.Fatalf("still registering after %v: %v", testutil.Timeout, r.Err())
	}
	assert.Equal(t, codes.InvalidArgument, status.Code(r.Err()), "%v", r.Err())
	assert.Contains(t, r.Err().Error(), "books.example.com:7000")
	assert.Equal(t, "1", m.Value(t, "registration_refused_total", `reason="invalid"`), "one attempt")
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	assert.NoError(t, r.Deregister(ctx), "Deregister of an ended registration returns")
}

// Endpoints that cannot be sent are errors of Register.
func TestRegisterInvalid(t *testing.T) {
	conn, err := registration.Dial(testutil.FreeAddr(t), nil, "")
	require.NoError(t, err)
	defer conn.Close()
	for _, tc := range []struct {
		name string
		eps  []registration.Endpoint
		want string
	}{
		{"none", nil, "no endpoint"},
		{"no authority", []registration.Endpoint{{Addr: netip.MustParseAddrPort("127.0.0.1:1")}}, "endpoint 0: an authority and an address are required"},
		{"no address", []registration.Endpoint{{Authority: "books.default.svc.cluster.local:7000"}}, "endpoint 0: an authority and an address are required"},
		{"h2 and opaque", []registration.Endpoint{{Authority: "books.default.svc.cluster.local:7000", Addr: netip.MustParseAddrPort("127.0.0.1:1"), H2: true, Opaque: true}}, "exclude each other"},
		{"listed twice", append(books("127.0.0.1:1"), registration.Endpoint{Authority: "Books.default.svc.cluster.local:7000", Addr: netip.MustParseAddrPort("127.0.0.1:1")}),
			"endpoint 1 repeats endpoint 0 (127.0.0.1:1 of Books.default.svc.cluster.local:7000)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := registration.Register(context.Background(), conn, tc.eps)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A registration whose replica goes silent without closing the connection
// (its host lost, its process frozen) moves to the next live replica: the
// connection's ping goes unanswered, and the endpoints are registered
// again there, before the first replica's lease would have kept them.
func TestRegistrationLeavesAStalledReplica(t *testing.T) {
	first := regtest.Start(t, regtest.Manifests, controlplane.WithInsecureRegistration(), controlplane.WithLogger(quiet))
	second := regtest.Start(t, regtest.Manifests, controlplane.WithInsecureRegistration(), controlplane.WithLogger(quiet))
	proxy := testutil.StartStallProxy(t, first.Addr)
	conn, err := registration.Dial(proxy.Addr()+","+second.Addr, nil, "")
	require.NoError(t, err)
	defer conn.Close()
	fast, err := backoff.Fixed(50 * time.Millisecond)
	require.NoError(t, err)
	r, err := registration.Register(context.Background(), conn, books("127.0.0.1:4001"), registration.WithLogger(quiet), registration.WithRetry(fast))
	require.NoError(t, err)
	waitAccepted(t, r)
	dst := watchBooks(t, second.Addr)
	require.Eventually(t, func() bool { _, ok := dst(); return ok }, testutil.Timeout, 10*time.Millisecond, "the second replica answers")
	eps, _ := dst()
	assert.Empty(t, eps, "registered on the first replica only")

	proxy.Stall()
	require.Eventually(t, func() bool { eps, _ := dst(); return len(eps) == 1 }, cpaddr.MinPing+registration.KeepaliveTimeout+testutil.Timeout, 10*time.Millisecond,
		"the registration never reached the second replica")
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	require.NoError(t, r.Deregister(ctx))
}

// watchBooks watches the books Service's endpoints on the control plane at
// addr and returns a function that gives the last set, and whether one
// came.
func watchBooks(t *testing.T, addr string) func() ([]endpoint.Endpoint, bool) {
	t.Helper()
	c, err := destination.Dial(addr, destination.WithLogger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	var mu sync.Mutex
	var last []endpoint.Endpoint
	var answered bool
	stop, err := c.WatchEndpoints(context.Background(), "books.default.svc.cluster.local:7000", func(u endpoint.Update) {
		mu.Lock()
		defer mu.Unlock()
		if u.Set != nil {
			last, answered = u.Set.Endpoints, true
		}
	})
	require.NoError(t, err)
	t.Cleanup(stop)
	return func() ([]endpoint.Endpoint, bool) {
		mu.Lock()
		defer mu.Unlock()
		return last, answered
	}
}

// removalFails is a Registry whose leases cannot be removed, as over an
// etcd out of reach; Release reports each remove flag.
type removalFails struct{ released chan bool }

func (r removalFails) Open(context.Context) (controlplane.Lease, error) { return r, nil }
func (r removalFails) Put(context.Context, map[string][]endpoint.Endpoint) error {
	return nil
}

func (r removalFails) Release(_ context.Context, remove bool) error {
	r.released <- remove
	if remove {
		return errors.New("etcd: revoking lease 1: context deadline exceeded")
	}
	return nil
}
func (r removalFails) Lost() <-chan struct{} { return nil }

// A deregistration the control plane cannot carry out (its etcd out of
// reach) is an error of Deregister, not a confirmation: the endpoints may
// stay in the answers until the lease expires, and the workload must not
// take them for gone.
func TestDeregisterUnconfirmedWhenTheEndpointsStay(t *testing.T) {
	reg := removalFails{released: make(chan bool, 1)}
	c := regtest.Start(t, regtest.Manifests, controlplane.WithInsecureRegistration(), controlplane.WithLogger(quiet), controlplane.WithRegistry(reg))
	r, err := registration.Register(context.Background(), c.Dial(t, nil), books("127.0.0.1:4001"), registration.WithLogger(quiet))
	require.NoError(t, err)
	waitAccepted(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	err = r.Deregister(ctx)
	require.Error(t, err)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "did not confirm")
	assert.Contains(t, err.Error(), "they stay in the answers until the registration's lease expires")
	assert.True(t, <-reg.released, "the control plane tried to remove the endpoints")
}

// A registration leaves a replica that stands by (it lost etcd while
// another replica reads it) at once: the replica ends the stream, leaves
// the lease to run, and refuses the connection, so that the registration
// reaches the next replica.
func TestRegistrationLeavesAReplicaOnStandby(t *testing.T) {
	reg := removalFails{released: make(chan bool, 1)}
	first := regtest.Start(t, regtest.Manifests, controlplane.WithInsecureRegistration(), controlplane.WithLogger(quiet), controlplane.WithRegistry(reg))
	second := regtest.Start(t, regtest.Manifests, controlplane.WithInsecureRegistration(), controlplane.WithLogger(quiet))
	conn, err := registration.Dial(first.Addr+","+second.Addr, nil, "")
	require.NoError(t, err)
	defer conn.Close()
	fast, err := backoff.Fixed(50 * time.Millisecond)
	require.NoError(t, err)
	r, err := registration.Register(context.Background(), conn, books("127.0.0.1:4001"), registration.WithLogger(quiet), registration.WithRetry(fast))
	require.NoError(t, err)
	waitAccepted(t, r)
	dst := watchBooks(t, second.Addr)

	first.Server.SetHealth(controlplane.Standby)
	assert.False(t, <-reg.released, "the lease is left to run, not removed")
	// Far sooner than a lost replica is noticed.
	require.Eventually(t, func() bool { eps, _ := dst(); return len(eps) == 1 }, registration.LeaveLostReplicaWithin/2, 10*time.Millisecond,
		"the registration never reached the second replica")
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	require.NoError(t, r.Deregister(ctx))
}

// The default lease TTL leaves a lease, past its replica's last keep-alive
// (every third of the TTL), more than a registration takes to notice that
// its replica froze, with time to spare to register with another: a live
// workload never leaves the answers because its replica froze.
func TestDefaultLeaseOutlivesTheMoveOffALostReplica(t *testing.T) {
	remaining := etcdstore.DefaultRegistrationTTL - etcdstore.DefaultRegistrationTTL/3
	assert.GreaterOrEqual(t, remaining, registration.LeaveLostReplicaWithin+3*time.Second)
	// And a replica that lost etcd stands by long before.
	assert.Less(t, etcdstore.DefaultStaleAfter*2, remaining)
}
