package mesh

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// hostDocs are the manifests of TestAppGetsTheHostItsCallerSent: front's
// HTTPRoute sends to back; books' ServiceProfile overrides it to authors;
// shelf has a clusterIP and a ServiceProfile with a route, so that a
// request to the clusterIP is balanced over shelf's name; stacks has a
// clusterIP and a ServiceProfile that overrides it to authors; gate's
// HTTPRoute sends to pinned, whose endpoint carries an authority override.
// Only back, authors, shelf and pinned have endpoints.
var hostDocs = []string{
	fmt.Sprintf(serviceDoc, "front"), fmt.Sprintf(serviceDoc, "back"), routeDoc("front", "back"),
	fmt.Sprintf(serviceDoc, "books"), fmt.Sprintf(serviceDoc, "authors"),
	"apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: books.default.svc.cluster.local, namespace: default}\n" +
		"spec:\n  dstOverrides: [{authority: \"" + svcName("authors") + "\", weight: 100}]\n",
	"apiVersion: v1\nkind: Service\nmetadata: {name: shelf, namespace: default}\nspec: {clusterIP: 127.0.0.77, ports: [{port: 80}]}\n",
	"apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: shelf.default.svc.cluster.local, namespace: default}\n" +
		"spec:\n  routes: [{name: all, condition: {pathRegex: '/.*'}}]\n",
	"apiVersion: v1\nkind: Service\nmetadata: {name: stacks, namespace: default}\nspec: {clusterIP: 127.0.0.78, ports: [{port: 80}]}\n",
	"apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: stacks.default.svc.cluster.local, namespace: default}\n" +
		"spec:\n  dstOverrides: [{authority: \"" + svcName("authors") + "\", weight: 100}]\n",
	fmt.Sprintf(serviceDoc, "gate"), fmt.Sprintf(serviceDoc, "pinned"), routeDoc("gate", "pinned"),
}

const pinnedAuthority = "pinned.example.com:8080"

// The application behind the mesh gets the Host its caller sent, whatever
// name the stack routed the request to, as Linkerd's proxy leaves a
// request's authority as its application sent it: its logical and
// concrete stacks set none (linkerd/app/outbound/src/http/logical.rs,
// logical/profile.rs, logical/policy/router.rs), and only an endpoint's
// authority_override replaces it (linkerd/app/outbound/src/http/endpoint.rs,
// NewOverrideAuthority). Each protocol row is a fresh client of one
// embedded control plane; each route row is that client's first request to
// its name.
func TestAppGetsTheHostItsCallerSent(t *testing.T) {
	for _, proto := range []struct {
		name   string
		meshed bool // the app is behind a server stack, a mesh peer
		h2     bool // the caller sends HTTP/2 (prior knowledge)
		want   string
	}{
		{"HTTP/1 to a plain server", false, false, "HTTP/1.1"},
		{"HTTP/1 upgraded between mesh peers", true, false, "HTTP/1.1"},
		{"HTTP/2 between mesh peers", true, true, "HTTP/2.0"},
	} {
		t.Run(proto.name, func(t *testing.T) {
			seen := make(chan string, 8)
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen <- r.Proto + " " + r.Host })
			var addr netip.AddrPort
			if proto.meshed {
				server := NewServer(app, WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
				t.Cleanup(server.Close)
				addr = serveMeshed(t, server)
			} else {
				addr = netip.MustParseAddrPort(testutil.NewServer(t, app).Listener.Addr().String())
			}
			ep := endpoint.Endpoint{Addr: addr, Weight: endpoint.DefaultWeight, H2: proto.meshed}
			pinned := ep
			pinned.AuthorityOverride = pinnedAuthority
			cp := startControlPlane(t)
			res, err := manifest.Parse([]byte(strings.Join(hostDocs, "---\n")))
			require.NoError(t, err)
			cp.store.SetManifests(res)
			cp.store.SetServiceProfiles(res.ServiceProfiles)
			cp.store.SetEndpoints(map[string][]endpoint.Endpoint{
				svcName("back"): {ep}, svcName("authors"): {ep}, svcName("shelf"): {ep}, svcName("pinned"): {pinned},
			})
			m := testutil.NewMetrics(t)
			client := loopbackClient(t, dialLoopback(t, cp.addr), nil, WithMeterProvider(m.Provider))
			hc := &http.Client{Transport: client, Timeout: testutil.Timeout}

			for _, tc := range []struct {
				name string
				url  string
				host string // the Host the caller sets; "": the URL's
				want string
			}{
				{"an HTTPRoute's backend of another name", "http://front.default.svc.cluster.local/", "", "front.default.svc.cluster.local"},
				{"a Host the caller set, to an HTTPRoute's backend", "http://127.0.0.1:1/", "Front.Default.svc.cluster.local:80", "Front.Default.svc.cluster.local:80"},
				{"a ServiceProfile's dstOverrides to another name", "http://books.default.svc.cluster.local/", "", "books.default.svc.cluster.local"},
				{"a clusterIP balanced over its ServiceProfile's name", "http://127.0.0.77/", "", "127.0.0.77"},
				{"a clusterIP whose ServiceProfile's dstOverrides name another", "http://127.0.0.78/", "", "127.0.0.78"},
				{"an endpoint with an authority override", "http://gate.default.svc.cluster.local/", "", pinnedAuthority},
			} {
				t.Run(tc.name, func(t *testing.T) {
					get := func() (int, string) {
						req, err := http.NewRequest(http.MethodGet, tc.url, nil)
						require.NoError(t, err)
						if tc.host != "" {
							req.Host = tc.host
						}
						if proto.h2 {
							req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/2.0", 2, 0
						}
						resp, err := hc.Do(req)
						require.NoError(t, err)
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						return resp.StatusCode, string(body)
					}
					code, body := get()
					require.Equal(t, http.StatusOK, code, "%s", body)
					assert.Equal(t, proto.want+" "+tc.want, receive(t, seen))
				})
			}
			// The request metrics are labelled by the backend, Linkerd's
			// concrete authority (linkerd/app/outbound/src/http/concrete.rs,
			// OutboundEndpointLabels), not by the Host.
			for name, want := range map[string]string{"back": "2", "shelf": "1", "pinned": "1"} {
				assert.Equal(t, want, m.Value(t, "response_total", `direction="outbound"`, `authority="`+svcName(name)+`"`),
					"%s: %v", name, m.Lines(t, "response_total"))
			}
		})
	}
}

