package mesh

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// A client whose table is full keeps sending to new Services, a few at a
// time, against a real control plane, with the destination client's bound
// equal to the stack's authority bound (as their defaults are). The router
// and the balancer each replace names in tables of their own, at slightly
// different moments, and both watch a name's profile; the client's
// headroom above the bound absorbs the names being replaced, so no watch
// is refused and every request is answered by the app. Without the
// headroom, about one new name in sixteen had its profile watch refused
// (and routed without its profile until the retry), and a few requests got
// a 503 for a refused endpoint watch.
func TestChurnPastAFullTableRefusesNoWatch(t *testing.T) {
	const (
		bound   = 64
		names   = 16 * bound
		workers = 4 // new names in flight at once: the headroom (bound/16) covers this many, no more
	)
	cp := startControlPlane(t)
	var served atomic.Int64
	app := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) }))
	appAddr := netip.MustParseAddrPort(strings.TrimPrefix(app.URL, "http://"))
	sets := make(map[string][]endpoint.Endpoint, names)
	for i := range names {
		sets[churnName(i)] = []endpoint.Endpoint{{Addr: appAddr}}
	}
	cp.store.SetEndpoints(sets)

	dst, err := destination.Dial(cp.addr, destination.WithLogger(quiet), destination.WithMaxWatches(bound))
	require.NoError(t, err)
	defer dst.Close()
	// A loaded machine can take longer than the default second to answer
	// a new name; what this test counts is refused watches, not that.
	cl := NewClient(WithDestination(dst), WithLogger(quiet), WithMaxAuthorities(bound),
		WithBalancerOptions(balancer.WithResolveTimeout(testutil.Timeout)))
	defer cl.Close()

	var next atomic.Int64
	var failed sync.Map // name -> status or error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= names {
					return
				}
				req, _ := http.NewRequest("GET", "http://"+churnName(i)+"/", nil)
				resp, err := cl.RoundTrip(req)
				if err != nil {
					failed.Store(churnName(i), err.Error())
					continue
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Store(churnName(i), fmt.Sprint(resp.StatusCode, " ", resp.Header.Get("l5d-proxy-error")))
				}
			}
		}()
	}
	wg.Wait()
	var failures []string
	failed.Range(func(k, v any) bool {
		failures = append(failures, fmt.Sprint(k, ": ", v))
		return len(failures) < 5
	})
	assert.Empty(t, failures, "requests not answered by the app")
	assert.Equal(t, int64(names), served.Load())
	s := dst.Stats()
	assert.Zero(t, s.RejectedWatches, "watches refused: %+v", s)
	assert.LessOrEqual(t, s.ProfileWatches, bound+bound/16, "%+v", s)
}

func churnName(i int) string { return fmt.Sprintf("svc-%d.churn.svc.cluster.local:80", i) }

// countedServer is a loopback endpoint that counts its open connections
// (ConnState) and the requests it served. Its first request to /slow
// waits for hold to close; later ones are answered at once.
type countedServer struct {
	name string
	ep   endpoint.Endpoint
	open atomic.Int64
	hits atomic.Int64
	slow atomic.Bool // its /slow request is in flight
	hold chan struct{}
}

func newCountedServer(name string, hold chan struct{}) *countedServer {
	return &countedServer{name: name, hold: hold}
}

func (c *countedServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.hits.Add(1)
	if r.URL.Path == "/slow" && c.hold != nil && c.slow.CompareAndSwap(false, true) {
		<-c.hold
		io.WriteString(w, c.name+" slow")
		return
	}
	io.WriteString(w, c.name)
}

func (c *countedServer) connState(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		c.open.Add(1)
	case http.StateClosed, http.StateHijacked:
		c.open.Add(-1)
	}
}

// serveH1 serves c as a plain HTTP/1 endpoint, not a mesh peer.
func (c *countedServer) serveH1(t *testing.T) *countedServer {
	srv := httptest.NewUnstartedServer(c)
	srv.Config.ConnState = c.connState
	srv.Start()
	t.Cleanup(srv.Close)
	c.ep = endpoint.Endpoint{Addr: netip.MustParseAddrPort(srv.Listener.Addr().String()), Weight: endpoint.DefaultWeight}
	return c
}

