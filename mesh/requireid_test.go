package mesh

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// l5d-require-id names the identity that the endpoint of a request must
// prove over mTLS, as Linkerd's outbound proxy honours it
// (linkerd2-proxy, linkerd/app/outbound/src/http/require_id_header.rs):
// the header is removed before the request leaves, whether or not it was
// honoured; an endpoint that proves another identity, or none (plaintext,
// also when only discovery names an identity and the client has none of
// its own), fails the request with 502 (gRPC UNAVAILABLE) and the
// application is not reached. Each row is the first request of a fresh
// client.
func TestRequireIDHeader(t *testing.T) {
	p := newPKI(t)
	var meshedReached, plainReached atomic.Int32
	app := func(reached *atomic.Int32) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached.Add(1)
			peer, _ := identity.PeerFromContext(r.Context())
			io.WriteString(w, "tls="+boolText(peer.TLS)+" require-id="+strings.Join(r.Header.Values("L5d-Require-Id"), ","))
		})
	}
	meshed := NewServer(app(&meshedReached), WithIdentity(p.certify(t, booksID)), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer meshed.Close()
	meshedAddr := serveMeshed(t, meshed)
	plain := NewServer(app(&plainReached), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer plain.Close()
	plainAddr := serveMeshed(t, plain)

	const books = "books.default.svc.cluster.local:7000"
	for _, tc := range []struct {
		name        string
		ep          endpoint.Endpoint
		clientID    bool   // the client has an identity of its own
		requireID   string // empty: no header
		grpc        bool
		wantStatus  int
		wantGRPC    string // grpc-status of a gRPC request's answer
		wantBody    string // what the application saw, when reached
		wantReached bool
	}{
		{name: "its own identity", ep: endpoint.Endpoint{Addr: meshedAddr, Identity: booksID}, clientID: true,
			requireID: booksID, wantStatus: 200, wantBody: "tls=true require-id=", wantReached: true},
		{name: "its own identity upper case, h2", ep: endpoint.Endpoint{Addr: meshedAddr, H2: true, Identity: booksID}, clientID: true,
			requireID: strings.ToUpper(booksID), wantStatus: 200, wantBody: "tls=true require-id=", wantReached: true},
		{name: "another identity", ep: endpoint.Endpoint{Addr: meshedAddr, Identity: booksID}, clientID: true,
			requireID: reviewsID, wantStatus: http.StatusBadGateway},
		{name: "another identity, h2", ep: endpoint.Endpoint{Addr: meshedAddr, H2: true, Identity: booksID}, clientID: true,
			requireID: reviewsID, wantStatus: http.StatusBadGateway},
		{name: "another identity, gRPC", ep: endpoint.Endpoint{Addr: meshedAddr, H2: true, Identity: booksID}, clientID: true,
			requireID: reviewsID, grpc: true, wantStatus: 200, wantGRPC: "14"},
		{name: "plaintext endpoint", ep: endpoint.Endpoint{Addr: plainAddr}, clientID: true,
			requireID: booksID, wantStatus: http.StatusBadGateway},
		{name: "identity named by discovery only, client without identity", ep: endpoint.Endpoint{Addr: meshedAddr, Identity: booksID},
			requireID: booksID, wantStatus: http.StatusBadGateway},
		// Linkerd's proxy parses the value as an identity and ignores one
		// that is none (require_id_header.rs, extract_id): the header is
		// removed and the request goes as it would without it.
		{name: "a value that is no identity, plaintext endpoint", ep: endpoint.Endpoint{Addr: plainAddr}, clientID: true,
			requireID: "books..default", wantStatus: 200, wantBody: "tls=false require-id=", wantReached: true},
		{name: "a name with a trailing dot, plaintext endpoint", ep: endpoint.Endpoint{Addr: plainAddr}, clientID: true,
			requireID: booksID + ".", wantStatus: 200, wantBody: "tls=false require-id=", wantReached: true},
		{name: "no header", ep: endpoint.Endpoint{Addr: meshedAddr, Identity: booksID}, clientID: true,
			wantStatus: 200, wantBody: "tls=true require-id=", wantReached: true},
		{name: "no header, plaintext endpoint", ep: endpoint.Endpoint{Addr: plainAddr}, clientID: true,
			wantStatus: 200, wantBody: "tls=false require-id=", wantReached: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {tc.ep}})
			require.NoError(t, err)
			opts := []ClientOption{WithEndpoints(eps), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet),
				WithBalancerOptions(balancer.WithFallback(false))}
			if tc.clientID {
				opts = append(opts, WithIdentity(p.certify(t, webID)))
			}
			client := NewClient(opts...)
			defer client.Close()
			reached := &meshedReached
			if tc.ep.Identity == "" {
				reached = &plainReached
			}
			before := reached.Load()

			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, "POST", "http://"+books+"/", strings.NewReader("body"))
			require.NoError(t, err)
			if tc.requireID != "" {
				req.Header.Set("L5d-Require-Id", tc.requireID)
			}
			if tc.grpc {
				req.Header.Set("Content-Type", "application/grpc")
			}
			resp, err := client.RoundTrip(req)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)

			assert.Equal(t, tc.wantStatus, resp.StatusCode, "body %q, l5d-proxy-error %q", body, resp.Header.Get("L5d-Proxy-Error"))
			assert.Equal(t, tc.requireID, req.Header.Get("L5d-Require-Id"), "the caller's request is unchanged")
			if tc.wantReached {
				assert.Equal(t, tc.wantBody, string(body), "the application never sees l5d-require-id")
				assert.Equal(t, before+1, reached.Load())
				return
			}
			assert.Equal(t, before, reached.Load(), "the application is not reached")
			assert.Contains(t, resp.Header.Get("L5d-Proxy-Error"), "identity required")
			assert.Equal(t, tc.wantGRPC, resp.Header.Get("Grpc-Status"))
		})
	}
}

