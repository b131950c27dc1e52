package meshgrpc_test

import (
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/linkerdtest"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
)

// serveIP serves c on loopback and returns a Destination client of it
// with Linkerd's streams that looks up the loopback network's addresses.
func serveIP(t *testing.T, c *linkerdtest.IPControlPlane) *destination.Client {
	t.Helper()
	return dialLoopback(t, c.Serve(t), destination.WithLinkerdStreams())
}

// dialLoopback returns a Destination client of the control plane at addr
// that looks up the addresses of the loopback network.
func dialLoopback(t *testing.T, addr string, opts ...destination.Option) *destination.Client {
	t.Helper()
	opts = append([]destination.Option{destination.WithLogger(quiet), destination.WithSearchNetworks(netip.MustParsePrefix("127.0.0.0/8"))}, opts...)
	dst, err := destination.Dial(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	return dst
}

// dialIP makes a fresh mesh channel to inmesh:///target with the identity
// local. Its calls wait for an endpoint as long as a call's deadline
// allows, so that a first connection's handshake, slow on a loaded
// machine, never fails them fast.
func dialIP(t *testing.T, dst *destination.Client, target netip.AddrPort, local *identity.Local, opts ...meshgrpc.Option) testgrpc.TestServiceClient {
	t.Helper()
	opts = append([]meshgrpc.Option{meshgrpc.WithIdentity(local), meshgrpc.WithLogger(quiet), meshgrpc.WithDiscoveryWait(testutil.Timeout),
		meshgrpc.WithBalancerOptions(balancer.WithQueue(0, testutil.Timeout))}, opts...)
	cc, err := grpc.NewClient("inmesh:///"+target.String(), meshgrpc.DialOptions(dst, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

// seen is what a peerApp told of a call: the identity it verified, whether
// the call came over TLS, and the x-added metadata it got.
func seen(t *testing.T, c testgrpc.TestServiceClient) (string, error) {
	t.Helper()
	var hdr metadata.MD
	resp, err := c.UnaryCall(callCtx(t), &testgrpc.SimpleRequest{}, grpc.Header(&hdr))
	if err != nil {
		return "", err
	}
	return "tls=" + resp.GetOauthScope() + " client=" + resp.GetUsername() + " x-added=" + firstMD(hdr, "x-added-seen"), nil
}

// clusterIP is a loopback address of its own on port, where nothing
// listens: as a Service's clusterIP without kube-proxy. The port is one
// the test holds on 127.0.0.1, so nothing can listen on it on every
// address.

// booksPolicies are the policies Linkerd's policy controller gives the
// Service books on port: for a Service without GRPCRoutes its HTTPRoutes
// (the HTTP/2 table gRPC calls are routed by), for one with GRPCRoutes
// those (policy-controller/grpc/src/outbound.rs to_proto: http1/http2 or
// grpc). Each route's rule sets x-added and balances over the Service's
// endpoints.
func booksPolicies(port uint16) map[string]*policy.Policy {
	svc := policy.Metadata{Group: "core", Kind: "Service", Namespace: "default", Name: "books", Port: port}
	backends := policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{Weight: 1, Backend: policy.Backend{
		Meta:     svc,
		Balancer: &policy.Balancer{Authority: "books.default.svc.cluster.local:" + strconv.Itoa(int(port)), DefaultRTT: 30 * time.Millisecond, Decay: 10 * time.Second},
		Queue:    policy.Queue{Capacity: 100, FailFastTimeout: 3 * time.Second},
	}}}}
	set := []policy.Filter{{RequestHeaders: &policy.HeaderModifier{Set: []policy.Header{{Name: "x-added", Value: "books-route"}}}}}
	http := []policy.HTTPRoute{{
		Meta:  policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "default", Name: "books-route"},
		Rules: []policy.HTTPRule{{Filters: set, Backends: backends}},
	}}
	grpcRoutes := []policy.GRPCRoute{{
		Meta:  policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Namespace: "default", Name: "books-route"},
		Rules: []policy.GRPCRule{{Filters: set, Backends: backends}},
	}}
	return map[string]*policy.Policy{
		"HTTPRoutes": {Parent: svc, Protocol: policy.ProtocolDetect, HTTP1: policy.HTTPProtocol{Routes: http}, HTTP2: policy.HTTPProtocol{Routes: http}},
		"GRPCRoutes": {Parent: svc, Protocol: policy.ProtocolGRPC, GRPC: policy.GRPCProtocol{Routes: grpcRoutes}},
	}
}