// servePeer serves c behind a mesh Server on origproto.NewServer: a peer
// hinted h2, reached over mTLS when local is not nil (h2 false: HTTP/1
// inside the mTLS).
func (c *countedServer) servePeer(t *testing.T, local *identity.Local, h2 bool) *countedServer {
	opts := []ServerOption{WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet)}
	if local != nil {
		opts = append(opts, WithIdentity(local))
		c.ep.Identity = local.Name()
	}
	server := NewServer(c, opts...)
	t.Cleanup(server.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := origproto.NewServer(server)
	srv.ErrorLog = quietLog
	srv.ConnState = c.connState
	go srv.Serve(server.Listener(lis))
	t.Cleanup(func() { srv.Close() })
	c.ep.Addr, c.ep.Weight, c.ep.H2 = netip.MustParseAddrPort(lis.Addr().String()), endpoint.DefaultWeight, h2
	return c
}

// Endpoints removed by the control plane while requests to them are in
// flight, over every kind of connection the client makes (an HTTP/1 pool,
// an upgraded h2c connection to a mesh peer, h2 and HTTP/1 over mTLS): each
// request in flight finishes, no new request goes to them, and then the
// client's connections to them are closed, long before the idle timeout,
// as Linkerd's proxy drops a removed endpoint's connections once its
// responses are done. An endpoint removed from one Service but still in
// another keeps its connections, and so does the one that stays.
func TestRemovedEndpointsConnectionsCloseOnceIdle(t *testing.T) {
	const svc, other = "churn.default.svc.cluster.local:80", "other.default.svc.cluster.local:80"
	p := newPKI(t)
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	defer release()
	removed := []*countedServer{
		newCountedServer("h1", hold).serveH1(t),
		newCountedServer("h2c", hold).servePeer(t, nil, true),
		newCountedServer("h2-mtls", hold).servePeer(t, p.certify(t, booksID), true),
		newCountedServer("h1-mtls", hold).servePeer(t, p.certify(t, reviewsID), false),
	}
	keep := newCountedServer("keep", nil).serveH1(t)
	shared := newCountedServer("shared", nil).serveH1(t)
	all := append([]*countedServer{keep, shared}, removed...)
	eps := make([]endpoint.Endpoint, len(all))
	for i, s := range all {
		eps[i] = s.ep
	}
	cp := startControlPlane(t)
	cp.store.PutEndpoints(svc, eps)
	cp.store.PutEndpoints(other, []endpoint.Endpoint{shared.ep})
	dst, err := destination.Dial(cp.addr, destination.WithLogger(quiet))
	require.NoError(t, err)
	defer dst.Close()
	cl := NewClient(WithDestination(dst), WithIdentity(p.certify(t, webID)), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer cl.Close()
	hc := &http.Client{Transport: cl, Timeout: 2 * testutil.Timeout}
	get := func(url string) string {
		resp, err := hc.Get(url)
		if !assert.NoError(t, err) {
			return ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		assert.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		return string(body)
	}

	// Traffic to every endpoint, a few requests at a time, until each has
	// connections of the client's.
	deadline := time.Now().Add(testutil.Timeout)
	for !allServed(all) && time.Now().Before(deadline) {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 10 {
					get("http://" + svc + "/")
					get("http://" + other + "/")
				}
			})
		}
		wg.Wait()
	}
	for _, s := range all {
		require.Positive(t, s.open.Load(), "%s has no connection", s.name)
	}

	// A request in flight to each endpoint about to be removed.
	slow := make(chan string, len(removed))
	for range removed {
		go func() {
			for {
				body := get("http://" + svc + "/slow")
				if body == "" || strings.HasSuffix(body, " slow") {
					slow <- body
					return
				}
			}
		}()
	}
	require.Eventually(t, func() bool {
		for _, s := range removed {
			if !s.slow.Load() {
				return false
			}
		}
		return true
	}, testutil.Timeout, time.Millisecond, "a request in flight to each endpoint")

	cp.store.PutEndpoints(svc, []endpoint.Endpoint{keep.ep})
	require.Eventually(t, func() bool { return len(cl.Balancer().Endpoints(svc)) == 1 }, testutil.Timeout, time.Millisecond)
	hits := make([]int64, len(removed))
	for i, s := range removed {
		hits[i] = s.hits.Load()
	}
	for range 50 {
		assert.Equal(t, "keep", get("http://"+svc+"/"), "a request went to a removed endpoint")
	}
	for i, s := range removed {
		assert.Equal(t, hits[i], s.hits.Load(), "requests to %s after its removal", s.name)
	}

	release()
	var finished []string
	for range removed {
		finished = append(finished, <-slow)
	}
	assert.ElementsMatch(t, []string{"h1 slow", "h2c slow", "h2-mtls slow", "h1-mtls slow"}, finished, "the requests in flight finished")
	assert.Eventually(t, func() bool {
		for _, s := range removed {
			if s.open.Load() != 0 {
				return false
			}
		}
		return true
	}, testutil.Timeout, 5*time.Millisecond, "connections to removed endpoints still open %v after their last request, with an idle timeout of %v",
		testutil.Timeout, DefaultIdleConnTimeout)
	for _, s := range removed {
		assert.Zero(t, s.open.Load(), "%s: connections still open", s.name)
	}
	assert.Positive(t, keep.open.Load(), "the endpoint that stayed lost its connections")
	assert.Positive(t, shared.open.Load(), "the endpoint still in another Service lost its connections")
	assert.Equal(t, "shared", get("http://"+other+"/"))
}

