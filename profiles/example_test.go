package profiles_test

import (
	"fmt"

	"github.com/inmesh/inmesh/profiles"
)

func ExampleParseServiceProfiles() {
	sps, err := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: books.default.svc.cluster.local
spec:
  routes:
  - name: GET /books/{id}
    condition:
      method: GET
      pathRegex: /books/[^/]+
    isRetryable: true
    timeout: 300ms
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	p := sps[0].ProfileFor(7000)
	r := p.Routes[0]
	fmt.Println(p.FullyQualifiedName, r.Labels["route"], r.Retryable, r.Timeout, p.RetryBudget.RetryRatio)
	// Output: books.default.svc.cluster.local GET /books/{id} true 300ms 0.2
}

func ExampleTable_Select() {
	table, err := profiles.Compile(&profiles.Profile{Routes: []profiles.Route{
		{Condition: profiles.PathRegex("/books"), Labels: map[string]string{"route": "list"}},
		{Condition: profiles.PathRegex("/books/[^/]+"), Labels: map[string]string{"route": "get"}},
	}}, profiles.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, path := range []string{"/books", "/books/7", "/books/7/reviews"} {
		r := table.SelectPath("GET", path)
		fmt.Printf("%s -> %q default=%v\n", path, r.Labels["route"], r.IsDefault())
	}
	// Output:
	// /books -> "list" default=false
	// /books/7 -> "get" default=false
	// /books/7/reviews -> "" default=true
}
