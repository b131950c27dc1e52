package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/router"
)

// mirrorBench: serial requests through the router to a loopback upstream
// on a route that mirrors every request to a backend taking 2 s, a route
// that mirrors every request to a backend that is down, and a route
// without a mirror. The headline is the primary's p50 with the slow mirror
// over its p50 without (issue 30 acceptance 4: at most 1.05); the dead
// mirror's ratio and the primary's failures are extra figures.
func mirrorBench(o options) (*result, error) {
	const authority = "web.default.svc.cluster.local:80"
	app := serve(&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})})
	defer app.Close()
	var mirrored atomic.Int64
	slow := serve(&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mirrored.Add(1)
		select {
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
		}
	})})
	defer slow.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	deadAddr := l.Addr().String()
	l.Close()

	fwd := func(addr, name string) (policy.Backend, *endpoint.Endpoint) {
		ap := netip.MustParseAddrPort(addr)
		ep := &endpoint.Endpoint{Addr: ap}
		return policy.Backend{Meta: policy.Metadata{Kind: "Service", Name: name, Port: ap.Port()}, Forward: ep}, ep
	}
	primary, _ := fwd(app.addr(), "web")
	_, slowEP := fwd(slow.addr(), "slow")
	_, deadEP := fwd(deadAddr, "dead")
	rule := func(path string, mirrors ...policy.Mirror) policy.HTTPRule {
		return policy.HTTPRule{
			Matches:  []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: path}}},
			Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{Backend: primary}}},
			Mirrors:  mirrors,
		}
	}
	routes := []policy.HTTPRoute{{Meta: policy.Metadata{Kind: "HTTPRoute", Name: "web"}, Rules: []policy.HTTPRule{
		rule("/plain"),
		rule("/slow", policy.Mirror{Meta: policy.Metadata{Kind: "Service", Name: "slow"}, Forward: slowEP}),
		rule("/dead", policy.Mirror{Meta: policy.Metadata{Kind: "Service", Name: "dead"}, Forward: deadEP}),
	}}}
	src := policy.NewStaticSource(map[string]*policy.Policy{authority: {Protocol: policy.ProtocolDetect,
		HTTP1: policy.HTTPProtocol{Routes: routes}, HTTP2: policy.HTTPProtocol{Routes: routes}}})
	r := router.New(router.WithPolicies(src))
	defer r.Close()
	tr := h1Transport()
	defer tr.CloseIdleConnections()
	rt := r.Transport(tr)
	deadline := time.Now().Add(10 * time.Second)
	for r.Explain(get("http://"+authority+"/slow", "")).Mirrors == nil {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("mirror: the policy never applied")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var failures atomic.Int64
	n := o.scale(4000, 1000)
	run := func(path string) func() (figures, error) {
		return func() (figures, error) {
			ok := roundTripFunc(func(req *http.Request) (*http.Response, error) {
				resp, err := rt.RoundTrip(req)
				if err == nil && resp.StatusCode != 200 {
					failures.Add(1)
				}
				return resp, err
			})
			return serial(ok, func() *http.Request { return get("http://"+authority+path, "") }, n)
		}
	}
	rs, err := interleave(o.rounds, variant{"plain", run("/plain")}, variant{"slow_mirror", run("/slow")}, variant{"dead_mirror", run("/dead")})
	if err != nil {
		return nil, err
	}
	if f := failures.Load(); f > 0 {
		return nil, fmt.Errorf("mirror: %d primary requests failed", f)
	}
	res := &result{
		ratio:     rs.ratio("", atMost(1.05), func(f []figures) float64 { return f[1].P50 / f[0].P50 }),
		Candidate: rs.median(1),
		Baseline:  rs.median(0),
		Others:    map[string]figures{"dead_mirror": *rs.median(2)},
		Extra:     []ratio{rs.ratio("p50 dead mirror / no mirror", atMost(1.05), func(f []figures) float64 { return f[2].P50 / f[0].P50 })},
	}
	res.Note = fmt.Sprintf("ratio = primary p50 mirroring every request to a backend taking 2 s / p50 without a mirror (serial, loopback); primary failures: 0; copies that reached the slow mirror: %d (at most %d in flight per route, the rest dropped)",
		mirrored.Load(), router.DefaultMirrorInFlight)
	return res, nil
}