// The first call on a fresh channel to a Service's clusterIP follows the
// Service's outbound policy, as Linkerd's proxy does for its original
// destination (linkerd/app/outbound/src/policy/api.rs: the address asked
// for as TrafficSpec.addr; the policy controller's lookup_ip): the route's
// filter applies and the call is balanced over the Service's endpoints,
// over mTLS with their identity, and recorded in the route's family
// (outbound_http_route_* for an HTTPRoute, as Linkerd's proxy records an
// HTTP route's requests, gRPC ones included). Nothing listens at the
// clusterIP.
func TestCallToAClusterIP(t *testing.T) {
	e := newEnv(t)
	backend := netip.MustParseAddrPort(e.addr)
	vip := testutil.ClusterIP(backend.Port())
	series := map[string][]string{
		"HTTPRoutes": {"outbound_http_route_request_statuses_total", `http_status="200"`},
		"GRPCRoutes": {"outbound_grpc_route_request_statuses_total", `grpc_status="OK"`},
	}
	for name, pol := range booksPolicies(vip.Port()) {
		t.Run(name, func(t *testing.T) {
			m := testutil.NewMetrics(t)
			cp := &linkerdtest.IPControlPlane{
				VIP: vip, Name: "books.default.svc.cluster.local:" + strconv.Itoa(int(vip.Port())),
				Policy:    destination.PolicyToProto(pol),
				Endpoints: []endpoint.Endpoint{{Addr: backend, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true}},
			}
			got, err := seen(t, dialIP(t, serveIP(t, cp), vip, e.pki.certify(t, webID), meshgrpc.WithMeterProvider(m.Provider)))
			require.NoError(t, err, "balanced over the Service's endpoints, not sent to the clusterIP")
			assert.Equal(t, "tls=true client="+webID+" x-added=books-route", got)
			fam := series[name]
			assert.Equal(t, "1", m.Value(t, fam[0], `route_name="books-route"`, `parent_name="books"`, fam[1]), "%v", m.Lines(t, "outbound_"))
		})
	}
}

// The first call on a fresh channel to a Service's clusterIP whose
// Service has a ServiceProfile with routes is routed by the profile, which
// overrides the policy, and goes where Linkerd's proxy sends it: to the
// profile's logical address, its fully_qualified_name with the target's
// port (linkerd/app/outbound/src/sidecar.rs, HttpSidecar;
// http/logical/profile.rs), balanced over that name's endpoints over mTLS,
// with the route's labels (route_* series, dst the logical address).
func TestCallToAClusterIPWithAServiceProfile(t *testing.T) {
	e := newEnv(t)
	backend := netip.MustParseAddrPort(e.addr)
	vip := testutil.ClusterIP(backend.Port())
	name := "books.default.svc.cluster.local:" + strconv.Itoa(int(vip.Port()))
	cp := &linkerdtest.IPControlPlane{
		VIP: vip, Name: name,
		Policy:    destination.PolicyToProto(booksPolicies(vip.Port())["GRPCRoutes"]),
		Endpoints: []endpoint.Endpoint{{Addr: backend, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true}},
		Profile: &profiles.Profile{
			Routes: []profiles.Route{{
				Condition: profiles.MatchAll{profiles.PathRegex(`/grpc\.testing\.TestService/UnaryCall`)},
				Labels:    map[string]string{"route": "UnaryCall"},
				Timeout:   testutil.Timeout,
			}},
			RetryBudget: &profiles.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, TTL: 10 * time.Second},
		},
	}
	m := testutil.NewMetrics(t)
	cc, err := grpc.NewClient("inmesh:///"+vip.String(), meshgrpc.DialOptions(serveIP(t, cp), meshgrpc.WithIdentity(e.pki.certify(t, webID)),
		meshgrpc.WithLogger(quiet), meshgrpc.WithDiscoveryWait(testutil.Timeout), meshgrpc.WithMeterProvider(m.Provider),
		meshgrpc.WithBalancerOptions(balancer.WithQueue(0, testutil.Timeout)))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })

	got, err := seen(t, testgrpc.NewTestServiceClient(cc))
	require.NoError(t, err, "balanced over the Service's endpoints, not sent to the clusterIP")
	assert.Equal(t, "tls=true client="+webID+" x-added=", got, "the profile's route, not the policy's GRPCRoute")
	assert.Equal(t, "1", m.Value(t, "route_response_total", `direction="outbound"`, `rt_route="UnaryCall"`, `dst="`+name+`"`),
		"%v", m.Lines(t, "route_response_total"))
}

