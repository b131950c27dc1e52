package main

// This file is where the scenarios meet inmesh's API: the stacks, the
// embedded control plane and the profiles. Everything else measures
// net/http values.

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/controlplane"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
)

// books is the service the mesh scenarios address by name. Requests for
// it only ever go to endpoints the embedded control plane names (IP
// literals on loopback); nothing resolves the name through DNS.
const books = "books.default.svc.cluster.local:7000"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newMeter is an OpenTelemetry SDK meter provider with a manual reader,
// shared by every stack of a scenario, so that inmesh and otelhttp pay
// the same SDK.
func newMeter() *sdkmetric.MeterProvider {
	// As the examples configure it (examples/internal/telemetry): no
	// exemplars, which would keep a reservoir per series and cost every
	// measurement; the SDK's default cardinality limit.
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()),
		sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
}

// profileYAML is a ServiceProfile of 20 routes for name; GET /books/{id}
// is the last of them, so that a request walks the whole table. tag
// changes one route's name, so that two tags are two different profiles.
func profileYAML(name, tag string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata:\n  name: %s\nspec:\n  routes:\n", name)
	for i := range 19 {
		fmt.Fprintf(&b, "  - name: POST /other/r%d/{id} %s\n    condition: {method: POST, pathRegex: '/other/r%d/[^/]+'}\n", i, tag, i)
	}
	b.WriteString("  - name: GET /books/{id}\n    condition: {method: GET, pathRegex: '/books/[^/]+'}\n" +
		"    responseClasses:\n    - condition: {status: {min: 500, max: 599}}\n      isFailure: true\n")
	b.WriteString("  - name: GET /flaky\n    condition: {method: GET, pathRegex: /flaky}\n    isRetryable: true\n")
	b.WriteString("  retryBudget: {retryRatio: 0.2, minRetriesPerSecond: 10, ttl: 10s}\n")
	return b.String()
}

func serviceProfile(name, tag string) *profiles.ServiceProfile {
	sps, err := profiles.ParseServiceProfiles([]byte(profileYAML(name, tag)))
	if err != nil {
		panic(err)
	}
	return sps[0]
}

// staticProfiles is a source of profiles set by hand; the function it
// returns gives authority (host:port) the 20-route profile.
func staticProfiles() (profiles.Source, func(authority string)) {
	src := profiles.NewStaticSource(nil)
	return src, func(authority string) {
		ap := netip.MustParseAddrPort(authority)
		src.Set(authority, serviceProfile(ap.Addr().String(), "").ProfileFor(uint32(ap.Port())))
	}
}

// namedProfile gives the 20-route profile for a service name authority
// (name:port) to a static source.
func namedProfile(authority string) profiles.Source {
	host, port, _ := strings.Cut(authority, ":")
	ap := netip.MustParseAddrPort("0.0.0.0:" + port)
	return profiles.NewStaticSource(map[string]*profiles.Profile{authority: serviceProfile(host, "").ProfileFor(uint32(ap.Port()))})
}

// downgrade is the inbound orig-proto layer alone: upgraded requests are
// restored to HTTP/1 before h.
func downgrade(h http.Handler) http.Handler { return origproto.NewHandler(h) }

// otelHandler and otelTransport are otelhttp's instrumentation with
// tracing off, recording into mp.
func otelHandler(h http.Handler, mp metric.MeterProvider) http.Handler {
	return otelhttp.NewHandler(h, "inbound", otelhttp.WithMeterProvider(mp), otelhttp.WithTracerProvider(tracenoop.NewTracerProvider()))
}

func otelTransport(rt http.RoundTripper, mp metric.MeterProvider) http.RoundTripper {
	return otelhttp.NewTransport(rt, otelhttp.WithMeterProvider(mp), otelhttp.WithTracerProvider(tracenoop.NewTracerProvider()))
}

// stack is an inbound and an outbound inmesh stack sharing one meter,
// with profiles from src, or from the control plane when dst is set. The
// inbound stack routes the local authorities by profile (an inbound stack
// routes only its service's own names).
type stack struct {
	server *mesh.Server
	client *mesh.Client
}

func newStack(app http.Handler, mp metric.MeterProvider, src profiles.Source, dst *destination.Client, local ...string) *stack {
	opts := []mesh.Option{mesh.WithMeterProvider(mp), mesh.WithLogger(quiet)}
	if dst != nil {
		opts = append(opts, mesh.WithDestination(dst))
	} else {
		opts = append(opts, mesh.WithProfiles(src))
	}
	return &stack{server: mesh.NewServer(app, append(mesh.ServerOptions(opts...), mesh.WithLocalAuthorities(local...))...),
		client: mesh.NewClient(mesh.ClientOptions(opts...)...)}
}

func (s *stack) close() {
	s.client.Close()
	s.server.Close()
}

// lateHandler serves with a handler set once its listener's address is
// known (an inbound stack named by that address).
type lateHandler struct{ h atomic.Pointer[http.Handler] }

func (l *lateHandler) set(h http.Handler) { l.h.Store(&h) }

func (l *lateHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*l.h.Load()).ServeHTTP(w, r)
}

// serveMeshed serves h as inmesh's inbound listener does: HTTP/1 and h2c
// on one port, behind the framing guard.
func serveMeshed(h http.Handler) *server {
	return serve(origproto.NewServer(h), origproto.GuardListener)
}