// An endpoint's authority override replaces the request's Host and removes
// its l5d-dst-canonical, as Linkerd's proxy rewrites a request for such an
// endpoint (linkerd/app/outbound/src/http/endpoint.rs: NewOverrideAuthority
// strips "host" and l5d-dst-canonical, linkerd/http/override-authority);
// a request to an endpoint without one keeps both. The server records
// what it got, over HTTP/1, HTTP/2 from an HTTP/2 caller, and HTTP/2 by
// orig-proto's upgrade; the caller's own header is left as it was.
func TestAuthorityOverrideRemovesCanonicalDst(t *testing.T) {
	const canonical = "L5d-Dst-Canonical"
	for _, proto := range []struct {
		name     string
		h2       bool // the caller sends HTTP/2 (prior knowledge)
		upgraded bool // the endpoints take HTTP/2, so HTTP/1 is upgraded
		want     string
	}{
		{"HTTP/1", false, false, "HTTP/1.1"},
		{"HTTP/2", true, false, "HTTP/2.0"},
		{"HTTP/1 upgraded to HTTP/2", false, true, "HTTP/2.0"},
	} {
		t.Run(proto.name, func(t *testing.T) {
			seen := make(chan string, 8)
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seen <- r.Proto + " host=" + r.Host + " canonical=" + strings.Join(r.Header.Values(canonical), ",")
			})
			addr := netip.MustParseAddrPort(testutil.NewServer(t, app).Listener.Addr().String())
			ep := endpoint.Endpoint{Addr: addr, Weight: endpoint.DefaultWeight, H2: proto.upgraded}
			pinned := ep
			pinned.AuthorityOverride = pinnedAuthority
			cp := startControlPlane(t)
			res, err := manifest.Parse([]byte(strings.Join(hostDocs, "---\n")))
			require.NoError(t, err)
			cp.store.SetManifests(res)
			cp.store.SetServiceProfiles(res.ServiceProfiles)
			cp.store.SetEndpoints(map[string][]endpoint.Endpoint{svcName("back"): {ep}, svcName("pinned"): {pinned}})
			hc := &http.Client{Transport: loopbackClient(t, dialLoopback(t, cp.addr), nil), Timeout: testutil.Timeout}

			for _, tc := range []struct {
				name string
				url  string
				want string
			}{
				{"an endpoint with an authority override", "http://gate.default.svc.cluster.local/",
					"host=" + pinnedAuthority + " canonical="},
				{"an endpoint without one", "http://front.default.svc.cluster.local/",
					"host=front.default.svc.cluster.local canonical=front.default.svc.cluster.local:80"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					req, err := http.NewRequest(http.MethodGet, tc.url, nil)
					require.NoError(t, err)
					req.Header.Set(canonical, "front.default.svc.cluster.local:80")
					if proto.h2 {
						req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/2.0", 2, 0
					}
					resp, err := hc.Do(req)
					require.NoError(t, err)
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
					assert.Equal(t, proto.want+" "+tc.want, receive(t, seen))
					assert.Equal(t, []string{"front.default.svc.cluster.local:80"}, req.Header.Values(canonical),
						"the caller's request is unchanged")
				})
			}
		})
	}
}