// allServed reports whether each of servers has an open connection and
// has served a request.
func allServed(servers []*countedServer) bool {
	for _, s := range servers {
		if s.hits.Load() == 0 || s.open.Load() == 0 {
			return false
		}
	}
	return true
}

// Replace-all updates under traffic, each naming two new endpoints: the
// client ends with connections to the current endpoints only, where it
// kept every replaced endpoint's until the idle timeout.
func TestReplaceAllUpdatesLeaveNoConnectionsBehind(t *testing.T) {
	const svc, rounds = "replaced.default.svc.cluster.local:80", 10
	cp := startControlPlane(t)
	dst, err := destination.Dial(cp.addr, destination.WithLogger(quiet))
	require.NoError(t, err)
	defer dst.Close()
	cl := NewClient(WithDestination(dst), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer cl.Close()
	var servers []*countedServer
	for round := range rounds {
		set := []*countedServer{
			newCountedServer(fmt.Sprint("h1-", round), nil).serveH1(t),
			newCountedServer(fmt.Sprint("h2c-", round), nil).servePeer(t, nil, true),
		}
		servers = append(servers, set...)
		cp.store.PutEndpoints(svc, []endpoint.Endpoint{set[0].ep, set[1].ep})
		if round == 0 { // the balancer watches the Service from its first request
			req, _ := http.NewRequest("GET", "http://"+svc+"/", nil)
			resp, err := cl.RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
		}
		require.Eventually(t, func() bool {
			eps := cl.Balancer().Endpoints(svc)
			return len(eps) == 2 && (eps[0].Addr == set[0].ep.Addr.String() || eps[0].Addr == set[1].ep.Addr.String())
		}, testutil.Timeout, time.Millisecond, "round %d", round)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 10 {
					req, _ := http.NewRequest("GET", "http://"+svc+"/", nil)
					resp, err := cl.RoundTrip(req)
					if assert.NoError(t, err) {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			})
		}
		wg.Wait()
	}
	last := servers[len(servers)-2:]
	assert.Eventually(t, func() bool {
		for _, s := range servers[:len(servers)-2] {
			if s.open.Load() != 0 {
				return false
			}
		}
		return true
	}, testutil.Timeout, 5*time.Millisecond, "connections to replaced endpoints still open")
	var left []string
	for _, s := range servers[:len(servers)-2] {
		if n := s.open.Load(); n != 0 {
			left = append(left, fmt.Sprint(s.name, ": ", n))
		}
	}
	assert.Empty(t, left, "connections to replaced endpoints")
	for _, s := range last {
		assert.Positive(t, s.open.Load(), "%s: the current endpoint's connections", s.name)
	}
}
