package mesh

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/linkerdtest"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
)

// serveIP serves c on loopback and returns an outbound stack of it (see
// loopbackClient), with Linkerd's streams.
func serveIP(t *testing.T, c *linkerdtest.IPControlPlane, local *identity.Local, opts ...ClientOption) *Client {
	t.Helper()
	return loopbackClient(t, dialLoopback(t, c.Serve(t), destination.WithLinkerdStreams()), local, opts...)
}

// dialLoopback returns a destination client of the control plane at addr
// that looks up the addresses of the loopback network.
func dialLoopback(t *testing.T, addr string, opts ...destination.Option) *destination.Client {
	t.Helper()
	opts = append([]destination.Option{destination.WithLogger(quiet), destination.WithSearchNetworks(netip.MustParsePrefix("127.0.0.0/8"))}, opts...)
	dst, err := destination.Dial(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { dst.Close() })
	return dst
}

// loopbackClient returns an outbound stack over dst with local's identity
// (none when nil), waiting for discovery as a meshed application does.
func loopbackClient(t *testing.T, dst *destination.Client, local *identity.Local, opts ...ClientOption) *Client {
	t.Helper()
	opts = append([]ClientOption{WithDestination(dst), WithIdentity(local), WithDiscoveryWait(testutil.Timeout),
		WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet)}, opts...)
	client := NewClient(opts...)
	t.Cleanup(client.Close)
	return client
}

// reportingServer serves a server stack with id (none when empty) on
// loopback whose application sends what it saw of each request (mTLS, the
// client's identity, the x-route header) to seen.
func reportingServer(t *testing.T, p *pki, id string, seen chan<- string) netip.AddrPort {
	t.Helper()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer, _ := identity.PeerFromContext(r.Context())
		seen <- "tls=" + boolText(peer.TLS) + " client=" + r.Header.Get("L5d-Client-Id") + " x-route=" + r.Header.Get("X-Route")
	})
	opts := []ServerOption{WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet)}
	if id != "" {
		opts = append(opts, WithIdentity(p.certify(t, id)))
	}
	server := NewServer(app, opts...)
	t.Cleanup(server.Close)
	return serveMeshed(t, server)
}

// tryGet sends GET url through client and returns the response's status.
func tryGet(t *testing.T, client http.RoundTripper, url string) (int, error) {
	t.Helper()
	hc := &http.Client{Transport: client, Timeout: testutil.Timeout}
	resp, err := hc.Get(url)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// booksPolicy is the policy of the Service books on port: one HTTPRoute
// that sets x-route and balances over the Service's endpoints, named as
// Linkerd's controller names them.
func booksPolicy(port uint16) *policy.Policy {
	svc := policy.Metadata{Group: "core", Kind: "Service", Namespace: "default", Name: "books", Port: port}
	routes := []policy.HTTPRoute{{
		Meta: policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "default", Name: "books-route"},
		Rules: []policy.HTTPRule{{
			Filters: []policy.Filter{{RequestHeaders: &policy.HeaderModifier{Set: []policy.Header{{Name: "x-route", Value: "books-route"}}}}},
			Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{Weight: 1, Backend: policy.Backend{
				Meta:     svc,
				Balancer: &policy.Balancer{Authority: "books.default.svc.cluster.local:" + strconv.Itoa(int(port)), DefaultRTT: 30 * time.Millisecond, Decay: 10 * time.Second},
				Queue:    policy.Queue{Capacity: 100, FailFastTimeout: 3 * time.Second},
			}}}},
		}},
	}}
	return &policy.Policy{Parent: svc, Protocol: policy.ProtocolDetect, HTTP1: policy.HTTPProtocol{Routes: routes}, HTTP2: policy.HTTPProtocol{Routes: routes}}
}

// clusterIP is a loopback address of its own on port, where nothing
// listens: as a Service's clusterIP without kube-proxy. The port is one the
// test holds on 127.0.0.1, so nothing can listen on it on every address.

