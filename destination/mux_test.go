package destination_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// methods records the streaming calls a gRPC server was asked for.
type methods struct {
	mu   sync.Mutex
	seen []string
}

func (m *methods) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	m.mu.Lock()
	m.seen = append(m.seen, info.FullMethod)
	m.mu.Unlock()
	return handler(srv, ss)
}

func (m *methods) calls() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.seen)
}

// serveRecorded serves store's control plane on a fresh port, with every
// service when all, or else with Linkerd's Destination and
// OutboundPolicies services alone (as a Linkerd control plane, which
// answers Watches Unimplemented), recording the calls.
func serveRecorded(t *testing.T, store *controlplane.Store, all bool) (*controlPlane, *methods) {
	t.Helper()
	m := &methods{}
	lis := holdListener(t).generation()
	cp := &controlPlane{t: t, addr: lis.Addr().String(), srv: grpc.NewServer(grpc.StreamInterceptor(m.intercept)), done: make(chan struct{})}
	srv := controlplane.NewServer(store, controlplane.WithLogger(quietLogger))
	if all {
		srv.Register(cp.srv)
	} else {
		srv.Register(registrarFunc(func(desc *grpc.ServiceDesc, impl any) {
			switch desc.ServiceName {
			case "io.linkerd.proxy.destination.Destination", "io.linkerd.proxy.outbound.OutboundPolicies":
				cp.srv.RegisterService(desc, impl)
			}
		}))
	}
	go func() {
		defer close(cp.done)
		_ = cp.srv.Serve(lis)
	}()
	t.Cleanup(cp.stop)
	return cp, m
}

// registrarFunc registers services by calling itself.
type registrarFunc func(*grpc.ServiceDesc, any)

func (f registrarFunc) RegisterService(desc *grpc.ServiceDesc, impl any) { f(desc, impl) }

