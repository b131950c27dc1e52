package telemetry

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// `linkerd viz stat server/books-http` reads the TCP columns of a Server
// from tcp_open_connections / tcp_read_bytes_total / tcp_write_bytes_total
// {direction="inbound", peer="src", srv_kind="server", srv_name="<name>"}
// (linkerd2 viz/metrics-api/policy.go, getPolicyMetrics). Linkerd's proxy
// labels every inbound connection with the Server that admitted it
// (linkerd/app/core/src/transport/labels.rs, ServerLabels::inbound:
// direction, peer="src", target_addr, target_ip, target_port, tls, then
// srv_group, srv_kind, srv_name, srv_port). The same traffic through
// mesh.NewServer with a Server policy gives request metrics with srv_*,
// and, as Linkerd's, tcp_* with them (a version without them left the TCP
// columns empty).
func TestInboundTCPSeriesOfAServer(t *testing.T) {
	text := serveThroughAServer(t)

	// The request metrics carry the Server (viz stat server's request columns).
	reqs, _ := testutil.Select(t, text, "response_total", `direction="inbound"`, `srv_kind="server"`, `srv_name="books-http"`)
	require.NotEmpty(t, reqs, "control: response_total of server/books-http:\n%s", testutil.Family(text, "response_total"))

	// The connection the request came on is open; viz's TCP queries of server/books-http.
	for _, fam := range []string{"tcp_open_connections", "tcp_read_bytes_total", "tcp_write_bytes_total"} {
		got, _ := testutil.Select(t, text, fam, `direction="inbound"`, `peer="src"`, `srv_kind="server"`, `srv_name="books-http"`)
		assert.NotEmpty(t, got, "viz stat server/books-http selects no %s series; the exporter has:\n%s", fam, testutil.Family(text, fam))
	}
}

// Linkerd writes an address as the triple target_addr, target_ip,
// target_port (linkerd/app/core/src/transport/labels.rs, impl FmtLabels for
// TargetAddr) on every tcp_* series and on request_total, response_total
// and response_latency_ms (InboundEndpointLabels, OutboundEndpointLabels in
// linkerd/app/core/src/metrics.rs); its integration tests select inbound
// request_total by target_port (linkerd/app/integration/src/tests/
// telemetry.rs, Fixture::inbound). So does inmesh, through the exporter (a
// version wrote target_addr alone on tcp_*).
func TestTCPSeriesCarryTargetIPAndPort(t *testing.T) {
	text := serveThroughAServer(t)
	for _, fam := range []string{"tcp_open_total", "tcp_open_connections", "tcp_read_bytes_total"} {
		got, _ := testutil.Select(t, text, fam, `direction="inbound"`, `target_ip="127.0.0.1"`, `target_port=~"[0-9]+"`)
		assert.NotEmpty(t, got, "%s lacks target_ip/target_port:\n%s", fam, testutil.Family(text, fam))
	}
}

// serveThroughAServer serves one request through mesh.NewServer with the
// Server books-http (a Linkerd policy.linkerd.io Server) as its policy, with
// the examples' exporter, and returns the exposition.
func serveThroughAServer(t *testing.T) string {
	m, err := New(0)
	require.NoError(t, err)
	t.Cleanup(func() { m.Provider.Shutdown(t.Context()) })

	srv := &authz.Server{
		Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-http"},
		Routes: []authz.Route{{
			Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPRoute", Name: "books-all"},
			Rules: []authz.Rule{{Matches: []policy.HTTPRouteMatch{{
				Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/"}}}}},
			Authorizations: []authz.Authz{{
				Meta:           authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "all"},
				Networks:       []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}},
				Authentication: authz.Authentication{}, // no MeshTLS: any client of the networks
			}},
		}},
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "books") })
	quiet := slog.New(slog.DiscardHandler)
	server := mesh.NewServer(app, mesh.WithMeterProvider(m.Provider), mesh.WithLogger(quiet),
		mesh.WithInboundPolicy(authz.WithDefault(srv)))
	t.Cleanup(server.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := origproto.NewServer(server)
	go hs.Serve(server.Listener(lis))
	t.Cleanup(func() { hs.Close() })

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Get("http://" + lis.Addr().String() + "/books")
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)

	// The server counts the bytes of its response once its write has
	// returned, which may be after the client read them.
	var text string
	require.Eventually(t, func() bool {
		rec := httptest.NewRecorder()
		m.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		text = rec.Body.String()
		_, wrote := testutil.Select(t, text, "tcp_write_bytes_total", `direction="inbound"`)
		return wrote > 0
	}, testutil.Timeout, 5*time.Millisecond)
	return text
}
