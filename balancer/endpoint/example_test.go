package endpoint_test

import (
	"fmt"
	"net/netip"

	"github.com/inmesh/inmesh/balancer/endpoint"
)

// An endpoint set as a source publishes it: each endpoint's share of
// traffic is its weight over the set's total.
func ExampleSet() {
	set := endpoint.Set{Exists: true, Endpoints: []endpoint.Endpoint{
		{Addr: netip.MustParseAddrPort("10.0.0.1:7000"), Weight: endpoint.DefaultWeight, H2: true,
			Labels:   map[string]string{"pod": "books-0"},
			Identity: "books.default.serviceaccount.identity.linkerd.cluster.local"},
		{Addr: netip.MustParseAddrPort("10.0.0.2:7000"), Weight: endpoint.DefaultWeight / 3,
			Labels: map[string]string{"pod": "books-1"}},
	}}
	var total uint32
	for _, e := range set.Endpoints {
		total += e.Weight
	}
	for _, e := range set.Endpoints {
		mtls := "no identity: plaintext"
		if e.Identity != "" {
			mtls = "mTLS to " + e.Identity
		}
		fmt.Printf("%s pod=%s share=%.0f%% h2=%v %s\n", e.Addr, e.Labels["pod"], 100*float64(e.Weight)/float64(total), e.H2, mtls)
	}
	// Output:
	// 10.0.0.1:7000 pod=books-0 share=75% h2=true mTLS to books.default.serviceaccount.identity.linkerd.cluster.local
	// 10.0.0.2:7000 pod=books-1 share=25% h2=false no identity: plaintext
}

// What a consumer of an endpoints watch does with each Update: an error
// keeps what it had, a service that does not exist may fall back to the
// authority's own address, and an existing service without endpoints
// fails requests fast.
func ExampleUpdate() {
	describe := func(u endpoint.Update) string {
		switch {
		case u.Err != nil:
			return "no set: " + u.Err.Error()
		case !u.Set.Exists:
			return "unknown to the source: send to the authority's own address"
		case len(u.Set.Endpoints) == 0:
			return "no endpoints now: fail fast"
		}
		return fmt.Sprintf("%d endpoint(s)", len(u.Set.Endpoints))
	}
	for _, u := range []endpoint.Update{
		{Set: &endpoint.Set{Exists: true, Endpoints: []endpoint.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:7000")}}}},
		{Set: &endpoint.Set{Exists: true}},
		{Set: &endpoint.Set{Exists: false}},
		{Err: fmt.Errorf("too many authorities watched")},
	} {
		fmt.Println(describe(u))
	}
	// Output:
	// 1 endpoint(s)
	// no endpoints now: fail fast
	// unknown to the source: send to the authority's own address
	// no set: too many authorities watched
}

// A traffic split's shares: each target's weight over DefaultWeight,
// which is 100%.
func ExampleWeightedDst() {
	split := []endpoint.WeightedDst{
		{Authority: "books-v1.default.svc.cluster.local:7000", Weight: endpoint.DefaultWeight * 9 / 10},
		{Authority: "books-v2.default.svc.cluster.local:7000", Weight: endpoint.DefaultWeight / 10},
	}
	for _, d := range split {
		fmt.Printf("%s %d%%\n", d.Authority, 100*d.Weight/endpoint.DefaultWeight)
	}
	// Output:
	// books-v1.default.svc.cluster.local:7000 90%
	// books-v2.default.svc.cluster.local:7000 10%
}
