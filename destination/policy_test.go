package destination_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"

	"github.com/google/go-cmp/cmp"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const authorsAuthority = "authors.default.svc.cluster.local:7001"

const authorsServiceYAML = `
apiVersion: v1
kind: Service
metadata:
  name: authors
  namespace: default
  annotations: {retry.linkerd.io/http: 5xx, timeout.linkerd.io/request: 2s}
spec:
  ports: [{port: 7001}]
`

const authorsRouteYAML = `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: authors-get, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: authors, port: 7001}]
  rules:
  - matches: [{path: {value: /authors}, method: GET}]
    backendRefs: [{name: authors, port: 7001, weight: 3}, {name: gone, port: 7001, weight: 1}]
`

func resources(t *testing.T, docs ...string) *manifest.Resources {
	t.Helper()
	var all string
	for _, d := range docs {
		all += "---\n" + d
	}
	r, err := manifest.Parse([]byte(all))
	require.NoError(t, err)
	return r
}

// servePolicies serves the embedded control plane (Destination and
// OutboundPolicies on one gRPC server) on h.
func servePolicies(t *testing.T, h *heldListener, store *controlplane.Store) *controlPlane {
	t.Helper()
	lis := h.generation()
	// Served as the control-plane program serves it.
	cp := &controlPlane{t: t, addr: lis.Addr().String(), srv: grpc.NewServer(controlplane.KeepaliveOptions(time.Minute)...), done: make(chan struct{})}
	controlplane.NewServer(store, controlplane.WithLogger(quietLogger)).Register(cp.srv)
	go func() {
		defer close(cp.done)
		_ = cp.srv.Serve(lis)
	}()
	t.Cleanup(cp.stop)
	return cp
}

func firstHTTPRoute(u policy.Update) *policy.HTTPRoute {
	if u.Policy == nil || len(u.Policy.HTTP1.Routes) == 0 {
		return nil
	}
	return &u.Policy.HTTP1.Routes[0]
}

func routeNamedP(name string) func(policy.Update) bool {
	return func(u policy.Update) bool {
		r := firstHTTPRoute(u)
		return r != nil && r.Meta.Name == name
	}
}

func TestPolicyDefaultRouteThenRouteOnStoreChange(t *testing.T) {
	store := controlplane.NewStore()
	store.SetManifests(resources(t, authorsServiceYAML))
	cp := servePolicies(t, holdListener(t), store)
	c := newTestClient(t, cp.addr)

	rec := newRecorder[policy.Update]()
	stop, err := c.Policies().Watch(context.Background(), authorsAuthority, rec.update)
	require.NoError(t, err)
	defer stop()
	u := rec.waitFor(t, "the default route", routeNamedP("http"))
	route := firstHTTPRoute(u)
	assert.True(t, route.Meta.IsDefault())
	assert.Equal(t, policy.Metadata{Group: "core", Kind: "Service", Namespace: "default", Name: "authors", Port: 7001}, u.Policy.Parent)
	rule := route.Rules[0]
	assert.Equal(t, 2*time.Second, rule.Timeouts.Request)
	require.NotNil(t, rule.Retry)
	assert.Equal(t, authorsAuthority, rule.Backends.Backends[0].Backend.Balancer.Authority)

	store.SetManifests(resources(t, authorsServiceYAML, authorsRouteYAML))
	u = rec.waitFor(t, "the HTTPRoute", routeNamedP("authors-get"))
	d := firstHTTPRoute(u).Rules[0].Backends
	require.Len(t, d.Backends, 2)
	assert.Equal(t, []uint32{3, 1}, []uint32{d.Backends[0].Weight, d.Backends[1].Weight})
	assert.NotNil(t, d.Backends[0].Backend.Balancer)
	assert.Nil(t, d.Backends[1].Backend.Balancer, "a backendRef to a Service without a manifest")
	require.NotNil(t, d.Backends[1].Filters[0].FailureInjector)
	assert.Equal(t, 500, d.Backends[1].Filters[0].FailureInjector.Status)
}

