package controlplane

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// A change to one Service wakes the streams that watch it and no other,
// as go-control-plane's linear cache notifies only the watchers of the
// resource that changed: with 50 Services watched by Get and GetProfile
// streams, an endpoint change, a ServiceProfile and a reload of every
// endpoint set that changes one Service each wake only that Service's
// stream; a reload that changes nothing wakes nobody.
func TestChangeWakesOnlyItsWatchers(t *testing.T) {
	store := NewStore()
	srv := NewServer(store, WithLogger(quietLogger))
	cp := serve(t, srv)
	api := rawClient(t, cp.addr)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	const n = 50
	name := func(i int) string { return fmt.Sprintf("svc-%d.default.svc.cluster.local", i) }
	sets := map[string][]endpoint.Endpoint{}
	for i := range n {
		sets[name(i)+":80"] = []endpoint.Endpoint{ep(fmt.Sprintf("10.0.0.%d:80", i+1), false)}
	}
	store.SetEndpoints(sets)
	gets := make([]grpc.ServerStreamingClient[pb.Update], n)
	profs := make([]grpc.ServerStreamingClient[pb.DestinationProfile], n)
	for i := range n {
		var err error
		gets[i], err = api.Get(ctx, &pb.GetDestination{Path: name(i) + ":80"})
		require.NoError(t, err)
		_, err = recvTimeout(t, gets[i].Recv)
		require.NoError(t, err)
		profs[i], err = api.GetProfile(ctx, &pb.GetDestination{Path: name(i) + ":80"})
		require.NoError(t, err)
		_, err = recvTimeout(t, profs[i].Recv)
		require.NoError(t, err)
	}
	// Every stream is parked on its wake-up once each watches.
	waitWatchers(t, store, 2*n)

	// expectWakes applies change, waits for what the stream that
	// watches it receives, and checks how many streams woke.
	expectWakes := func(what string, want int64, change func(), recv func() error) {
		t.Helper()
		before := srv.wakes.Load()
		change()
		if recv != nil {
			require.NoError(t, recv(), what)
		}
		// A wake-up counted after the receipt would be a stream woken
		// for nothing: it reads the store and parks again, sending
		// nothing. Give such wake-ups a moment to be counted.
		deadline := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(deadline) && srv.wakes.Load()-before <= want {
			time.Sleep(5 * time.Millisecond)
		}
		assert.Equal(t, want, srv.wakes.Load()-before, "%s: streams woken", what)
	}

	expectWakes("an endpoint change of one Service", 1, func() {
		store.PutEndpoints(name(7)+":80", []endpoint.Endpoint{ep("10.0.0.8:80", false), ep("10.0.1.8:80", false)})
	}, func() error {
		u, err := recvTimeout(t, gets[7].Recv)
		if err == nil && len(u.GetAdd().GetAddrs()) != 1 {
			err = fmt.Errorf("got %v, want one address added", u)
		}
		return err
	})
	expectWakes("a ServiceProfile of one Service", 1, func() {
		store.PutServiceProfile(serviceProfile(name(9), "r1"))
	}, func() error {
		m, err := recvTimeout(t, profs[9].Recv)
		if err == nil && len(m.GetRoutes()) != 1 {
			err = fmt.Errorf("got %v, want one route", m)
		}
		return err
	})
	sets[name(3)+":80"] = nil
	expectWakes("a reload of every endpoint set that changes one", 1, func() {
		sets[name(7)+":80"] = []endpoint.Endpoint{ep("10.0.0.8:80", false), ep("10.0.1.8:80", false)}
		store.SetEndpoints(sets)
	}, func() error {
		u, err := recvTimeout(t, gets[3].Recv)
		if err == nil && len(u.GetRemove().GetAddrs()) != 1 {
			err = fmt.Errorf("got %v, want one address removed", u)
		}
		return err
	})
	expectWakes("a reload that changes nothing", 0, func() { store.SetEndpoints(sets) }, nil)
	expectWakes("UpdateEndpoints of one set", 1, func() {
		store.UpdateEndpoints(map[string][]endpoint.Endpoint{name(11) + ":80": {ep("10.0.0.12:80", false), ep("10.0.1.12:80", false)}}, nil)
	}, func() error {
		u, err := recvTimeout(t, gets[11].Recv)
		if err == nil && len(u.GetAdd().GetAddrs()) != 1 {
			err = fmt.Errorf("got %v, want one address added", u)
		}
		return err
	})
	expectWakes("UpdateEndpoints of a set as it is", 0, func() {
		store.UpdateEndpoints(map[string][]endpoint.Endpoint{name(12) + ":80": {ep("10.0.0.13:80", false)}}, nil)
	}, nil)
	expectWakes("UpdateRegistered of one Service", 1, func() {
		store.UpdateRegistered("r", map[string][]endpoint.Endpoint{name(13) + ":80": {ep("10.0.2.14:80", false)}}, nil)
	}, func() error {
		u, err := recvTimeout(t, gets[13].Recv)
		if err == nil && len(u.GetAdd().GetAddrs()) != 1 {
			err = fmt.Errorf("got %v, want one address added", u)
		}
		return err
	})
	expectWakes("UpdateRegistered removing it", 1, func() { store.UpdateRegistered("r", nil, []string{name(13) + ":80"}) }, func() error {
		u, err := recvTimeout(t, gets[13].Recv)
		if err == nil && len(u.GetRemove().GetAddrs()) != 1 {
			err = fmt.Errorf("got %v, want one address removed", u)
		}
		return err
	})
}