// The first call on a fresh channel to a meshed pod's address reaches it
// as Linkerd's proxy reaches it (linkerd/app/outbound/src/discover.rs: the
// policy controller's NotFound -> a forward policy to the GetProfile
// answer's endpoint, with its metadata): over mTLS with the identity the
// control plane gives the pod, never in plaintext; an identity the pod's
// certificate does not carry fails the call.
func TestCallToAPodIP(t *testing.T) {
	e := newEnv(t)
	pod := netip.MustParseAddrPort(e.addr)
	for _, tc := range []struct {
		name      string
		profileID string // the identity the control plane gives the pod
		want      string // what the pod saw; "" for a failed call
	}{
		{"the pod's identity: mTLS", booksID, "tls=true client=" + webID + " x-added="},
		{"an identity the pod's certificate lacks: refused", reviewsID, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := &linkerdtest.IPControlPlane{VIP: testutil.ClusterIP(pod.Port()), Pods: map[netip.AddrPort]endpoint.Endpoint{
				pod: {Addr: pod, Weight: endpoint.DefaultWeight, Identity: tc.profileID, H2: true,
					Labels: map[string]string{"namespace": "default", "pod": "books-0", "serviceaccount": "books"}},
			}}
			var opts []meshgrpc.Option
			if tc.want == "" {
				// The call fails fast, before its deadline, and names the
				// handshake's failure, which comes well within half of it.
				opts = append(opts, meshgrpc.WithBalancerOptions(balancer.WithQueue(0, testutil.Timeout/2)))
			}
			got, err := seen(t, dialIP(t, serveIP(t, cp), pod, e.pki.certify(t, webID), opts...))
			if tc.want == "" {
				require.Error(t, err)
				assert.Contains(t, status.Convert(err).Message(), tc.profileID, "the handshake failed for the identity")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// The first call to a pod's address on a fresh channel waits for the
// pod's profile, within the discovery wait, when the policy controller has
// already said it has no policy: it never goes out in plaintext before
// the pod's identity is known.
func TestFirstCallToAPodIPWaitsForItsIdentity(t *testing.T) {
	e := newEnv(t)
	pod := netip.MustParseAddrPort(e.addr)
	cp := &linkerdtest.IPControlPlane{VIP: testutil.ClusterIP(pod.Port()), Gate: make(chan struct{}), Pods: map[netip.AddrPort]endpoint.Endpoint{
		pod: {Addr: pod, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true},
	}}
	c := dialIP(t, serveIP(t, cp), pod, e.pki.certify(t, webID))
	type result struct {
		seen string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		s, err := seen(t, c)
		done <- result{s, err}
	}()
	select {
	case path := <-cp.Asked:
		assert.Equal(t, pod.String(), path, "the pod's profile is asked for")
	case <-time.After(testutil.Timeout):
		t.Fatal("the pod's profile was never asked for")
	}
	select {
	case r := <-done:
		t.Fatalf("the call ended before the pod's profile answered: %+v", r)
	case <-time.After(testutil.ShortTimeout):
	}
	close(cp.Gate)
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, "tls=true client="+webID+" x-added=", r.seen)
}

// Against the embedded control plane: the first call to a Service's
// clusterIP (its manifest's spec.clusterIP) follows the Service's route to
// its endpoints over mTLS, with an HTTPRoute (the HTTP/2 table) as with a
// GRPCRoute, and the first call to one of those endpoints' address
// reaches it over mTLS with the identity registered for it.
func TestIPAddressesAgainstTheEmbeddedControlPlane(t *testing.T) {
	e := newEnv(t)
	backend := netip.MustParseAddrPort(e.addr)
	vip := testutil.ClusterIP(backend.Port())
	port := strconv.Itoa(int(vip.Port()))
	service := testutil.ClusterIPService("default", "books", vip)
	filter := `
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: x-added, value: books-route}]
    backendRefs: [{name: books, port: ` + port + `}]
`
	route := func(kind string) string {
		return `
---
apiVersion: gateway.networking.k8s.io/v1
kind: ` + kind + `
metadata: {name: books-route, namespace: default}
spec:
  parentRefs: [{group: core, kind: Service, name: books, port: ` + port + `}]
  rules:
  - matches: []` + filter
	}
	for _, tc := range []struct {
		name, manifests string
		target          netip.AddrPort
		want            string
	}{
		{"a Service's clusterIP, HTTPRoute", service + route("HTTPRoute"), vip, "tls=true client=" + webID + " x-added=books-route"},
		{"a Service's clusterIP, GRPCRoute", service + route("GRPCRoute"), vip, "tls=true client=" + webID + " x-added=books-route"},
		{"a Service's clusterIP, no route", service, vip, "tls=true client=" + webID + " x-added="},
		{"an endpoint's address", service + route("HTTPRoute"), backend, "tls=true client=" + webID + " x-added="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := controlplane.NewStore()
			manifests(t, store, tc.manifests)
			store.PutEndpoints("books.default.svc.cluster.local:"+port, []endpoint.Endpoint{{Addr: backend, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true}})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			g := grpc.NewServer()
			controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
			done := make(chan struct{})
			go func() { defer close(done); _ = g.Serve(lis) }()
			t.Cleanup(func() { g.Stop(); <-done })

			got, err := seen(t, dialIP(t, dialLoopback(t, lis.Addr().String()), tc.target, e.pki.certify(t, webID)))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// An HTTPRoute's failure injector fails a gRPC call it routes with the
// code of its HTTP status, as the HTTP router answers a gRPC request
// (and grpc-go reads an HTTP status): Linkerd's proxy routes gRPC by the
// HTTPRoutes of a Service without GRPCRoutes.
func TestHTTPRouteFailureInjectorFailsACall(t *testing.T) {
	e := newEnv(t)
	backend := netip.MustParseAddrPort(e.addr)
	vip := testutil.ClusterIP(backend.Port())
	for _, tc := range []struct {
		status int
		want   codes.Code
	}{
		{503, codes.Unavailable},
		{504, codes.DeadlineExceeded},
		{403, codes.PermissionDenied},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			pol := booksPolicies(vip.Port())["HTTPRoutes"]
			pol.HTTP2.Routes[0].Rules[0].Filters = []policy.Filter{{FailureInjector: &policy.FailureInjector{Status: tc.status, Message: "injected"}}}
			cp := &linkerdtest.IPControlPlane{
				VIP: vip, Name: "books.default.svc.cluster.local:" + strconv.Itoa(int(vip.Port())),
				Policy:    destination.PolicyToProto(pol),
				Endpoints: []endpoint.Endpoint{{Addr: backend, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true}},
			}
			_, err := seen(t, dialIP(t, serveIP(t, cp), vip, e.pki.certify(t, webID)))
			assert.Equal(t, tc.want, status.Code(err), "%v", err)
			assert.Equal(t, "injected", status.Convert(err).Message())
		})
	}
}

// The first call on a fresh channel to an address for which the control
// plane has no policy (OutboundPolicies NotFound) and whose profile names
// no endpoint (GetProfile without one, or NotFound) goes to the address
// itself, in plaintext since no identity is known, as the HTTP stack's
// request does and as Linkerd's proxy forwards to its original destination
// (linkerd/app/outbound/src/discover.rs: a forward policy to the profile's
// endpoint or, without one, to the address). Against the embedded control
// plane, which answers an address it knows nothing of with the endpoint
// profile of the address alone, as Linkerd's controller does, the call
// goes there too. So does one to an address outside the client's search
// networks, which it never looks up (Linkerd's policy controller forwards
// an address outside the cluster, "egress-fallback"); such a channel
// failed every call.
func TestCallToAnAddressWithoutPolicyOrEndpoint(t *testing.T) {
	e := newEnv(t)
	addr := netip.MustParseAddrPort(e.addr)
	for _, tc := range []struct {
		name string
		dst  func(t *testing.T) *destination.Client
	}{
		{"a profile without endpoint", func(t *testing.T) *destination.Client {
			return serveIP(t, &linkerdtest.IPControlPlane{VIP: testutil.ClusterIP(addr.Port()), Unknown: linkerdtest.ProfileWithoutEndpoint})
		}},
		{"no profile", func(t *testing.T) *destination.Client {
			return serveIP(t, &linkerdtest.IPControlPlane{VIP: testutil.ClusterIP(addr.Port()), Unknown: linkerdtest.ProfileNotFound})
		}},
		{"outside the search networks", func(t *testing.T) *destination.Client {
			cp := &linkerdtest.IPControlPlane{VIP: testutil.ClusterIP(addr.Port())}
			return dialLoopback(t, cp.Serve(t), destination.WithLinkerdStreams(), destination.WithSearchNetworks())
		}},
		{"the embedded control plane", func(t *testing.T) *destination.Client {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			g := grpc.NewServer()
			controlplane.NewServer(controlplane.NewStore(), controlplane.WithLogger(quiet)).Register(g)
			done := make(chan struct{})
			go func() { defer close(done); _ = g.Serve(lis) }()
			t.Cleanup(func() { g.Stop(); <-done })
			return dialLoopback(t, lis.Addr().String())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := seen(t, dialIP(t, tc.dst(t), addr, e.pki.certify(t, webID)))
			require.NoError(t, err, "sent to the address itself")
			assert.Equal(t, "tls=false client= x-added=", got, "in plaintext: no identity is known")
		})
	}
}

// A channel to an IP address never asks the Destination API's Get for the
// address's endpoints, which Linkerd's controller refuses ("IP queries not
// supported by Get API") and Linkerd's proxy never asks: the address's
// policy answers for it (linkerd/app/outbound/src/discover.rs), a
// Service's by its name's endpoints, a pod's or an unknown address's by a
// forward to it. Each row's first call succeeds with only the Service's
// name asked of Get.
func TestCallToAnIPAddressAsksGetForNoAddress(t *testing.T) {
	e := newEnv(t)
	backend := netip.MustParseAddrPort(e.addr)
	vip := testutil.ClusterIP(backend.Port())
	name := "books.default.svc.cluster.local:" + strconv.Itoa(int(vip.Port()))
	for _, tc := range []struct {
		name     string
		cp       *linkerdtest.IPControlPlane
		target   netip.AddrPort
		want     string
		wantGets []string
	}{
		{"a Service's clusterIP", &linkerdtest.IPControlPlane{
			VIP: vip, Name: name,
			Policy:    destination.PolicyToProto(booksPolicies(vip.Port())["GRPCRoutes"]),
			Endpoints: []endpoint.Endpoint{{Addr: backend, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true}},
		}, vip, "tls=true client=" + webID + " x-added=books-route", []string{name}},
		{"a pod's address", &linkerdtest.IPControlPlane{VIP: vip, Pods: map[netip.AddrPort]endpoint.Endpoint{
			backend: {Addr: backend, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true},
		}}, backend, "tls=true client=" + webID + " x-added=", nil},
		{"an address without policy or endpoint", &linkerdtest.IPControlPlane{VIP: vip, Unknown: linkerdtest.ProfileWithoutEndpoint},
			backend, "tls=false client= x-added=", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := seen(t, dialIP(t, serveIP(t, tc.cp), tc.target, e.pki.certify(t, webID)))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.wantGets, tc.cp.Gets(), "the paths asked of Get")
		})
	}
}

// A call to a Service's clusterIP on a port that the Service does not
// declare fails as Linkerd refuses it: the embedded control plane answers
// Linkerd's policy controller's opaque policy whose one route forbids the
// connection (policy-controller/grpc/src/outbound.rs undefined_port), and
// the call fails Unavailable, never sent, as a gRPC client sees the
// connection that Linkerd's proxy closes ("forbidden TCP route",
// linkerd/app/outbound/src/opaq/logical/route/filters.rs). A server
// listens on that very address and sees no connection; the refusal is
// counted in outbound_tcp_route_open_total and
// outbound_tcp_route_close_total{error="forbidden"}. The port the
// Service declares still reaches its endpoint. Each call is the first of
// a fresh channel.
func TestCallToAnUndeclaredPortOfAClusterIP(t *testing.T) {
	e := newEnv(t)
	backend := netip.MustParseAddrPort(e.addr)
	vip := testutil.ClusterIP(backend.Port())
	port := strconv.Itoa(int(vip.Port()))
	res, err := manifest.Parse([]byte(testutil.ClusterIPService("default", "books", vip)))
	require.NoError(t, err)
	store := controlplane.NewStore()
	store.SetManifests(res)
	store.PutEndpoints("books.default.svc.cluster.local:"+port, []endpoint.Endpoint{{Addr: backend, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })

	// A server on the clusterIP itself, on a port that the Service does
	// not declare: were the call sent to the address, it would connect.
	other, err := net.Listen("tcp", vip.Addr().String()+":0")
	require.NoError(t, err)
	accepted := make(chan struct{}, 1)
	go func() {
		for {
			c, err := other.Accept()
			if err != nil {
				return
			}
			select {
			case accepted <- struct{}{}:
			default:
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = other.Close() })
	undeclared := netip.MustParseAddrPort(other.Addr().String())

	for _, tc := range []struct {
		name string
		opts []destination.Option
	}{
		{"the Watches API", nil},
		{"Linkerd's streams", []destination.Option{destination.WithLinkerdStreams()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testutil.NewMetrics(t)
			_, err := seen(t, dialIP(t, dialLoopback(t, lis.Addr().String(), tc.opts...), undeclared, e.pki.certify(t, webID),
				meshgrpc.WithMeterProvider(m.Provider)))
			require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			assert.Equal(t, "forbidden TCP route", status.Convert(err).Message())
			// Counted as the connection Linkerd's proxy opens on the
			// forbidden route and closes (linkerd/app/outbound/src/
			// metrics/transport.rs).
			labels := `parent_group="core",parent_kind="Service",parent_name="books",parent_namespace="default",parent_port="` +
				strconv.Itoa(int(undeclared.Port())) + `",parent_section_name="",` +
				`route_group="",route_kind="default",route_name="undefined-port",route_namespace="",` +
				`target_ip="` + undeclared.Addr().String() + `",target_port="` + strconv.Itoa(int(undeclared.Port())) + `"`
			assert.Equal(t, []string{"outbound_tcp_route_open_total{" + labels + "} 1"}, m.Lines(t, "outbound_tcp_route_open_total"))
			assert.Equal(t, []string{`outbound_tcp_route_close_total{error="forbidden",` + labels + "} 1"}, m.Lines(t, "outbound_tcp_route_close_total"))

			got, err := seen(t, dialIP(t, dialLoopback(t, lis.Addr().String(), tc.opts...), vip, e.pki.certify(t, webID)))
			require.NoError(t, err, "the port the Service declares")
			assert.Equal(t, "tls=true client="+webID+" x-added=", got)
		})
	}
	select {
	case <-accepted:
		t.Error("a call reached the undeclared port")
	default:
	}
}
