package dashboard_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/dashboard"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/mesh"
	"github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/tap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const books = "books.shop.svc.cluster.local:7000"

func state(t *testing.T, url string) dashboard.State {
	t.Helper()
	resp, err := http.Get(url + "/state.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var s dashboard.State
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	return s
}

// The dashboard's data is what the traffic was: per route and direction
// the requests, the failures, the success rate and the latency; the
// endpoints the balancer used, with their identity and zone; served on
// loopback with the page and its assets, which name no other origin.
func TestStateFollowsTheTraffic(t *testing.T) {
	hub := tap.NewHub()
	noMetrics := mesh.WithMeterProvider(noop.NewMeterProvider())
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/fail") {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	server := mesh.NewServer(app, noMetrics, mesh.WithTap(hub))
	defer server.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := origproto.NewServer(server)
	go func() { _ = srv.Serve(origproto.GuardListener(lis)) }()
	defer srv.Close()
	endpoints, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		books: {{Addr: netip.MustParseAddrPort(lis.Addr().String()), H2: true, Identity: "books.shop.serviceaccount.identity.linkerd.cluster.local", Labels: map[string]string{"zone": "zone-a"}}},
	})
	require.NoError(t, err)
	client := mesh.NewClient(mesh.WithEndpoints(endpoints), noMetrics, mesh.WithTap(hub))
	defer client.Close()

	d := dashboard.New(hub, dashboard.WithBalancer(client.Balancer()), dashboard.WithName("books-client"))
	defer d.Close()
	page := testutil.NewServer(t, d)

	c := &http.Client{Transport: client, Timeout: testutil.Timeout}
	for i := range 20 {
		path := "/books"
		if i%4 == 0 {
			path = "/fail"
		}
		resp, err := c.Get("http://" + books + path)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}

	s := state(t, page.URL)
	assert.Equal(t, "books-client", s.Name)
	require.Len(t, s.Routes, 2, "%+v", s.Routes)
	for _, r := range s.Routes {
		assert.Equal(t, books, r.Authority)
		assert.Equal(t, uint64(20), r.Requests, r.Direction)
		assert.Equal(t, uint64(5), r.Failures, r.Direction)
		assert.InDelta(t, 0.75, r.SuccessRate, 1e-9, r.Direction)
		assert.Greater(t, r.P99, 0.0, r.Direction)
		assert.LessOrEqual(t, r.P50, r.P99, r.Direction)
		assert.Greater(t, r.RPS, 0.0, r.Direction)
	}
	assert.Equal(t, "outbound", s.Routes[0].Direction, "outbound rows first")
	require.Len(t, s.Endpoints, 1)
	require.Len(t, s.Endpoints[0].Endpoints, 1)
	ep := s.Endpoints[0].Endpoints[0]
	assert.Equal(t, lis.Addr().String(), ep.Addr)
	assert.Equal(t, "ready", ep.State)
	assert.Equal(t, "zone-a", ep.Zone)
	assert.Equal(t, "books.shop.serviceaccount.identity.linkerd.cluster.local", ep.Identity)

	for path, want := range map[string]string{"/": "text/html", "/static/app.js": "javascript", "/static/style.css": "text/css"} {
		resp, err := http.Get(page.URL + path)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Contains(t, resp.Header.Get("Content-Type"), want, path)
		assert.NotRegexp(t, `(?i)(src|href)="?https?:`, string(body), "%s loads nothing from another origin", path)
	}
}

