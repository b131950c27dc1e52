package policy_test

import (
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/inmesh/inmesh/policy"
)

func ExampleCompile() {
	books := policy.Backend{
		Meta:     policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "books", Port: 8080},
		Balancer: &policy.Balancer{Authority: "books.ns.svc.cluster.local:8080"},
	}
	p := &policy.Policy{
		Parent: books.Meta,
		HTTP1: policy.HTTPProtocol{Routes: []policy.HTTPRoute{{
			Meta: policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "ns", Name: "books"},
			Rules: []policy.HTTPRule{
				{
					Matches:  []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/books"}}},
					Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{Backend: books}}},
					Timeouts: policy.Timeouts{Request: 2 * time.Second},
					Retry:    &policy.Retry{StatusRanges: []policy.StatusRange{{Start: 500, End: 599}}},
				},
				{
					// Longer than the prefix /books: this rule wins for its path
					// although it comes second.
					Matches:  []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathRegex, Value: "/books/[0-9]+"}, Method: "GET"}},
					Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{Backend: books}}},
				},
			},
		}}},
	}
	table, err := policy.Compile(p, policy.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, target := range []string{"/books", "/books/12", "/authors"} {
		route, match := table.Select(httptest.NewRequest("GET", "http://books.ns.svc.cluster.local:8080"+target, nil))
		if route == nil {
			fmt.Println(target, "-> no route")
			continue
		}
		fmt.Println(target, "->", route.Meta.Name, "rule", route.RuleIndex, match.Path, match.PathLen, route.Timeouts.Request, route.Retry != nil)
	}
	// Output:
	// /books -> books rule 0 prefix 6 2s true
	// /books/12 -> books rule 1 regex 9 0s false
	// /authors -> no route
}
