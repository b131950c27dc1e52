package mesh

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// floodHosts is the number of distinct Hosts of a flood: 100,000, or
// 3,000 (still past the caps) under the race detector, which slows every
// request.
var floodHosts = map[bool]int{false: 100000, true: 3000}[raceEnabled]

// controlPlane is a real Destination server on a loopback gRPC listener,
// counting the GetProfile and Get streams it serves.
type controlPlane struct {
	store              *controlplane.Store
	addr               string
	profiles, gets     atomic.Int64
	openProfileStreams atomic.Int64
}

func startControlPlane(t *testing.T) *controlPlane {
	cp := &controlPlane{store: controlplane.NewStore()}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		switch {
		case strings.HasSuffix(info.FullMethod, "/GetProfile"):
			cp.profiles.Add(1)
			cp.openProfileStreams.Add(1)
			defer cp.openProfileStreams.Add(-1)
		case strings.HasSuffix(info.FullMethod, "/Get"):
			cp.gets.Add(1)
		}
		return h(srv, ss)
	}))
	controlplane.NewServer(cp.store, controlplane.WithLogger(quiet)).Register(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	cp.addr = lis.Addr().String()
	return cp
}

// floodHost is the i-th Host of a flood: an IP literal on loopback, so
// that nothing ever asks a resolver.
func floodHost(i int) string {
	return fmt.Sprintf("127.%d.%d.%d:%d", 1+i>>16&255, i>>8&255, i&255, 1+i%50000)
}

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// flood sends n requests with distinct Hosts through rt, 8 at a time, to
// the server at url (the Host header names the authority; the URL the
// server).
func flood(t *testing.T, rt http.RoundTripper, url string, n int) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				req, _ := http.NewRequest("GET", url+"/flood", nil)
				req.Host = floodHost(i)
				resp, err := rt.RoundTrip(req)
				if err != nil {
					t.Errorf("request %d: %v", i, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
}

// labelValues returns the distinct values of label in the series of
// family.
func labelValues(t *testing.T, m *testutil.Metrics, family, label string) map[string]bool {
	re := regexp.MustCompile(label + `="([^"]*)"`)
	out := map[string]bool{}
	for _, l := range m.Lines(t, family) {
		if v := re.FindStringSubmatch(l); v != nil {
			out[v[1]] = true
		}
	}
	return out
}

const late = "late.default.svc.cluster.local:80"

// 100,000 distinct Hosts through the outbound stack hold bounded memory
// and bounded label sets; once they are idle their watches are released,
// so that a service first used afterwards gets its profile and endpoints.
func TestOutboundHostFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of 100,000 requests")
	}
	const maxWatches = 1000
	cp := startControlPlane(t)
	sps, err := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: late.default.svc.cluster.local}
spec:
  routes:
  - name: GET /late
    condition: {method: GET, pathRegex: /late}