// What the server sends converts back to exactly what the manifests say.
func TestPolicyWireRoundTrip(t *testing.T) {
	grpcDocs := `
apiVersion: v1
kind: Service
metadata: {name: greeter, namespace: default, annotations: {retry.linkerd.io/grpc: unavailable, retry.linkerd.io/timeout: 100ms,
  balancer.linkerd.io/failure-accrual: unified, balancer.alpha.linkerd.io/failure-accrual-success-rate-threshold: "0.7"}}
---
apiVersion: policy.linkerd.io/v1beta3
kind: GRPCRoute
metadata: {name: greeter, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: greeter}]
  hostnames: ["*.example.com"]
  rules:
  - matches: [{method: {service: helloworld.Greeter}, headers: [{name: x, value: "1"}]}]
    filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: a, value: b}]}}]
    backendRefs: [{name: greeter, port: 9000}, {name: nowhere, port: 9000}]
`
	redirect := `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: moved, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: authors}]
  rules:
  - matches: [{path: {type: RegularExpression, value: "/old/.*"}, queryParams: [{name: q, value: v}]}]
    filters:
    - {type: RequestRedirect, requestRedirect: {scheme: https, hostname: new.example.com, port: 8443, statusCode: 302, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}
    - {type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: x-r, value: "1"}], remove: [server]}}
  - matches: [{path: {type: Exact, value: /x}, method: PATCH}]
    timeouts: {request: 1s, backendRequest: 500ms}
`
	accrual := `
apiVersion: v1
kind: Service
metadata: {name: flaky, namespace: default, annotations: {balancer.linkerd.io/failure-accrual: consecutive}}
spec:
  ports: [{port: 80}]
`
	r := resources(t, authorsServiceYAML, authorsRouteYAML, redirect, grpcDocs, accrual)
	flaky := r.Policy("default", "flaky", 80)
	require.NotNil(t, flaky.HTTP1.FailureAccrual)
	require.NotNil(t, r.Policy("default", "greeter", 9000).GRPC.FailureAccrual)
	for _, want := range []*policy.Policy{r.Policy("default", "authors", 7001), r.Policy("default", "greeter", 9000), flaky} {
		require.NotNil(t, want)
		got, err := destination.PolicyFromProto(destination.PolicyToProto(want))
		require.NoError(t, err)
		assert.Empty(t, cmp.Diff(want, got))
	}
}

// A watch of a Service without a manifest gets the default policy at once,
// and the Service's own once its manifest is loaded.
func TestPolicyDefaultThenServiceManifest(t *testing.T) {
	store := controlplane.NewStore()
	store.SetManifests(resources(t, authorsServiceYAML))
	store.PutEndpoints("books.default.svc.cluster.local:7000", nil)
	cp := servePolicies(t, holdListener(t), store)
	c := newTestClient(t, cp.addr)
	rec := newRecorder[policy.Update]()
	stop, err := c.WatchPolicy(context.Background(), destination.TrafficSpec{Authority: "books.default.svc.cluster.local:7000"}, rec.update)
	require.NoError(t, err)
	defer stop()
	rec.waitFor(t, "the books default policy", routeNamedP("http"))
	store.SetManifests(resources(t, authorsServiceYAML, "apiVersion: v1\nkind: Service\nmetadata: {name: books}\nspec: {ports: [{port: 7000, appProtocol: http}]}\n"))
	u := rec.waitFor(t, "the books policy, HTTP/1 only", func(u policy.Update) bool { return u.Policy != nil && u.Policy.Protocol == policy.ProtocolHTTP1 })
	assert.Equal(t, "books", u.Policy.Parent.Name)
}

func TestPolicyReconnectKeepsLastGood(t *testing.T) {
	store := controlplane.NewStore()
	store.SetManifests(resources(t, authorsServiceYAML))
	h := holdListener(t)
	cp := servePolicies(t, h, store)
	c := newTestClient(t, cp.addr)
	rec := newRecorder[policy.Update]()
	stop, err := c.WatchPolicy(context.Background(), destination.TrafficSpec{Authority: authorsAuthority}, rec.update)
	require.NoError(t, err)
	defer stop()
	rec.waitFor(t, "the default route", routeNamedP("http"))

	cp.stop()
	store.SetManifests(resources(t, authorsServiceYAML, authorsRouteYAML))
	servePolicies(t, h, store)
	rec.waitFor(t, "the route after the restart", routeNamedP("authors-get"))
	// While the control plane was down nothing was published: the last good
	// policy stayed in force.
	for _, u := range rec.all() {
		assert.NotNil(t, u.Policy)
	}
	assert.Len(t, rec.all(), 2)
}

// scriptedPolicies sends the policies it is given, one per Watch call in
// turn, and records the TrafficSpecs.
type scriptedPolicies struct {
	outboundpb.UnimplementedOutboundPoliciesServer
	mu    sync.Mutex
	specs []*outboundpb.TrafficSpec
	send  []*outboundpb.OutboundPolicy
}