// watchAll watches books:7000's profile and endpoints and authors' policy
// on a fresh client, and waits for the first answer of each: the cold
// path.
func watchAll(t *testing.T, c *destination.Client) (*recorder[profiles.Update], *recorder[endpoint.Update], *recorder[policy.Update]) {
	t.Helper()
	prof, eps, pol := newRecorder[profiles.Update](), newRecorder[endpoint.Update](), newRecorder[policy.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	t.Cleanup(stop)
	stop, err = c.WatchEndpoints(context.Background(), books+":7000", eps.update)
	require.NoError(t, err)
	t.Cleanup(stop)
	stop, err = c.Policies().Watch(context.Background(), authorsAuthority, pol.update)
	require.NoError(t, err)
	t.Cleanup(stop)
	prof.waitFor(t, "the profile", hasRoute("GET /books"))
	eps.waitFor(t, "the endpoints", func(u endpoint.Update) bool { return u.Set != nil && len(u.Set.Endpoints) == 1 })
	pol.waitFor(t, "the default route", routeNamedP("http"))
	return prof, eps, pol
}

func watchStore(t *testing.T) *controlplane.Store {
	t.Helper()
	store := controlplane.NewStore()
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:7000"), Weight: endpoint.DefaultWeight}})
	store.SetServiceProfiles([]*profiles.ServiceProfile{serviceProfile(books, "GET /books")})
	store.SetManifests(resources(t, authorsServiceYAML))
	return store
}

// Against inmesh's control plane, a fresh client's first profile,
// endpoint and policy watches all go over the Watches service: the server
// sees none of Linkerd's per-name streams (the first fail-fast watch may
// open a Watches stream of its own beside one that waits for the
// connection; the one that loses the race is closed at once); a change
// arrives over it.
func TestWatchesCarryEveryKindOverOneStream(t *testing.T) {
	store := watchStore(t)
	cp, m := serveRecorded(t, store, true)
	c := newTestClient(t, cp.addr)
	_, eps, _ := watchAll(t, c)
	assert.Equal(t, []string{"/inmesh.destination.v1.Watches/Watch"}, dedup(m.calls()))

	store.PutEndpoints(books+":7000", []endpoint.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:7000"), Weight: endpoint.DefaultWeight}, {Addr: netip.MustParseAddrPort("10.0.0.2:7000"), Weight: endpoint.DefaultWeight}})
	eps.waitFor(t, "the second endpoint", func(u endpoint.Update) bool { return u.Set != nil && len(u.Set.Endpoints) == 2 })
	assert.Equal(t, []string{"/inmesh.destination.v1.Watches/Watch"}, dedup(m.calls()))
}

// Against a control plane that serves Linkerd's API alone (Watches is
// Unimplemented, as from Linkerd's controllers), the client watches with
// Linkerd's per-name streams, from the first watch on.
func TestWatchesFallBackToLinkerdStreams(t *testing.T) {
	store := watchStore(t)
	cp, m := serveRecorded(t, store, false)
	c := newTestClient(t, cp.addr)
	_, eps, _ := watchAll(t, c)
	// (gRPC answers the Watches call Unimplemented before any
	// interceptor.)
	assert.ElementsMatch(t, []string{
		"/io.linkerd.proxy.destination.Destination/GetProfile",
		"/io.linkerd.proxy.destination.Destination/Get",
		"/io.linkerd.proxy.outbound.OutboundPolicies/Watch",
	}, dedup(m.calls()))
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:7000"), Weight: endpoint.DefaultWeight}, {Addr: netip.MustParseAddrPort("10.0.0.2:7000"), Weight: endpoint.DefaultWeight}})
	eps.waitFor(t, "the second endpoint", func(u endpoint.Update) bool { return u.Set != nil && len(u.Set.Endpoints) == 2 })
}

// WithLinkerdStreams keeps a client on Linkerd's per-name streams even
// when the control plane serves Watches.
func TestWithLinkerdStreams(t *testing.T) {
	store := watchStore(t)
	cp, m := serveRecorded(t, store, true)
	c := newTestClient(t, cp.addr, destination.WithLinkerdStreams())
	watchAll(t, c)
	assert.ElementsMatch(t, []string{
		"/io.linkerd.proxy.destination.Destination/GetProfile",
		"/io.linkerd.proxy.destination.Destination/Get",
		"/io.linkerd.proxy.outbound.OutboundPolicies/Watch",
	}, m.calls())
}

func dedup(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// A watch whose stream is a subscription on the Watches stream holds no
// goroutine of its own: the stream's reader delivers its answers, and its
// mailboxes run only while an update waits. Before, every profile,
// endpoint and policy watch kept a goroutine parked for its whole life,
// three per name (about 4 KiB of stack each).
func TestWatchesHoldNoGoroutinePerWatch(t *testing.T) {
	const names = 100
	store := watchStore(t)
	name := func(i int) string { return fmt.Sprintf("svc-%d.default.svc.cluster.local:80", i) }
	sets := map[string][]endpoint.Endpoint{books + ":7000": {{Addr: netip.MustParseAddrPort("10.0.0.1:7000"), Weight: endpoint.DefaultWeight}}}
	for i := range names {
		sets[name(i)] = []endpoint.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:7000"), Weight: endpoint.DefaultWeight}}
	}
	store.SetEndpoints(sets)
	cp, m := serveRecorded(t, store, true)
	c := newTestClient(t, cp.addr)
	watchAll(t, c) // the Watches stream is open
	before := runtime.NumGoroutine()

	var answered sync.WaitGroup
	for i := range names {
		for _, watch := range []func(func()) (func(), error){
			func(f func()) (func(), error) {
				return c.Watch(context.Background(), name(i), func(profiles.Update) { f() })
			},
			func(f func()) (func(), error) {
				return c.WatchEndpoints(context.Background(), name(i), func(endpoint.Update) { f() })
			},
			func(f func()) (func(), error) {
				return c.Policies().Watch(context.Background(), name(i), func(policy.Update) { f() })
			},
		} {
			answered.Add(1)
			stop, err := watch(sync.OnceFunc(answered.Done))
			require.NoError(t, err)
			t.Cleanup(stop)
		}
	}
	answered.Wait()
	assert.Equal(t, []string{"/inmesh.destination.v1.Watches/Watch"}, dedup(m.calls()))
	require.Eventually(t, func() bool { return runtime.NumGoroutine() < before+names/4 }, 20*time.Second, 10*time.Millisecond,
		"goroutines for %d watches over the Watches stream: %d before, %d now", 3*names, before, runtime.NumGoroutine())
}
