package mesh

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// meshedServer serves app through a server stack with id on loopback and
// sends what it saw of each request (mTLS, the client's identity, Host)
// to seen.
func meshedServer(t *testing.T, p *pki, id string, seen chan<- string) netip.AddrPort {
	t.Helper()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer, _ := identity.PeerFromContext(r.Context())
		seen <- "tls=" + boolText(peer.TLS) + " client=" + r.Header.Get("L5d-Client-Id") + " host=" + r.Host
	})
	server := NewServer(app, WithIdentity(p.certify(t, id)), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	t.Cleanup(server.Close)
	return serveMeshed(t, server)
}

// serveMeshed serves server's stack (HTTP/1 and h2c, under its listener's
// TLS when it has an identity) on a held loopback port until the end of
// the test.
func serveMeshed(t *testing.T, server *Server) netip.AddrPort {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := origproto.NewServer(server)
	srv.ErrorLog = quietLog
	go srv.Serve(server.Listener(lis))
	t.Cleanup(func() { srv.Close() })
	return netip.MustParseAddrPort(lis.Addr().String())
}

// A policy's forward backend and forward mirror name one endpoint and its
// identity (Linkerd's WeightedAddr with its TLS identity): the request and
// its copy reach it over mTLS with that identity, as a discovered endpoint
// is reached, never through discovery's fallback to the address in
// plaintext (the address is no Service the source knows), with the Host
// the caller sent. An endpoint whose certificate does not carry the
// identity gets nothing.
func TestForwardBackendKeepsItsIdentity(t *testing.T) {
	p := newPKI(t)
	const books = "books.default.svc.cluster.local:7000"
	backendSeen, mirrorSeen := make(chan string, 16), make(chan string, 16)
	backendAddr := meshedServer(t, p, booksID, backendSeen)
	mirrorAddr := meshedServer(t, p, reviewsID, mirrorSeen)
	for _, tc := range []struct {
		name               string
		backendID          string
		want, wantMirrored string
	}{
		{"identities as certified", booksID, "tls=true client=" + webID + " host=" + books, "tls=true client=" + webID + " host=" + books},
		{"backend certified as another", reviewsID, "", "tls=true client=" + webID + " host=" + books},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta := policy.Metadata{Kind: "Service", Namespace: "default", Name: "books-ext", Port: backendAddr.Port()}
			fwd := policy.RouteBackend{Weight: 1, Backend: policy.Backend{Meta: meta,
				Forward: &endpoint.Endpoint{Addr: backendAddr, H2: true, Identity: tc.backendID}}}
			mirror := policy.Mirror{Meta: policy.Metadata{Kind: "Service", Namespace: "default", Name: "shadow"},
				Forward: &endpoint.Endpoint{Addr: mirrorAddr, H2: true, Identity: reviewsID}}
			routes := []policy.HTTPRoute{{Meta: policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "default", Name: "fwd"},
				Rules: []policy.HTTPRule{{Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{fwd}},
					Mirrors: []policy.Mirror{mirror}}}}}
			pols := policy.NewStaticSource(map[string]*policy.Policy{books: {
				Parent:   policy.Metadata{Kind: "Service", Namespace: "default", Name: "books", Port: 7000},
				Protocol: policy.ProtocolDetect,
				HTTP1:    policy.HTTPProtocol{Routes: routes}, HTTP2: policy.HTTPProtocol{Routes: routes},
			}})
			// Discovery knows books, not the forward addresses, and falls
			// back for what it does not know.
			eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {{Addr: backendAddr, H2: true, Identity: booksID}}})
			require.NoError(t, err)
			client := NewClient(WithEndpoints(eps), WithPolicies(pols), WithIdentity(p.certify(t, webID)),
				WithDiscoveryWait(testutil.Timeout), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet),
				WithBalancerOptions(balancer.WithFallback(true)))
			defer client.Close()
			hc := &http.Client{Transport: client, Timeout: testutil.Timeout}

			resp, err := hc.Get("http://" + books + "/")
			if tc.want == "" {
				var idErr *identity.IdentityError
				require.True(t, errors.As(err, &idErr), "%v", err)
				assert.Equal(t, tc.backendID, idErr.Expected)
			} else {
				require.NoError(t, err)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Equal(t, tc.want, receive(t, backendSeen))
			}
			assert.Equal(t, tc.wantMirrored, receive(t, mirrorSeen), "the mirror's copy")
			assert.Empty(t, backendSeen, "nothing else reached the backend")
		})
	}
}

// receive returns the next value of ch, failing the test when none comes
// within testutil.Timeout.
func receive(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(testutil.Timeout):
		t.Fatal("nothing received")
		return ""
	}
}