// Only loopback clients see the dashboard unless an option names who
// else: a remote client is refused, one with an allowed verified identity
// is let in, and one that merely claims it in a header is not.
func TestAccess(t *testing.T) {
	hub := tap.NewHub()
	const ops = "ops.shop.serviceaccount.identity.linkerd.cluster.local"
	d := dashboard.New(hub, dashboard.WithAllowedIdentities(ops))
	defer d.Close()
	for _, tc := range []struct {
		name   string
		remote string
		host   string
		peer   *identity.Peer
		header string
		want   int
	}{
		{"loopback v4", "127.0.0.1:5000", "127.0.0.1:4191", nil, "", http.StatusOK},
		{"loopback v6", "[::1]:5000", "[::1]:4191", nil, "", http.StatusOK},
		{"v4-mapped loopback", "[::ffff:127.0.0.1]:5000", "localhost:4191", nil, "", http.StatusOK},
		// A page a browser loaded from another name whose DNS then
		// pointed at 127.0.0.1 (DNS rebinding) asks for its own name.
		{"loopback asked for another name", "127.0.0.1:5000", "attacker.example:4191", nil, "", http.StatusForbidden},
		{"remote", "192.0.2.10:5000", "192.0.2.1:4191", nil, "", http.StatusForbidden},
		{"remote claiming the identity in a header", "192.0.2.10:5000", "192.0.2.1:4191", nil, ops, http.StatusForbidden},
		{"remote with another verified identity", "192.0.2.10:5000", "192.0.2.1:4191", &identity.Peer{TLS: true, ID: "web.shop.serviceaccount.identity.linkerd.cluster.local"}, "", http.StatusForbidden},
		{"remote over TLS without a certificate", "192.0.2.10:5000", "192.0.2.1:4191", &identity.Peer{TLS: true}, "", http.StatusForbidden},
		{"remote with the allowed verified identity", "192.0.2.10:5000", "dashboard.example:4191", &identity.Peer{TLS: true, ID: ops}, "", http.StatusOK},
		{"no address", "", "127.0.0.1:4191", nil, "", http.StatusForbidden},
	} {
		for _, path := range []string{"/", "/state.json", "/tap?status=oops"} {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			req.RemoteAddr, req.Host = tc.remote, tc.host
			if tc.peer != nil {
				req = req.WithContext(identity.WithPeer(req.Context(), *tc.peer))
			}
			if tc.header != "" {
				req.Header.Set("l5d-client-id", tc.header)
			}
			w := httptest.NewRecorder()
			d.ServeHTTP(w, req)
			want := tc.want
			if want == http.StatusOK && strings.HasPrefix(path, "/tap") {
				want = http.StatusBadRequest // admitted, and then the filter is refused
			}
			assert.Equal(t, want, w.Code, "%s %s", tc.name, path)
		}
	}

	// And through a real listener that is not loopback to the dashboard's
	// eyes: WithAccess decides every request.
	denyAll := dashboard.New(hub, dashboard.WithAccess(func(*http.Request) bool { return false }))
	defer denyAll.Close()
	srv := testutil.NewServer(t, denyAll)
	resp, err := http.Get(srv.URL + "/state.json")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
}

// The route table is bounded: a client that names endless authorities
// fills at most the bound, and the rest is counted under "other".
func TestRouteTableIsBounded(t *testing.T) {
	hub := tap.NewHub()
	now := time.Unix(1_000_000, 0)
	d := dashboard.New(hub, dashboard.WithClock(func() time.Time { return now }))
	defer d.Close()
	for i := range 2000 {
		hub.Publish(&tap.Event{Direction: "inbound", Authority: "a" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + ":" + strconv.Itoa(i), Status: 200})
	}
	s := d.State()
	assert.LessOrEqual(t, len(s.Routes), 501)
	var total uint64
	other := false
	for _, r := range s.Routes {
		total += r.Requests
		other = other || r.Authority == "other"
	}
	assert.True(t, other)
	assert.Equal(t, uint64(2000), total, "every request is counted somewhere")
	// The request rate is over the last ten seconds of the clock.
	assert.InDelta(t, 200.0, sumRPS(s.Routes), 1e-9)
	now = now.Add(11 * time.Second)
	assert.InDelta(t, 0.0, sumRPS(d.State().Routes), 1e-9)
}

func sumRPS(rs []dashboard.Route) float64 {
	var x float64
	for _, r := range rs {
		x += r.RPS
	}
	return x
}