// UpdateEndpoints and UpdateRegistered leave a store as SetEndpoints and
// PutRegistered of the whole result would: the same sets served, and the
// same state for a store made afresh from it.
func TestUpdatesMatchReplacingEverything(t *testing.T) {
	a := func(i int) string { return fmt.Sprintf("svc-%d.default.svc.cluster.local:80", i) }
	files := map[string][]endpoint.Endpoint{
		a(1): {ep("10.0.0.1:80", false)}, a(2): {ep("10.0.0.2:80", true)}, a(3): {ep("10.0.0.3:80", false), ep("10.0.1.3:80", false)}}
	regs := map[string][]endpoint.Endpoint{a(3): {ep("10.0.2.3:80", true)}, a(4): {ep("10.0.2.4:80", false)}}
	incremental, whole := NewStore(), NewStore()
	for _, s := range []*Store{incremental, whole} {
		s.SetEndpoints(files)
		s.PutRegistered("etcd", regs)
	}

	// A set changed (in another order), one deleted, one added, one the
	// same; a registration moved from one Service to another, and one
	// added to a Service the files give.
	files2 := map[string][]endpoint.Endpoint{
		a(1): {ep("10.0.1.1:80", false), ep("10.0.0.1:80", false)}, a(3): files[a(3)], a(5): {ep("10.0.0.5:80", false)}}
	regs2 := map[string][]endpoint.Endpoint{a(4): {ep("10.0.2.3:80", true)}, a(1): {ep("10.0.2.1:80", false)}}
	incremental.UpdateEndpoints(map[string][]endpoint.Endpoint{a(1): files2[a(1)], a(5): files2[a(5)]}, []string{a(2)})
	incremental.UpdateRegistered("etcd", map[string][]endpoint.Endpoint{a(4): regs2[a(4)], a(1): regs2[a(1)]}, []string{a(3)})
	whole.SetEndpoints(files2)
	whole.PutRegistered("etcd", regs2)

	assert.Equal(t, whole.EndpointSets(), incremental.EndpointSets())
	assert.Equal(t, whole.Fresh().EndpointSets(), incremental.Fresh().EndpointSets())
	for _, ip := range []string{"10.0.0.2", "10.0.2.3", "10.0.2.1", "10.0.0.5"} {
		ws, wok := whole.byIP[netip.MustParseAddr(ip)]
		is, iok := incremental.byIP[netip.MustParseAddr(ip)]
		assert.Equal(t, wok, iok, ip)
		assert.Equal(t, ws, is, ip)
	}
}

// waitWatchers waits until n streams watch the store.
func waitWatchers(t *testing.T, s *Store, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		got := map[*waiter]bool{}
		for _, ws := range s.waiters {
			for w := range ws {
				got[w] = true
			}
		}
		return len(got) == n
	}, defaultTestTimeout, 5*time.Millisecond)
}