// A forward backend's endpoint is rewritten by its authority override as a
// discovered endpoint is (Linkerd's forward and balanced endpoints share
// the endpoint stack and its override, linkerd/app/outbound/src/http/
// concrete.rs, Param<Option<AuthorityOverride>> for Endpoint): the Host
// becomes the override and l5d-dst-canonical is removed; without an
// override the request goes as the caller sent it. The server records what
// it got, over HTTP/1 and HTTP/2.
func TestForwardBackendAuthorityOverride(t *testing.T) {
	const (
		books     = "books.default.svc.cluster.local:7000"
		canonical = "L5d-Dst-Canonical"
		override  = "books-west.example.com:7000"
	)
	seen := make(chan string, 8)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Proto + " host=" + r.Host + " canonical=" + strings.Join(r.Header.Values(canonical), ",")
	})
	addr := netip.MustParseAddrPort(testutil.NewServer(t, app).Listener.Addr().String())
	for _, tc := range []struct {
		name     string
		override string
		h2       bool
		want     string
	}{
		{"override, HTTP/1", override, false, "HTTP/1.1 host=" + override + " canonical="},
		{"override, HTTP/2", override, true, "HTTP/2.0 host=" + override + " canonical="},
		{"no override, HTTP/1", "", false, "HTTP/1.1 host=" + books + " canonical=" + books},
		{"no override, HTTP/2", "", true, "HTTP/2.0 host=" + books + " canonical=" + books},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta := policy.Metadata{Kind: "Service", Namespace: "default", Name: "books-ext", Port: addr.Port()}
			fwd := policy.RouteBackend{Weight: 1, Backend: policy.Backend{Meta: meta,
				Forward: &endpoint.Endpoint{Addr: addr, AuthorityOverride: tc.override}}}
			routes := []policy.HTTPRoute{{Meta: policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "default", Name: "fwd"},
				Rules: []policy.HTTPRule{{Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{fwd}}}}}}
			pols := policy.NewStaticSource(map[string]*policy.Policy{books: {
				Parent:   policy.Metadata{Kind: "Service", Namespace: "default", Name: "books", Port: 7000},
				Protocol: policy.ProtocolDetect,
				HTTP1:    policy.HTTPProtocol{Routes: routes}, HTTP2: policy.HTTPProtocol{Routes: routes},
			}})
			eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {{Addr: addr}}})
			require.NoError(t, err)
			client := NewClient(WithEndpoints(eps), WithPolicies(pols), WithDiscoveryWait(testutil.Timeout),
				WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
			defer client.Close()
			hc := &http.Client{Transport: client, Timeout: testutil.Timeout}

			req, err := http.NewRequest(http.MethodGet, "http://"+books+"/", nil)
			require.NoError(t, err)
			req.Header.Set(canonical, books)
			if tc.h2 {
				req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/2.0", 2, 0
			}
			resp, err := hc.Do(req)
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, tc.want, receive(t, seen))
			assert.Equal(t, []string{books}, req.Header.Values(canonical), "the caller's request is unchanged")
		})
	}
}

// The requests to a forward backend's endpoint are recorded with no
// authority label, whatever Host their caller sent, as Linkerd's proxy
// labels them: a forward's concrete target has no authority
// (linkerd/app/outbound/src/http/logical/policy/router.rs, mk_concrete;
// logical.rs for a profile's endpoint), and OutboundEndpointLabels writes
// none without one (linkerd/app/core/src/metrics.rs). A balanced backend's
// endpoint keeps the backend's name.
func TestForwardBackendSeriesHaveNoAuthority(t *testing.T) {
	const (
		books = "books.default.svc.cluster.local:7000"
		shelf = "shelf.default.svc.cluster.local:7000"
	)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	fwdAddr := netip.MustParseAddrPort(testutil.NewServer(t, app).Listener.Addr().String())
	balancedAddr := netip.MustParseAddrPort(testutil.NewServer(t, app).Listener.Addr().String())
	meta := policy.Metadata{Kind: "Service", Namespace: "default", Name: "books-ext", Port: fwdAddr.Port()}
	fwd := policy.RouteBackend{Weight: 1, Backend: policy.Backend{Meta: meta, Forward: &endpoint.Endpoint{Addr: fwdAddr}}}
	routes := []policy.HTTPRoute{{Meta: policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "default", Name: "fwd"},
		Rules: []policy.HTTPRule{{Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{fwd}}}}}}
	pols := policy.NewStaticSource(map[string]*policy.Policy{books: {
		Parent:   policy.Metadata{Kind: "Service", Namespace: "default", Name: "books", Port: 7000},
		Protocol: policy.ProtocolDetect,
		HTTP1:    policy.HTTPProtocol{Routes: routes}, HTTP2: policy.HTTPProtocol{Routes: routes},
	}})
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {{Addr: fwdAddr}}, shelf: {{Addr: balancedAddr}}})
	require.NoError(t, err)
	m := testutil.NewMetrics(t)
	client := NewClient(WithEndpoints(eps), WithPolicies(pols), WithDiscoveryWait(testutil.Timeout),
		WithMeterProvider(m.Provider), WithLogger(quiet))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: testutil.Timeout}
	for _, url := range []string{"http://" + books + "/", "http://" + books + "/", "http://" + shelf + "/"} {
		resp, err := hc.Get(url)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, url)
	}

	for _, family := range []string{"request_total", "response_total"} {
		lines := m.Lines(t, family, `direction="outbound"`, `target_addr="`+fwdAddr.String()+`"`)
		require.Len(t, lines, 1, "%s: %v", family, m.Lines(t, family))
		assert.NotContains(t, lines[0], "authority=", "%s of the forward backend", family)
		assert.True(t, strings.HasSuffix(lines[0], " 2"), "%s: %s", family, lines[0])
		assert.Equal(t, "1", m.Value(t, family, `direction="outbound"`, `authority="`+shelf+`"`, `target_addr="`+balancedAddr.String()+`"`),
			"%s of the balanced backend: %v", family, m.Lines(t, family))
	}
}