// A request to a Service's clusterIP follows the Service's outbound policy,
// as Linkerd's proxy does for its original destination
// (linkerd/app/outbound/src/policy/api.rs: the address asked for as
// TrafficSpec.addr; the policy controller's lookup_ip): the HTTPRoute's
// filter applies and the request is balanced over the Service's endpoints
// that the backend names, over mTLS when they carry identities. Each row
// is the first request of a fresh client.
func TestRequestToAClusterIP(t *testing.T) {
	p := newPKI(t)
	for _, tc := range []struct {
		name     string
		serverID string // the endpoint's certificate, and its identity in discovery
		want     string
	}{
		{"endpoints with identities: mTLS", booksID, "tls=true client=" + webID + " x-route=books-route"},
		{"endpoints without identities: plaintext", "", "tls=false client= x-route=books-route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan string, 4)
			backend := reportingServer(t, p, tc.serverID, seen)
			vip := testutil.ClusterIP(backend.Port())
			cp := &linkerdtest.IPControlPlane{
				VIP: vip, Name: "books.default.svc.cluster.local:" + strconv.Itoa(int(vip.Port())),
				Policy:    destination.PolicyToProto(booksPolicy(vip.Port())),
				Endpoints: []endpoint.Endpoint{{Addr: backend, Weight: endpoint.DefaultWeight, Identity: tc.serverID, H2: tc.serverID != ""}},
			}
			client := serveIP(t, cp, p.certify(t, webID))

			code, err := tryGet(t, client, "http://"+vip.String()+"/")
			require.NoError(t, err, "balanced over the Service's endpoints, not sent to the clusterIP")
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, tc.want, receive(t, seen))
		})
	}
}

// A request to a Service's clusterIP whose Service has a ServiceProfile
// with routes is routed by the profile, which overrides the policy, and
// goes where Linkerd's proxy sends it: to the profile's logical address,
// its fully_qualified_name with the request's port
// (linkerd/app/outbound/src/sidecar.rs, HttpSidecar: should_override_policy
// gives the profile's addr; service-profiles/src/proto.rs convert_profile;
// http/logical/profile.rs: a profile without dstOverrides balances over
// that name), whose endpoints Get gives by name. It is balanced over the
// Service's endpoints, over mTLS, with the route's timeout and labels (the
// route_* series, dst the logical address), never sent to the clusterIP,
// which Get refuses. The first request of a fresh client.
func TestRequestToAClusterIPWithAServiceProfile(t *testing.T) {
	p := newPKI(t)
	seen := make(chan string, 4)
	backend := reportingServer(t, p, booksID, seen)
	vip := testutil.ClusterIP(backend.Port())
	name := "books.default.svc.cluster.local:" + strconv.Itoa(int(vip.Port()))
	cp := &linkerdtest.IPControlPlane{
		VIP: vip, Name: name,
		Policy:    destination.PolicyToProto(booksPolicy(vip.Port())),
		Endpoints: []endpoint.Endpoint{{Addr: backend, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true}},
		Profile: &profiles.Profile{
			Routes: []profiles.Route{{
				Condition: profiles.MatchAll{profiles.Method("GET"), profiles.PathRegex("/books/.*")},
				Labels:    map[string]string{"route": "GET /books/{id}"},
				Timeout:   testutil.Timeout,
			}},
			RetryBudget: &profiles.RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, TTL: 10 * time.Second},
		},
	}
	m := testutil.NewMetrics(t)
	client := serveIP(t, cp, p.certify(t, webID), WithMeterProvider(m.Provider))

	code, err := tryGet(t, client, "http://"+vip.String()+"/books/7")
	require.NoError(t, err, "balanced over the Service's endpoints, not sent to the clusterIP")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "tls=true client="+webID+" x-route=", receive(t, seen), "the profile's route, not the policy's HTTPRoute")
	assert.Equal(t, "1", m.Value(t, "route_response_total", `direction="outbound"`, `rt_route="GET /books/{id}"`, `dst="`+name+`"`),
		"%v", m.Lines(t, "route_response_total"))
}

// A request to a meshed pod's address reaches it as Linkerd's proxy
// reaches it (linkerd/app/outbound/src/discover.rs: the policy
// controller's NotFound -> a forward policy to the GetProfile answer's
// endpoint, with its metadata): over mTLS with the identity the control
// plane gives the pod, labelled with its labels, never in plaintext; an
// identity the pod's certificate does not carry fails the request. Each
// row is the first request of a fresh client.
func TestRequestToAPodIP(t *testing.T) {
	p := newPKI(t)
	for _, tc := range []struct {
		name      string
		profileID string // the identity the control plane gives the pod
		want      string // what the pod saw; "" for nothing
	}{
		{"the pod's identity: mTLS", booksID, "tls=true client=" + webID + " x-route="},
		{"an identity the pod's certificate lacks: refused", reviewsID, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan string, 4)
			pod := reportingServer(t, p, booksID, seen)
			labels := map[string]string{"namespace": "default", "pod": "books-0", "serviceaccount": "books"}
			cp := &linkerdtest.IPControlPlane{VIP: testutil.ClusterIP(pod.Port()), Pods: map[netip.AddrPort]endpoint.Endpoint{
				pod: {Addr: pod, Weight: endpoint.DefaultWeight, Identity: tc.profileID, H2: true, Labels: labels},
			}}
			m := testutil.NewMetrics(t)
			client := serveIP(t, cp, p.certify(t, webID), WithMeterProvider(m.Provider))

			_, err := tryGet(t, client, "http://"+pod.String()+"/")
			if tc.want == "" {
				var idErr *identity.IdentityError
				require.True(t, errors.As(err, &idErr), "%v", err)
				assert.Equal(t, tc.profileID, idErr.Expected)
				assert.Empty(t, seen, "nothing reached the pod")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, receive(t, seen))
			assert.Equal(t, "1", m.Value(t, "response_total", `direction="outbound"`, `dst_pod="books-0"`,
				`dst_serviceaccount="books"`, `tls="true"`, `server_id="`+booksID+`"`), "the pod's labels and identity: %v", m.Lines(t, "response_total"))
		})
	}
}

