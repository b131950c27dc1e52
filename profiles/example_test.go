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