// A reload of the policy manifests (a rewritten file) wakes only the
// streams whose answer it changes, each kind diffed per key: with 8
// Services watched by OutboundPolicies.Watch, GetProfile,
// InboundServerPolicies.WatchPort and a Watches stream's policy and
// profile subscriptions, an HTTPRoute added to one Service wakes its two
// policy streams alone, a Server added for one pod its inbound stream
// alone, a Service's opaque-ports annotation that Service's streams alone,
// a ServiceProfile changed its profile streams alone, and a rewrite that
// changes nothing nobody; every woken stream gets its new answer. The file
// is loaded as etcdstore loads its keys (profiles, then manifests, of one
// set of documents). Before, a reload woke every policy, profile and
// inbound stream (40 here).
func TestManifestReloadWakesOnlyWhatChanged(t *testing.T) {
	const n = 8
	service := func(i int, extra string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: svc-%d, namespace: default%s}\nspec: {selector: {app: svc-%d}, ports: [{port: 80}]}\n", i, extra, i)
	}
	pod := func(i int) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: pod-%d, namespace: default, labels: {app: svc-%d}}\nspec: {containers: [{name: app, ports: [{containerPort: 8080}]}]}\n", i, i)
	}
	route := "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r3, namespace: default}\n" +
		"spec:\n  parentRefs: [{group: core, kind: Service, name: svc-3, port: 80}]\n  rules: [{matches: [{path: {type: PathPrefix, value: /three}}]}]\n"
	server := "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: s2, namespace: default}\n" +
		"spec: {podSelector: {matchLabels: {app: svc-2}}, port: 8080, proxyProtocol: HTTP/2}\n"
	profile := func(path string) string {
		return "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: svc-1.default.svc.cluster.local, namespace: default}\n" +
			"spec:\n  routes: [{name: r1, condition: {method: GET, pathRegex: '" + path + "'}}]\n"
	}
	profilePath := "/one/[^/]*"
	file := filepath.Join(t.TempDir(), "manifests.yaml")
	write := func(opaque5 bool, extra ...string) {
		docs := []string{profile(profilePath)}
		for i := range n {
			annotation := ""
			if i == 5 && opaque5 {
				annotation = `, annotations: {config.linkerd.io/opaque-ports: "80"}`
			}
			docs = append(docs, service(i, annotation), pod(i))
		}
		docs = append(docs, extra...)
		require.NoError(t, os.WriteFile(file, []byte(strings.Join(docs, "---\n")), 0o644))
	}
	write(false)
	store := NewStore()
	// As etcdstore loads its keys: the profiles, then the manifests, of
	// one set of documents.
	load := func() {
		require.NoError(t, store.LoadServiceProfiles(file))
		require.NoError(t, store.LoadManifests(file))
	}
	load()
	srv := NewServer(store, WithLogger(quietLogger))
	cp := serve(t, srv)
	conn, err := grpc.NewClient(cp.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	api, policies, inbound := pb.NewDestinationClient(conn), outboundpb.NewOutboundPoliciesClient(conn), inboundpb.NewInboundServerPoliciesClient(conn)
	authority := func(i int) string { return fmt.Sprintf("svc-%d.default.svc.cluster.local:80", i) }
	spec := func(i int) *outboundpb.TrafficSpec {
		return &outboundpb.TrafficSpec{SourceWorkload: "default:client", Target: &outboundpb.TrafficSpec_Authority{Authority: authority(i)}}
	}

	pols := make([]grpc.ServerStreamingClient[outboundpb.OutboundPolicy], n)
	profs := make([]grpc.ServerStreamingClient[pb.DestinationProfile], n)
	ins := make([]grpc.ServerStreamingClient[inboundpb.Server], n)
	mux, _ := watchesStream(t, cp.addr)
	for i := range n {
		pols[i], err = policies.Watch(ctx, spec(i))
		require.NoError(t, err)
		_, err = recvTimeout(t, pols[i].Recv)
		require.NoError(t, err)
		profs[i], err = api.GetProfile(ctx, &pb.GetDestination{Path: authority(i)})
		require.NoError(t, err)
		_, err = recvTimeout(t, profs[i].Recv)
		require.NoError(t, err)
		ins[i], err = inbound.WatchPort(ctx, &inboundpb.PortSpec{Workload: fmt.Sprintf("default:pod-%d", i), Port: 8080})
		require.NoError(t, err)
		_, err = recvTimeout(t, ins[i].Recv)
		require.NoError(t, err)
		require.NoError(t, mux.Send(&watchespb.WatchRequest{Request: &watchespb.WatchRequest_Subscribe{Subscribe: &watchespb.Subscribe{
			Id: uint64(100 + i), Kind: watchespb.Kind_POLICY, TrafficSpec: spec(i)}}}))
		require.NoError(t, mux.Send(subscribeReq(uint64(200+i), watchespb.Kind_PROFILE, authority(i))))
	}
	for range 2 * n {
		r, err := recvTimeout(t, mux.Recv)
		require.NoError(t, err)
		require.Nil(t, r.GetEnded(), "%v", r)
	}
	waitWatchers(t, store, 5*n) // three Linkerd streams and two subscriptions each

	expectWakes := func(what string, want int64, change func(), recv ...func() error) {
		t.Helper()
		before := srv.wakes.Load()
		change()
		for _, r := range recv {
			require.NoError(t, r(), what)
		}
		// As in TestChangeWakesOnlyItsWatchers: a stream woken for
		// nothing is counted after the receipts, or never.
		deadline := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(deadline) && srv.wakes.Load()-before <= want {
			time.Sleep(5 * time.Millisecond)
		}
		assert.Equal(t, want, srv.wakes.Load()-before, "%s: streams woken", what)
	}
	reload := func(opaque5 bool, extra ...string) func() {
		return func() {
			write(opaque5, extra...)
			load()
		}
	}
	hasRoute := func(p *outboundpb.OutboundPolicy) error {
		for _, r := range p.GetProtocol().GetDetect().GetHttp1().GetRoutes() {
			if r.GetMetadata().GetResource().GetName() == "r3" {
				return nil
			}
		}
		return fmt.Errorf("no route r3 in %v", p)
	}
	muxAnswer := func(id uint64, check func(*watchespb.WatchResponse) error) func() error {
		return func() error {
			r, err := recvTimeout(t, mux.Recv)
			if err != nil {
				return err
			}
			if r.GetId() != id {
				return fmt.Errorf("answer of %d, want %d: %v", r.GetId(), id, r)
			}
			return check(r)
		}
	}

	expectWakes("an HTTPRoute added to svc-3", 2, reload(false, route), func() error {
		p, err := recvTimeout(t, pols[3].Recv)
		if err != nil {
			return err
		}
		return hasRoute(p)
	}, muxAnswer(103, func(r *watchespb.WatchResponse) error { return hasRoute(r.GetPolicy()) }))

	expectWakes("a rewrite that changes nothing", 0, reload(false, route))

	profilePath = "/uno/[^/]*"
	expectWakes("svc-1's ServiceProfile", 2, reload(false, route), func() error {
		p, err := recvTimeout(t, profs[1].Recv)
		if err == nil && !strings.Contains(p.String(), `"/uno/[^/]*"`) {
			err = fmt.Errorf("got %v, want the new route", p)
		}
		return err
	}, muxAnswer(201, func(r *watchespb.WatchResponse) error {
		if r.GetProfile() == nil {
			return fmt.Errorf("got %v, want a profile", r)
		}
		return nil
	}))

	expectWakes("a Server for pod-2's port", 1, reload(false, route, server), func() error {
		s, err := recvTimeout(t, ins[2].Recv)
		if err == nil && s.GetProtocol().GetHttp2() == nil {
			err = fmt.Errorf("got %v, want the Server's HTTP/2", s)
		}
		return err
	})

	// The profile and both policy streams of svc-5: the profile turns
	// opaque, and so does the policy.
	expectWakes("svc-5's port made opaque", 4, reload(true, route, server), func() error {
		p, err := recvTimeout(t, profs[5].Recv)
		if err == nil && !p.GetOpaqueProtocol() {
			err = fmt.Errorf("got %v, want opaque", p)
		}
		return err
	}, func() error {
		p, err := recvTimeout(t, pols[5].Recv)
		if err == nil && p.GetProtocol().GetOpaque() == nil {
			err = fmt.Errorf("got %v, want opaque", p)
		}
		return err
	}, func() error {
		// The Watches stream's two answers, in either order.
		got := map[uint64]bool{}
		for range 2 {
			r, err := recvTimeout(t, mux.Recv)
			if err != nil {
				return err
			}
			got[r.GetId()] = true
		}
		if !got[105] || !got[205] {
			return fmt.Errorf("answers of %v, want 105 and 205", got)
		}
		return nil
	})

	// Back to an earlier state: each answer is compared with what the
	// last reload computed, not with the state before that.
	noRoute := func(p *outboundpb.OutboundPolicy) error {
		if hasRoute(p) == nil {
			return fmt.Errorf("route r3 still in %v", p)
		}
		return nil
	}
	expectWakes("svc-3's HTTPRoute removed", 2, reload(true, server), func() error {
		p, err := recvTimeout(t, pols[3].Recv)
		if err != nil {
			return err
		}
		return noRoute(p)
	}, muxAnswer(103, func(r *watchespb.WatchResponse) error { return noRoute(r.GetPolicy()) }))
	expectWakes("a rewrite after the removal that changes nothing", 0, reload(true, server))

	// A stream opened since the last reload (a client of another
	// namespace: a key no reload has answered yet) is woken by the next
	// reload that changes its answer, as the others are.
	late, err := policies.Watch(ctx, &outboundpb.TrafficSpec{SourceWorkload: "other:client", Target: &outboundpb.TrafficSpec_Authority{Authority: authority(3)}})
	require.NoError(t, err)
	p, err := recvTimeout(t, late.Recv)
	require.NoError(t, err)
	require.NoError(t, noRoute(p))
	waitWatchers(t, store, 5*n+1)
	expectWakes("svc-3's HTTPRoute added again", 3, reload(true, route, server), func() error {
		p, err := recvTimeout(t, pols[3].Recv)
		if err != nil {
			return err
		}
		return hasRoute(p)
	}, func() error {
		p, err := recvTimeout(t, late.Recv)
		if err != nil {
			return err
		}
		return hasRoute(p)
	}, muxAnswer(103, func(r *watchespb.WatchResponse) error { return hasRoute(r.GetPolicy()) }))
}