// The first request to a pod's address on a fresh client waits for the
// pod's profile, within the discovery wait, when the policy controller has
// already said it has no policy: it never goes out in plaintext before the
// pod's identity is known.
func TestFirstRequestToAPodIPWaitsForItsIdentity(t *testing.T) {
	p := newPKI(t)
	seen := make(chan string, 4)
	pod := reportingServer(t, p, booksID, seen)
	cp := &linkerdtest.IPControlPlane{VIP: testutil.ClusterIP(pod.Port()), Gate: make(chan struct{}), Pods: map[netip.AddrPort]endpoint.Endpoint{
		pod: {Addr: pod, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true},
	}}
	client := serveIP(t, cp, p.certify(t, webID))

	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, err := tryGet(t, client, "http://"+pod.String()+"/")
		done <- result{code, err}
	}()
	assert.Equal(t, pod.String(), receive(t, cp.Asked), "the pod's profile is asked for")
	select {
	case s := <-seen:
		t.Fatalf("the request went out before the pod's profile answered: %s", s)
	case r := <-done:
		t.Fatalf("the request ended before the pod's profile answered: %+v", r)
	case <-time.After(testutil.ShortTimeout):
	}
	close(cp.Gate)
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusOK, r.code)
	assert.Equal(t, "tls=true client="+webID+" x-route=", receive(t, seen))
}

// Against the embedded control plane: a request to a Service's clusterIP
// (its manifest's spec.clusterIP) follows the Service's HTTPRoute to its
// endpoints over mTLS, and a request to one of those endpoints' address
// reaches it over mTLS with the identity registered for it.
func TestIPAddressesAgainstTheEmbeddedControlPlane(t *testing.T) {
	p := newPKI(t)
	seen := make(chan string, 4)
	backend := reportingServer(t, p, booksID, seen)
	vip := testutil.ClusterIP(backend.Port())
	port := strconv.Itoa(int(vip.Port()))
	res, err := manifest.Parse([]byte(testutil.ClusterIPService("default", "books", vip) + `---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: books-route, namespace: default}
spec:
  parentRefs: [{group: core, kind: Service, name: books, port: ` + port + `}]
  rules:
  - filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: x-route, value: books-route}]
    backendRefs: [{name: books, port: ` + port + `}]
`))
	require.NoError(t, err)
	store := controlplane.NewStore()
	store.SetManifests(res)
	store.PutEndpoints("books.default.svc.cluster.local:"+port, []endpoint.Endpoint{{Addr: backend, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)

	for _, tc := range []struct {
		name, url, want string
	}{
		{"a Service's clusterIP", "http://" + vip.String() + "/", "tls=true client=" + webID + " x-route=books-route"},
		{"an endpoint's address", "http://" + backend.String() + "/", "tls=true client=" + webID + " x-route="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The Watches API of the embedded control plane.
			client := loopbackClient(t, dialLoopback(t, lis.Addr().String()), p.certify(t, webID))
			code, err := tryGet(t, client, tc.url)
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, tc.want, receive(t, seen))
		})
	}
}

