package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"go.opentelemetry.io/otel/metric"
)

// adminAuthority is the books peer's admin port, under an inbound policy.
const adminAuthority = "admin.default.svc.cluster.local:9990"

// adminServer is the inbound policy of the admin port, as the manifests
// of a Server, an AuthorizationPolicy with a MeshTLSAuthentication naming
// web, and an HTTPLocalRateLimitPolicy of 5 requests a second make it.
var adminServer = &authz.Server{
	Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "books-admin"},
	Protocol: authz.ProtocolDetect,
	Authorizations: []authz.Authz{{
		Meta:           authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "admin-from-web"},
		Networks:       []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}, {Net: netip.MustParsePrefix("::/0")}},
		Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{webID}}},
	}},
	RateLimit: &authz.RateLimit{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPLocalRateLimitPolicy", Name: "books-admin"}, Total: 5},
}

// startAdmin serves the admin port of the books peer, its inbound policy
// enforced (without the localhost authorization: every peer of the demo
// is on the loopback).
func startAdmin(local *identity.Local, mp metric.MeterProvider, log *slog.Logger) (addr netip.AddrPort, stop func(), err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	addr = netip.MustParseAddrPort(lis.Addr().String())
	srv := mesh.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "admin") }),
		mesh.WithIdentity(local), mesh.WithMeterProvider(mp), mesh.WithLogger(log),
		mesh.WithInboundPolicy(authz.WithSource(authz.StaticSource{addr.Port(): adminServer}), authz.WithoutLocalhost()))
	hs := origproto.NewServer(srv)
	go hs.Serve(srv.Listener(lis))
	return addr, func() { hs.Close(); srv.Close() }, nil
}

// tryAdmin sends n requests to the admin port and counts the statuses.
func tryAdmin(hc *http.Client, n int) map[int]int {
	counts := map[int]int{}
	for range n {
		resp, err := hc.Get("http://" + adminAuthority + "/")
		if err != nil {
			counts[0]++
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		counts[resp.StatusCode]++
	}
	return counts
}

func printAdmin(out io.Writer, web, reviews map[int]int) {
	fmt.Fprintf(out, "inbound policy on the admin port (only %s, 5 requests a second):\n", webID)
	fmt.Fprintf(out, "  web:     %d allowed, %d limited (429)\n", web[200], web[429])
	fmt.Fprintf(out, "  reviews: %d denied (403)\n", reviews[403])
}