// A request that l5d-require-id refuses is not counted in its endpoint's
// request_total, response_total and response_latency_ms, as Linkerd's
// proxy refuses it in a layer above its endpoint metrics
// (linkerd/app/outbound/src/http/endpoint.rs: NewRequireIdentity wraps the
// http_endpoint metrics layer) and as meshgrpc refuses a call before its
// endpoint records it. The endpoint's accepted requests are counted.
func TestRequireIDRefusalNotInEndpointSeries(t *testing.T) {
	p := newPKI(t)
	const books = "books.default.svc.cluster.local:7000"
	addr := netip.MustParseAddrPort(testutil.NewServer(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).Listener.Addr().String())
	for _, tc := range []struct {
		name string
		h2   bool
	}{{"HTTP/1", false}, {"HTTP/2", true}} {
		t.Run(tc.name, func(t *testing.T) {
			eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {{Addr: addr}}})
			require.NoError(t, err)
			m := testutil.NewMetrics(t)
			client := NewClient(WithEndpoints(eps), WithIdentity(p.certify(t, webID)), WithMeterProvider(m.Provider), WithLogger(quiet),
				WithBalancerOptions(balancer.WithFallback(false)))
			defer client.Close()
			send := func(requireID string) int {
				ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+books+"/", nil)
				require.NoError(t, err)
				if requireID != "" {
					req.Header.Set("L5d-Require-Id", requireID)
				}
				if tc.h2 {
					req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/2.0", 2, 0
				}
				resp, err := client.RoundTrip(req)
				require.NoError(t, err)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			require.Equal(t, http.StatusOK, send(""))
			// The endpoint is plaintext: it proves no identity.
			require.Equal(t, http.StatusBadGateway, send(booksID))

			ep := `target_addr="` + addr.String() + `"`
			assert.Equal(t, "1", m.Value(t, "request_total", `direction="outbound"`, ep), "%v", m.Lines(t, "request_total"))
			assert.Equal(t, "1", m.Value(t, "response_total", `direction="outbound"`, ep), "%v", m.Lines(t, "response_total"))
			assert.Equal(t, "1", m.Value(t, "response_latency_ms_count", `direction="outbound"`, ep), "%v", m.Lines(t, "response_latency_ms_count"))
			assert.Empty(t, m.Lines(t, "response_total", `status_code="502"`), "the refusal")
		})
	}
}