`))
	require.NoError(t, err)
	cp.store.SetServiceProfiles(sps)
	app := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	cp.store.PutEndpoints(late, []endpoint.Endpoint{{Addr: netip.MustParseAddrPort(strings.TrimPrefix(app.URL, "http://"))}})

	// The flood's loopback literals are inside the search path, so every
	// Host is looked up and the watch bound is what holds.
	dst, err := destination.Dial(cp.addr, destination.WithLogger(quiet), destination.WithMaxWatches(maxWatches),
		destination.WithIdleTimeout(time.Second), destination.WithSearchNetworks(netip.MustParsePrefix("127.0.0.0/8")))
	require.NoError(t, err)
	defer dst.Close()

	m := testutil.NewMetrics(t)
	rtr := router.New(router.WithProfiles(dst), router.WithLogger(quiet), router.WithMeterProvider(m.Provider),
		router.WithMaxAuthorities(maxWatches), router.WithIdleTimeout(200*time.Millisecond))
	defer rtr.Close()
	// Whatever the Host, connections go to the loopback app.
	base := testutil.NewTransport(t, testutil.H1)
	base.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, strings.TrimPrefix(app.URL, "http://"))
	}
	routes := make(chan *profiles.CompiledRoute, 1)
	spy := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Host == late {
			routes <- router.ProfileRouteFromContext(r.Context())
		}
		return base.RoundTrip(r)
	})
	rt := rtr.Transport(classify.NewTransport(spy, classify.WithMeterProvider(m.Provider),
		classify.WithMaxAuthorities(maxWatches)))

	flood(t, rt, app.URL, 1000) // warm up pools, instruments and code paths
	require.Eventually(t, func() bool { return dst.Stats().ProfileWatches == 0 }, testutil.Timeout, 10*time.Millisecond)
	before := heapInUse()
	flood(t, rt, app.URL, floodHosts)
	after := heapInUse()
	growth := int64(after) - int64(before)
	t.Logf("heap growth over %d distinct Hosts: %.1f MiB; %d GetProfile streams opened; stats %+v",
		floodHosts, float64(growth)/(1<<20), cp.profiles.Load(), dst.Stats())
	assert.Less(t, growth, int64(50<<20), "heap growth under 50 MiB")

	dsts := labelValues(t, m, "route_request_total", "dst")
	authorities := labelValues(t, m, "request_total", "authority")
	t.Logf("distinct dst values %d, authority values %d", len(dsts), len(authorities))
	assert.LessOrEqual(t, len(dsts), maxWatches+1, "dst values within the bound plus other")
	assert.LessOrEqual(t, len(authorities), maxWatches+1)
	assert.True(t, dsts["other"])
	assert.Empty(t, m.Lines(t, "otel_metric_overflow"))

	// Idle: every watch is released, on both sides of the stream.
	require.Eventually(t, func() bool {
		s := dst.Stats()
		return s.ProfileWatches == 0 && s.EndpointWatches == 0 && cp.openProfileStreams.Load() == 0
	}, testutil.Timeout, 10*time.Millisecond, "watches released after the idle timeout: %+v", dst.Stats())

	// A service first used now gets its profile's route...
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest("GET", app.URL+"/late", nil)
		req.Host = late
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		return (<-routes).Labels["route"] == "GET /late"
	}, testutil.Timeout, 10*time.Millisecond)
	// ...and its endpoints.
	got := make(chan *endpoint.Set, 1)
	stop, err := dst.WatchEndpoints(context.Background(), late, func(u endpoint.Update) {
		if u.Set != nil {
			select {
			case got <- u.Set:
			default:
			}
		}
	})
	require.NoError(t, err)
	defer stop()
	select {
	case s := <-got:
		assert.Len(t, s.Endpoints, 1)
	case <-time.After(testutil.Timeout):
		t.Fatal("no endpoints for a service first used after the flood")
	}
}

// The same flood through the whole outbound stack of NewClient (router,
// balancer, classify) against a real control plane: memory stays bounded,
// once the Hosts are idle every profile and endpoint watch is released,
// and a service first used afterwards gets its profile's route and its
// endpoints through the balancer.
func TestClientHostFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of 100,000 requests")
	}
	const maxWatches = 1000
	cp := startControlPlane(t)
	sps, err := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: late.default.svc.cluster.local}
spec:
  routes:
  - name: GET /late
    condition: {method: GET, pathRegex: /late}
`))
	require.NoError(t, err)
	cp.store.SetServiceProfiles(sps)
	app := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	appAddr := strings.TrimPrefix(app.URL, "http://")
	cp.store.PutEndpoints(late, []endpoint.Endpoint{{Addr: netip.MustParseAddrPort(appAddr), Labels: map[string]string{"pod": "late-0"}}})

	// The flood's loopback literals are inside the search path, so every
	// Host is looked up and the watch bound is what holds.
	dst, err := destination.Dial(cp.addr, destination.WithLogger(quiet), destination.WithMaxWatches(maxWatches),
		destination.WithIdleTimeout(time.Second), destination.WithSearchNetworks(netip.MustParsePrefix("127.0.0.0/8")))
	require.NoError(t, err)
	defer dst.Close()

	m := testutil.NewMetrics(t)
	// Whatever the address, an endpoint or a fallback, connections go to
	// the loopback app.
	cl := NewClient(WithDestination(dst), WithLogger(quiet), WithMeterProvider(m.Provider),
		WithMaxAuthorities(maxWatches), WithIdleTimeout(200*time.Millisecond),
		WithDialContext(func(ctx context.Context, network, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, appAddr)
		}))
	defer cl.Close()

	idle := func() bool {
		s := dst.Stats()
		return s.ProfileWatches == 0 && s.EndpointWatches == 0 && cp.openProfileStreams.Load() == 0
	}
	flood(t, cl, app.URL, 1000) // warm up pools, instruments and code paths
	require.Eventually(t, idle, testutil.Timeout, 10*time.Millisecond, "after the warm-up: %+v", dst.Stats())
	before := heapInUse()
	flood(t, cl, app.URL, floodHosts)
	after := heapInUse()
	growth := int64(after) - int64(before)
	t.Logf("heap growth over %d distinct Hosts: %.1f MiB; %d GetProfile and %d Get streams opened; stats %+v",
		floodHosts, float64(growth)/(1<<20), cp.profiles.Load(), cp.gets.Load(), dst.Stats())
	assert.Less(t, growth, int64(50<<20), "heap growth under 50 MiB")
	assert.LessOrEqual(t, len(labelValues(t, m, "request_total", "authority")), maxWatches+1)
	assert.Empty(t, m.Lines(t, "otel_metric_overflow"))

	// Idle: every watch is released, on both sides of the stream.
	require.Eventually(t, idle, testutil.Timeout, 10*time.Millisecond,
		"watches released after the idle timeout: %+v", dst.Stats())
	t.Logf("after the idle timeout: stats %+v, open GetProfile streams %d", dst.Stats(), cp.openProfileStreams.Load())

	// A service first used now gets its profile's route and, through the
	// balancer, its endpoints: the response is labelled with the
	// endpoint's labels.
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest("GET", app.URL+"/late", nil)
		req.Host = late
		resp, err := cl.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && len(cl.Balancer().Endpoints(late)) == 1 &&
			hasRoute(cl.Router().ProfileTable(late), "GET /late") &&
			len(m.Lines(t, "response_total", `dst_pod="late-0"`)) > 0
	}, testutil.Timeout, 10*time.Millisecond)
}

