package authz_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/policy"
)

// A Server that admits the web service's mesh identity to /api, and
// nobody else but the pod itself.
func Example() {
	srv := &authz.Server{
		Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-http"},
		Routes: []authz.Route{{
			Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPRoute", Name: "books-api"},
			Rules: []authz.Rule{{Matches: []policy.HTTPRouteMatch{{
				Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/api"}}}}},
			Authorizations: []authz.Authz{{
				Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "web"},
				Networks: []authz.Network{{Net: netip.MustParsePrefix("10.0.0.0/8")}},
				Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{
					Identities: []string{"web.default.serviceaccount.identity.linkerd.cluster.local"}}},
			}},
		}},
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "books") })
	h, err := authz.New(app, authz.WithDefault(srv), authz.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	defer h.Close()

	for _, c := range []struct {
		from, path string
		peer       identity.Peer
	}{
		{"10.1.2.3:5000", "/api/books", identity.Peer{TLS: true, ID: "web.default.serviceaccount.identity.linkerd.cluster.local"}},
		{"10.1.2.3:5000", "/api/books", identity.Peer{}},
		{"10.1.2.3:5000", "/metrics", identity.Peer{TLS: true, ID: "web.default.serviceaccount.identity.linkerd.cluster.local"}},
		{"127.0.0.1:5000", "/api/books", identity.Peer{}},
	} {
		req := httptest.NewRequest("GET", "http://books:8080"+c.path, nil)
		req.RemoteAddr = c.from
		ctx := context.WithValue(req.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 8080})
		req = req.WithContext(identity.WithPeer(ctx, c.peer))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		fmt.Println(strings.TrimSpace(fmt.Sprintf("%s %s tls=%v: %d %s", c.from, c.path, c.peer.TLS, w.Code, w.Header().Get("L5d-Proxy-Error"))))
	}
	// Output:
	// 10.1.2.3:5000 /api/books tls=true: 200
	// 10.1.2.3:5000 /api/books tls=false: 403
	// 10.1.2.3:5000 /metrics tls=true: 404 client 10.1.2.3:5000: server: 10.0.0.1:8080: no route found for request
	// 127.0.0.1:5000 /api/books tls=false: 200
}