// upgraded is the upgrade transport on its own: every request goes to the
// peer as HTTP/2 with l5d-orig-proto, over one h2c connection.
func upgraded() (http.RoundTripper, func()) {
	h2 := origproto.NewH2Transport()
	return origproto.NewTransport(origproto.WithH2(h2), origproto.WithHint(func(*http.Request) bool { return true })), h2.CloseIdleConnections
}

// waitRoutes sends requests through send until router has the routes of
// authority's profile.
func waitRoutes(r *router.Router, authority string, send func()) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		send()
		if t := r.ProfileTable(authority); t != nil && len(t.Routes()) > 0 {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("the profile of %s never arrived", authority)
}

// controlPlane is inmesh's embedded Destination server on loopback and a
// client of it.
type controlPlane struct {
	store *controlplane.Store
	grpc  *grpc.Server
	dst   *destination.Client
}

func newControlPlane(opts ...destination.Option) (*controlPlane, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{store: controlplane.NewStore(), grpc: grpc.NewServer()}
	controlplane.NewServer(cp.store, controlplane.WithLogger(quiet)).Register(cp.grpc)
	go cp.grpc.Serve(lis)
	opts = append([]destination.Option{destination.WithLogger(quiet), destination.WithBackoff(backoff.Policy{Min: 50 * time.Millisecond, Max: 50 * time.Millisecond})}, opts...)
	cp.dst, err = destination.Dial(lis.Addr().String(), opts...)
	if err != nil {
		cp.grpc.Stop()
		return nil, err
	}
	return cp, nil
}

func (cp *controlPlane) close() {
	cp.dst.Close()
	cp.grpc.Stop()
}

// putProfile publishes the 20-route profile of books with tag. Each tag's
// YAML is parsed once: the scenarios measure the data plane and the
// control plane's delivery, not the harness writing profiles.
func (cp *controlPlane) putProfile(tag string) {
	sp, ok := parsedProfiles.Load(tag)
	if !ok {
		sp, _ = parsedProfiles.LoadOrStore(tag, serviceProfile(strings.Split(books, ":")[0], tag))
	}
	cp.store.PutServiceProfile(sp.(*profiles.ServiceProfile))
}

var parsedProfiles sync.Map // tag -> *profiles.ServiceProfile

// putEndpoints publishes addrs as the endpoints of authority, mesh peers
// (h2) when h2 is true, each with weight.
func (cp *controlPlane) putEndpoints(authority string, addrs []string, h2 bool, weight uint32) {
	eps := make([]endpoint.Endpoint, len(addrs))
	for i, a := range addrs {
		eps[i] = endpoint.Endpoint{Addr: netip.MustParseAddrPort(a), H2: h2, Weight: weight,
			Labels: map[string]string{"pod": fmt.Sprintf("books-%d", i)}}
	}
	cp.store.PutEndpoints(authority, eps)
}

// watches returns the control-plane client's watched authorities.
func (cp *controlPlane) watches() int {
	s := cp.dst.Stats()
	return s.ProfileWatches + s.EndpointWatches
}

// meshed is the whole mesh: the outbound stack of one peer, the inbound
// stack of another around app, and the control plane naming the second
// as the endpoint (a mesh peer) of books.
type meshed struct {
	cp    *controlPlane
	st    *stack
	peer  *server
	close func()
}

func newMeshed(app http.Handler, mp metric.MeterProvider) (*meshed, error) {
	cp, err := newControlPlane()
	if err != nil {
		return nil, err
	}
	cp.putProfile("")
	st := newStack(app, mp, nil, cp.dst, books)
	peer := serveMeshed(st.server)
	cp.putEndpoints(books, []string{peer.addr()}, true, 0)
	m := &meshed{cp: cp, st: st, peer: peer, close: func() {
		st.close()
		peer.Close()
		cp.close()
	}}
	// Both routers hold the profile and the request reached the peer
	// (never a fallback to the service name) before anything is timed.
	send := func() { _ = do(st.client, get("http://"+books+"/books/1", "")) }
	if err := waitRoutes(st.client.Router(), books, send); err != nil {
		m.close()
		return nil, err
	}
	if err := waitRoutes(st.server.Router(), books, send); err != nil {
		m.close()
		return nil, err
	}
	if peer.conns.Load() == 0 {
		m.close()
		return nil, errors.New("the outbound stack did not reach the peer")
	}
	return m, nil
}

// budgetRouter is a router with a static profile for authority whose only
// route is retryable under budget, and a way to deliver that same
// profile again (as a reconnecting control plane does).
func budgetRouter(authority string, budget profiles.RetryBudget) (*router.Router, func()) {
	mk := func() *profiles.Profile {
		b := budget
		return &profiles.Profile{RetryBudget: &b, Routes: []profiles.Route{{
			Condition: profiles.PathRegex("/.*"), Retryable: true,
			Labels: map[string]string{"route": "all"},
		}}}
	}
	src := profiles.NewStaticSource(map[string]*profiles.Profile{authority: mk()})
	r := router.New(router.WithProfiles(src), router.WithLogger(quiet))
	return r, func() { src.Set(authority, mk()) }
}

// origprotoServer is inmesh's inbound listener configuration (HTTP/1 and
// h2c on one port) around h, not yet serving, and the framing guard its
// listeners go behind.
func origprotoServer(h http.Handler) (*http.Server, func(net.Listener) net.Listener) {
	return origproto.NewServer(h), origproto.GuardListener
}