// The same flood at the inbound stack opens no control-plane watch at all.
func TestInboundHostFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of 100,000 requests")
	}
	cp := startControlPlane(t)
	dst, err := destination.Dial(cp.addr, destination.WithLogger(quiet), destination.WithMaxWatches(1000))
	require.NoError(t, err)
	defer dst.Close()
	m := testutil.NewMetrics(t)
	inbound := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		WithDestination(dst), WithMeterProvider(m.Provider), WithLogger(quiet))
	defer inbound.Close()
	srv := testutil.NewServer(t, inbound)

	before := heapInUse()
	flood(t, testutil.NewTransport(t, testutil.H1), srv.URL, floodHosts)
	after := heapInUse()
	t.Logf("inbound heap growth over %d distinct Hosts: %.1f MiB; %d GetProfile streams; stats %+v",
		floodHosts, float64(int64(after)-int64(before))/(1<<20), cp.profiles.Load(), dst.Stats())
	assert.Equal(t, destination.Stats{}, dst.Stats(), "no watch")
	assert.Zero(t, cp.profiles.Load(), "no GetProfile stream")
	assert.Zero(t, cp.gets.Load(), "no Get stream")
	dsts := labelValues(t, m, "route_request_total", "dst")
	assert.True(t, len(dsts) == 1 && dsts["other"], "inbound dst is only other: %d values", len(dsts))
	assert.LessOrEqual(t, len(labelValues(t, m, "request_total", "authority")), classify.DefaultMaxAuthorities+1)
	assert.Less(t, int64(after)-int64(before), int64(50<<20))
}

// hasRoute reports whether t holds a profile with the route name.
func hasRoute(t *profiles.Table, name string) bool {
	if t == nil || t.Profile() == nil {
		return false
	}
	for _, r := range t.Profile().Routes {
		if r.Labels["route"] == name {
			return true
		}
	}
	return false
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
