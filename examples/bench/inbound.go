package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/netip"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/policy"
)

// inboundPolicy: a request through the inbound stack under a Server with
// ten authorizations (the one that admits the client last), a route whose
// own authorization is tried first and does not admit the client, and a
// rate limit it never reaches, against the same stack without a policy,
// both on loopback with reused HTTP/1 connections.
func inboundPolicy(o options) (*result, error) {
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	var authzs []authz.Authz
	for i := range 9 {
		authzs = append(authzs, authz.Authz{
			Meta:           authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: fmt.Sprintf("other-%d", i)},
			Networks:       []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}},
			Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{fmt.Sprintf("sa-%d.default.serviceaccount.identity.linkerd.cluster.local", i)}}},
		})
	}
	authzs = append(authzs, authz.Authz{
		Meta:     authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "loopback"},
		Networks: []authz.Network{{Net: netip.MustParsePrefix("127.0.0.0/8")}},
	})
	// One route, GET /, with a route-level authorization of its own (an
	// identity this client does not have), tried before the Server's.
	route := authz.Route{
		Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPRoute", Name: "bench"},
		Rules: []authz.Rule{{Matches: []policy.HTTPRouteMatch{{Method: "GET",
			Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/"}}}}},
		Authorizations: []authz.Authz{{
			Meta:           authz.Meta{Group: "policy.linkerd.io", Kind: "authorizationpolicy", Name: "route-only"},
			Networks:       []authz.Network{{Net: netip.MustParsePrefix("0.0.0.0/0")}},
			Authentication: authz.Authentication{MeshTLS: &authz.MeshTLS{Identities: []string{"web.default.serviceaccount.identity.linkerd.cluster.local"}}},
		}},
	}
	server := &authz.Server{
		Meta:           authz.Meta{Group: "policy.linkerd.io", Kind: "server", Name: "bench"},
		Authorizations: authzs,
		Routes:         []authz.Route{route},
		RateLimit:      &authz.RateLimit{Meta: authz.Meta{Group: "policy.linkerd.io", Kind: "HTTPLocalRateLimitPolicy", Name: "bench"}, Total: 1 << 30},
	}
	plain := mesh.NewServer(ok, mesh.WithMeterProvider(mp), mesh.WithLogger(quiet))
	defer plain.Close()
	plainSrv := serve(origproto.NewServer(plain))
	defer plainSrv.Close()
	// The policy applies to every port of its handler: the listener's
	// port is not known before the Server starts, so the handler's
	// default is the Server.
	policed := mesh.NewServer(ok, mesh.WithMeterProvider(mp), mesh.WithLogger(quiet),
		mesh.WithInboundPolicy(authz.WithDefault(server), authz.WithoutLocalhost()))
	defer policed.Close()
	policedSrv := serve(origproto.NewServer(policed))
	defer policedSrv.Close()

	rt := h1Transport()
	defer rt.CloseIdleConnections()
	n := o.scale(3000, 500)
	run := func(url string) func() (figures, error) {
		return func() (figures, error) { return serial(rt, func() *http.Request { return get(url, "") }, n) }
	}
	// The policy is in force: the loopback authorization admits (200),
	// and the same Server without it denies (403).
	denying := *server
	denying.Authorizations = authzs[:9]
	denied := mesh.NewServer(ok, mesh.WithMeterProvider(mp), mesh.WithLogger(quiet),
		mesh.WithInboundPolicy(authz.WithDefault(&denying), authz.WithoutLocalhost()))
	defer denied.Close()
	deniedSrv := serve(origproto.NewServer(denied))
	defer deniedSrv.Close()
	for url, want := range map[string]int{policedSrv.URL + "/": 200, deniedSrv.URL + "/": 403} {
		resp, err := rt.RoundTrip(get(url, ""))
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			return nil, fmt.Errorf("inbound_policy: %s answered %d, want %d", url, resp.StatusCode, want)
		}
	}
	rs, err := interleave(o.rounds, variant{"no_policy", run(plainSrv.URL + "/")}, variant{"policy", run(policedSrv.URL + "/")})
	if err != nil {
		return nil, err
	}
	const none, pol = 0, 1
	r := &result{
		ratio:     rs.ratio("", atMost(1.05), func(f []figures) float64 { return f[pol].P50 / f[none].P50 }),
		Candidate: rs.median(pol), Baseline: rs.median(none),
		Extra: []ratio{rs.ratio("allocations added per request", atMost(0), func(f []figures) float64 {
			if v := math.Round(f[pol].Allocs - f[none].Allocs); v != 0 {
				return v
			}
			return 0 // not -0
		})},
	}
	r.Note = "ratio = p50 through the inbound stack under a Server of 10 authorizations, a route with a route-level authorization and a rate limit / the same stack without a policy, plaintext HTTP/1 clients on loopback"
	return r, nil
}