// A request to an address for which the control plane has no policy
// (OutboundPolicies NotFound) and whose profile names no endpoint
// (GetProfile without one, or NotFound) goes to the address itself, in
// plaintext since no identity is known, as Linkerd's proxy forwards to its
// original destination (linkerd/app/outbound/src/discover.rs: a forward
// policy to the profile's endpoint or, without one, to the address),
// without asking Get for the address. The embedded control plane answers
// an address outside the cluster (loopback, which no workload of its
// manifests uses) as Linkerd's policy controller does, with the policy
// that forwards to the address ("egress-fallback"), over both of its
// APIs: the request goes there too. Each row is the first request of a
// fresh client.
func TestRequestToAnAddressWithoutPolicyOrEndpoint(t *testing.T) {
	p := newPKI(t)
	fake := func(unknown linkerdtest.UnknownAnswer) func(t *testing.T, addr netip.AddrPort) (*Client, func() []string) {
		return func(t *testing.T, addr netip.AddrPort) (*Client, func() []string) {
			cp := &linkerdtest.IPControlPlane{VIP: testutil.ClusterIP(addr.Port()), Unknown: unknown}
			return serveIP(t, cp, p.certify(t, webID)), cp.Gets
		}
	}
	embedded := func(opts ...destination.Option) func(t *testing.T, addr netip.AddrPort) (*Client, func() []string) {
		return func(t *testing.T, addr netip.AddrPort) (*Client, func() []string) {
			cp := serveEmbedded(t, controlplane.NewStore())
			return loopbackClient(t, dialLoopback(t, cp, opts...), p.certify(t, webID)), nil
		}
	}
	for _, tc := range []struct {
		name   string
		client func(t *testing.T, addr netip.AddrPort) (*Client, func() []string)
	}{
		{"a profile without endpoint", fake(linkerdtest.ProfileWithoutEndpoint)},
		{"no profile", fake(linkerdtest.ProfileNotFound)},
		{"the embedded control plane", embedded()},
		{"the embedded control plane's Linkerd streams", embedded(destination.WithLinkerdStreams())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan string, 4)
			addr := reportingServer(t, p, "", seen)
			client, gets := tc.client(t, addr)

			code, err := tryGet(t, client, "http://"+addr.String()+"/")
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, "tls=false client= x-route=", receive(t, seen))
			if gets != nil {
				assert.Empty(t, gets(), "the paths asked of Get")
			}
		})
	}
}

// serveEmbedded serves the embedded control plane of store on loopback and
// returns its address.
func serveEmbedded(t *testing.T, store *controlplane.Store) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return lis.Addr().String()
}

// A request to a Service's clusterIP on a port that the Service does not
// declare is refused as Linkerd refuses it: the embedded control plane
// answers Linkerd's policy controller's opaque policy whose one route
// forbids the connection (policy-controller/grpc/src/outbound.rs
// undefined_port), and the outbound stack fails the request without a
// response and without sending it anywhere, as Linkerd's proxy closes the
// connection ("forbidden TCP route",
// linkerd/app/outbound/src/opaq/logical/route/filters.rs). A server listens
// on that very address and sees no connection. The port the Service
// declares still reaches its endpoint. Each request is the first of a
// fresh client.
func TestRequestToAnUndeclaredPortOfAClusterIP(t *testing.T) {
	p := newPKI(t)
	seen := make(chan string, 4)
	backend := reportingServer(t, p, booksID, seen)
	vip := testutil.ClusterIP(backend.Port())
	port := strconv.Itoa(int(vip.Port()))
	res, err := manifest.Parse([]byte(testutil.ClusterIPService("default", "books", vip)))
	require.NoError(t, err)
	store := controlplane.NewStore()
	store.SetManifests(res)
	store.PutEndpoints("books.default.svc.cluster.local:"+port, []endpoint.Endpoint{{Addr: backend, Weight: endpoint.DefaultWeight, Identity: booksID, H2: true}})
	cp := serveEmbedded(t, store)

	// A server on the clusterIP itself, on a port that the Service does
	// not declare: were the request sent to the address, it would answer.
	lis, err := net.Listen("tcp", vip.Addr().String()+":0")
	require.NoError(t, err)
	accepted := make(chan struct{}, 1)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			select {
			case accepted <- struct{}{}:
			default:
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { lis.Close() })
	undeclared := lis.Addr().String()

	for _, tc := range []struct {
		name string
		opts []destination.Option
	}{
		{"the Watches API", nil},
		{"Linkerd's streams", []destination.Option{destination.WithLinkerdStreams()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := loopbackClient(t, dialLoopback(t, cp, tc.opts...), p.certify(t, webID))
			code, err := tryGet(t, client, "http://"+undeclared+"/")
			require.ErrorIs(t, err, router.ErrForbiddenRoute, "status %d", code)
			assert.Contains(t, err.Error(), "forbidden TCP route")

			client = loopbackClient(t, dialLoopback(t, cp, tc.opts...), p.certify(t, webID))
			code, err = tryGet(t, client, "http://"+vip.String()+"/")
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, code, "the port the Service declares")
			assert.Equal(t, "tls=true client="+webID+" x-route=", receive(t, seen))
		})
	}
	select {
	case <-accepted:
		t.Error("the request reached the undeclared port")
	default:
	}
}
