package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/router"
)

// hedgeTail: three endpoints; every 20th request (5%) stalls 100 ms on the
// endpoint its first attempt reaches. The same requests, one after the
// other, on a route without hedging and on one hedging after 10 ms (share
// 10%). The figure is the p99 with hedging over the p99 without (goal: at
// most a quarter); the extra load is noted.
func hedgeTail(o options) (*result, error) {
	const stall = 100 * time.Millisecond
	var mu sync.Mutex
	seen := map[string]int{}
	var served atomic.Int64
	var eps []endpoint.Endpoint
	for range 3 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			served.Add(1)
			id := r.Header.Get("X-Request-Id")
			mu.Lock()
			seen[id]++
			first := seen[id] == 1
			mu.Unlock()
			if first && r.Header.Get("X-Stall") != "" {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(stall):
				}
			}
			_, _ = w.Write([]byte("ok"))
		}))
		defer srv.Close()
		eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://")), Weight: endpoint.DefaultWeight})
	}
	const backend = "backend.bench:80"
	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{backend: eps})
	if err != nil {
		return nil, err
	}
	bal := balancer.New(src)
	defer bal.Close()
	meta := policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "svc", Port: 80}
	pol := func(h *hedge.Policy) *policy.Policy {
		b := policy.Backend{Meta: meta, Balancer: &policy.Balancer{Authority: backend}}
		routes := []policy.HTTPRoute{{Meta: policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "ns", Name: "r"},
			Rules: []policy.HTTPRule{{Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable,
				Backends: []policy.RouteBackend{{Backend: b, Weight: 1}}}, Hedge: h}}}}
		return &policy.Policy{Parent: meta, Protocol: policy.ProtocolHTTP1, HTTP1: policy.HTTPProtocol{Routes: routes}}
	}
	const plainHost, hedgedHost = "plain.bench:80", "hedged.bench:80"
	share := 0.10
	pols := policy.NewStaticSource(map[string]*policy.Policy{plainHost: pol(nil),
		hedgedHost: pol(&hedge.Policy{Delay: 10 * time.Millisecond, MaxExtraLoad: share})})
	rtr := router.New(router.WithPolicies(pols), router.WithBalancer(bal))
	defer rtr.Close()
	rt := rtr.Transport(bal.Transport(nil))
	for _, h := range []string{plainHost, hedgedHost} {
		deadline := time.Now().Add(10 * time.Second)
		for rtr.Explain(get("http://"+h+"/", "")).Model != router.ModelPolicy {
			if time.Now().After(deadline) {
				return nil, errors.New("hedge_tail: the policy never arrived")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	var n atomic.Int64
	request := func(host string) func() *http.Request {
		return func() *http.Request {
			i := n.Add(1)
			req := get("http://"+host+"/", "")
			req.Header.Set("X-Request-Id", fmt.Sprint(i))
			if i%20 == 0 {
				req.Header.Set("X-Stall", "1")
			}
			return req
		}
	}
	size := o.scale(600, 200)
	var sentHedged, extra atomic.Int64
	rs, err := interleave(o.roundsAtMost(5),
		variant{"hedged", func() (figures, error) {
			before := served.Load()
			f, err := serial(rt, request(hedgedHost), size)
			sentHedged.Add(int64(sized(size)))
			extra.Add(served.Load() - before - int64(sized(size)))
			return f, err
		}},
		variant{"plain", func() (figures, error) { return serial(rt, request(plainHost), size) }})
	if err != nil {
		return nil, err
	}
	r := &result{
		ratio:     rs.ratio("", atMost(0.25), func(f []figures) float64 { return f[0].P99 / f[1].P99 }),
		Candidate: rs.median(0), Baseline: rs.median(1),
	}
	load := 0.0
	if s := sentHedged.Load(); s > 0 {
		load = float64(extra.Load()) / float64(s)
	}
	r.Note = fmt.Sprintf("ratio = p99 hedged (10 ms, share 10%%) / p99 unhedged; 3 endpoints, 5%% of requests stall 100 ms on their first endpoint; extra load %.1f%%", 100*load)
	return r, nil
}