func (s *scriptedPolicies) Watch(spec *outboundpb.TrafficSpec, stream grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error {
	s.mu.Lock()
	s.specs = append(s.specs, spec)
	msgs := s.send
	s.mu.Unlock()
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	<-stream.Context().Done()
	return nil
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestPolicyBadUpdateKeepsLastGoodAndNamesTheField(t *testing.T) {
	good := destination.PolicyToProto(resources(t, authorsServiceYAML).Policy("default", "authors", 7001))
	bad := destination.PolicyToProto(resources(t, authorsServiceYAML, authorsRouteYAML).Policy("default", "authors", 7001))
	bad.GetProtocol().GetDetect().GetHttp1().GetRoutes()[0].GetRules()[0].GetBackends().Kind = nil
	srv := &scriptedPolicies{send: []*outboundpb.OutboundPolicy{good, bad}}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	outboundpb.RegisterOutboundPoliciesServer(g, srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	defer func() { g.Stop(); <-done }()

	logs := &syncBuffer{}
	workload := destination.PolicyWorkload("default", "web-0")
	c := newTestClient(t, lis.Addr().String(), destination.WithLogger(slog.New(slog.NewTextHandler(logs, nil))), destination.WithWorkload(workload))
	rec := newRecorder[policy.Update]()
	stop, err := c.WatchPolicy(context.Background(), destination.TrafficSpec{Authority: authorsAuthority}, rec.update)
	require.NoError(t, err)
	defer stop()
	rec.waitFor(t, "the good policy", routeNamedP("http"))
	require.Eventually(t, func() bool {
		return bytes.Contains([]byte(logs.String()), []byte("protocol.detect.http1.routes[0].rules[0].backends.kind: missing distribution kind"))
	}, defaultTestTimeout, 10*time.Millisecond, "the log names the field: %s", logs.String())
	assert.Len(t, rec.all(), 1, "the bad policy is not published; the good one stays")

	srv.mu.Lock()
	defer srv.mu.Unlock()
	require.NotEmpty(t, srv.specs)
	assert.Equal(t, `{"ns":"default","pod":"web-0"}`, srv.specs[0].GetSourceWorkload())
	assert.Equal(t, authorsAuthority, srv.specs[0].GetAuthority())
}

func TestPolicyWatchBoundAndIdleRelease(t *testing.T) {
	store := controlplane.NewStore()
	store.SetManifests(resources(t, authorsServiceYAML))
	cp := servePolicies(t, holdListener(t), store)
	c := newTestClient(t, cp.addr, destination.WithMaxWatches(2), destination.WithIdleTimeout(0))
	ctx := context.Background()

	stop1, err := c.WatchPolicy(ctx, destination.TrafficSpec{Authority: authorsAuthority}, func(policy.Update) {})
	require.NoError(t, err)
	stop1b, err := c.WatchPolicy(ctx, destination.TrafficSpec{Authority: authorsAuthority}, func(policy.Update) {})
	require.NoError(t, err, "a second watcher of one target shares its stream")
	stop2, err := c.WatchPolicy(ctx, destination.TrafficSpec{Addr: netipAddrPort("10.0.0.1:80")}, func(policy.Update) {})
	require.NoError(t, err)
	assert.Equal(t, 2, c.Stats().PolicyWatches)
	_, err = c.Policies().Watch(ctx, "other.default.svc.cluster.local:80", func(policy.Update) {})
	require.ErrorIs(t, err, policy.ErrTooManyWatches)
	_, err = c.WatchPolicy(ctx, destination.TrafficSpec{}, func(policy.Update) {})
	require.Error(t, err, "a TrafficSpec with no target")

	stop1()
	assert.Equal(t, 2, c.Stats().PolicyWatches, "the target still has a watcher")
	stop1b()
	require.Eventually(t, func() bool { return c.Stats().PolicyWatches == 1 }, defaultTestTimeout, 10*time.Millisecond)
	stop3, err := c.Policies().Watch(ctx, "other.default.svc.cluster.local:80", func(policy.Update) {})
	require.NoError(t, err, "room again after the idle target was released")
	stop3()
	stop2()
	assert.Equal(t, uint64(1), c.Stats().RejectedWatches)
}

func TestStaticPolicySource(t *testing.T) {
	src := policy.NewStaticSource(map[string]*policy.Policy{authorsAuthority: resources(t, authorsServiceYAML).Policy("default", "authors", 7001)})
	rec := newRecorder[policy.Update]()
	stop, err := src.Watch(context.Background(), authorsAuthority, rec.update)
	require.NoError(t, err)
	defer stop()
	rec.waitFor(t, "the set policy", routeNamedP("http"))
	src.Set(authorsAuthority, nil)
	rec.waitFor(t, "no policy", func(u policy.Update) bool { return u.Policy == nil })
}

func TestWatchManifestFiles(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/authors.yaml"
	writeFile(t, path, authorsServiceYAML)
	store := controlplane.NewStore()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &syncBuffer{}
	require.NoError(t, controlplane.WatchManifestFiles(ctx, store, dir, 10*time.Millisecond, controlplane.WithLogger(slog.New(slog.NewTextHandler(logs, nil)))))
	cp := servePolicies(t, holdListener(t), store)
	c := newTestClient(t, cp.addr)
	rec := newRecorder[policy.Update]()
	stop, err := c.Policies().Watch(ctx, authorsAuthority, rec.update)
	require.NoError(t, err)
	defer stop()
	rec.waitFor(t, "the default route", routeNamedP("http"))

	writeFile(t, path, authorsServiceYAML+"---\n"+authorsRouteYAML)
	rec.waitFor(t, "the route from the edited file", routeNamedP("authors-get"))

	writeFile(t, path, authorsServiceYAML+"---\n"+authorsRouteYAML+"  hostnames: [\"Not A Host\"]\n")
	require.Eventually(t, func() bool {
		return bytes.Contains([]byte(logs.String()), []byte("authors.yaml: document 2 (HTTPRoute default/authors-get): spec.hostnames[0]"))
	}, defaultTestTimeout, 10*time.Millisecond, "the log names file, document and field: %s", logs.String())
	all := rec.all()
	assert.Equal(t, "authors-get", firstHTTPRoute(all[len(all)-1]).Meta.Name, "the last good manifests stay served")

	require.Error(t, controlplane.WatchManifestFiles(ctx, controlplane.NewStore(), dir+"/missing", 0, controlplane.WithLogger(quietLogger)))
}

func netipAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestPolicyStreamsEndOnShutdown(t *testing.T) {
	store := controlplane.NewStore()
	store.SetManifests(resources(t, authorsServiceYAML))
	h := holdListener(t)
	lis := h.generation()
	g := grpc.NewServer()
	dst := controlplane.NewServer(store, controlplane.WithLogger(quietLogger))
	dst.Register(g)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	defer func() { g.Stop(); <-done }()

	cc, err := grpc.NewClient(h.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	stream, err := outboundpb.NewOutboundPoliciesClient(cc).Watch(ctx, &outboundpb.TrafficSpec{SourceWorkload: "default:web-0", Target: &outboundpb.TrafficSpec_Authority{Authority: authorsAuthority}})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)
	require.NoError(t, dst.Shutdown(ctx))
	_, err = stream.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err))
}

func TestPolicyGRPCRouteThroughTheServer(t *testing.T) {
	store := controlplane.NewStore()
	store.SetManifests(resources(t, `
apiVersion: v1
kind: Service
metadata: {name: greeter, namespace: default}
spec: {ports: [{port: 9000}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: greeter-hello, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: greeter, port: 9000}]
  rules:
  - matches: [{method: {service: helloworld.Greeter, method: SayHello}}]
    backendRefs: [{name: greeter, port: 9000, weight: 1}, {name: missing, port: 9000, weight: 1}]
`))
	cp := servePolicies(t, holdListener(t), store)
	c := newTestClient(t, cp.addr)
	rec := newRecorder[policy.Update]()
	stop, err := c.Policies().Watch(context.Background(), "greeter.default.svc.cluster.local:9000", rec.update)
	require.NoError(t, err)
	defer stop()
	u := rec.waitFor(t, "the gRPC policy", func(u policy.Update) bool { return u.Policy != nil })
	require.Equal(t, policy.ProtocolGRPC, u.Policy.Protocol)
	route := u.Policy.GRPC.Routes[0]
	assert.Equal(t, "greeter-hello", route.Meta.Name)
	assert.Equal(t, policy.GRPCRouteMatch{Service: "helloworld.Greeter", Method: "SayHello"}, route.Rules[0].Matches[0])
	missing := route.Rules[0].Backends.Backends[1]
	require.NotNil(t, missing.Filters[0].GRPCFailureInjector)
	assert.Equal(t, codes.Internal, missing.Filters[0].GRPCFailureInjector.Code)
}

// TestPolicyWatchTargets checks that each kind of target is asked for as
// itself, an authority that reads like another kind's key included: a
// watch of an authority is keyed by the authority alone.
func TestPolicyWatchTargets(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { lis.Close() })
	c := newTestClient(t, lis.Addr().String())
	addr := netip.MustParseAddrPort("10.1.2.3:8080")
	for _, tc := range []struct {
		name string
		spec destination.TrafficSpec
		want *outboundpb.TrafficSpec
	}{
		{"authority", destination.TrafficSpec{Authority: "books.default.svc.cluster.local:80"},
			&outboundpb.TrafficSpec{Target: &outboundpb.TrafficSpec_Authority{Authority: "books.default.svc.cluster.local:80"}}},
		{"address", destination.TrafficSpec{Addr: addr},
			&outboundpb.TrafficSpec{Target: &outboundpb.TrafficSpec_Addr{Addr: destination.AddrToProto(addr)}}},
		{"authority like an address key", destination.TrafficSpec{Authority: "addr=10.1.2.3:8080"},
			&outboundpb.TrafficSpec{Target: &outboundpb.TrafficSpec_Authority{Authority: "addr=10.1.2.3:8080"}}},
		{"authority like an authority key", destination.TrafficSpec{Authority: "authority=books:80"},
			&outboundpb.TrafficSpec{Target: &outboundpb.TrafficSpec_Authority{Authority: "authority=books:80"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := destination.PolicyRequest(c, tc.spec)
			require.NoError(t, err)
			got.SourceWorkload = ""
			assert.True(t, proto.Equal(tc.want, got), "got %v, want %v", got, tc.want)
		})
	}
}

// TestPolicyDefaultsOfTwoNames checks that the default policies of two
// Services, which share what they have in common, each name their own
// Service: in their parent (the parent_* metric labels), in each
// backend, and in the authority each backend balances over.
func TestPolicyDefaultsOfTwoNames(t *testing.T) {
	const books, authors = "books.shop.svc.cluster.local:80", "authors.shop.svc.cluster.local:80"
	store := controlplane.NewStore()
	store.SetEndpoints(map[string][]endpoint.Endpoint{
		books:   {{Addr: netip.MustParseAddrPort("127.0.0.1:1")}},
		authors: {{Addr: netip.MustParseAddrPort("127.0.0.1:2")}},
	})
	cp := servePolicies(t, holdListener(t), store)
	c := newTestClient(t, cp.addr)
	got := map[string]*policy.Policy{}
	for _, name := range []string{books, authors} {
		rec := newRecorder[policy.Update]()
		stop, err := c.Policies().Watch(context.Background(), name, rec.update)
		require.NoError(t, err)
		defer stop()
		got[name] = rec.waitFor(t, "the default policy of "+name, routeNamedP("http")).Policy
	}
	for name, svc := range map[string]string{books: "books", authors: "authors"} {
		p := got[name]
		want := policy.Metadata{Group: "core", Kind: "Service", Namespace: "shop", Name: svc, Port: 80}
		assert.Equal(t, want, p.Parent, name)
		for _, route := range [][]policy.HTTPRoute{p.HTTP1.Routes, p.HTTP2.Routes} {
			require.Len(t, route, 1, name)
			require.Len(t, route[0].Rules, 1, name)
			rule := route[0].Rules[0]
			assert.Equal(t, []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/"}}}, rule.Matches, name)
			require.Len(t, rule.Backends.Backends, 1, name)
			b := rule.Backends.Backends[0].Backend
			assert.Equal(t, want, b.Meta, name)
			require.NotNil(t, b.Balancer, name)
			assert.Equal(t, name, b.Balancer.Authority)
		}
		require.Len(t, p.Opaque.Routes, 1, name)
		require.Len(t, p.Opaque.Routes[0].Backends.Backends, 1, name)
		assert.Equal(t, want, p.Opaque.Routes[0].Backends.Backends[0].Backend.Meta, name)
	}
	// What the two have in common, they share.
	assert.Same(t, &got[books].HTTP1.Routes[0].Rules[0].Matches[0], &got[authors].HTTP1.Routes[0].Rules[0].Matches[0])
}
