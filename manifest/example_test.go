package manifest_test

import (
	"fmt"
	"net/http/httptest"

	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/policy"
)

// A Service and an HTTPRoute whose parent it is, as a Linkerd user keeps
// them, become the outbound policy of the Service's port: its routes, with
// the Service's timeout annotation on each (a request no route matches has
// no route, as with Linkerd once a Service has HTTPRoutes). A bad document
// is an error naming the document and the field.
func ExampleParse() {
	res, err := manifest.Parse([]byte(`
apiVersion: v1
kind: Service
metadata:
  name: books
  namespace: shop
  annotations:
    timeout.linkerd.io/request: 2s
spec:
  ports:
  - port: 7000
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: books-v2, namespace: shop}
spec:
  parentRefs:
  - {kind: Service, group: core, name: books, port: 7000}
  rules:
  - matches:
    - path: {type: PathPrefix, value: /v2}
    backendRefs:
    - {name: books-v2, port: 7000}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	p := res.Policy("shop", "books", 7000)
	table, err := policy.Compile(p, policy.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, path := range []string{"/v2/books/1", "/books/1"} {
		route, _ := table.Select(httptest.NewRequest("GET", "http://books.shop.svc.cluster.local:7000"+path, nil))
		if route == nil {
			fmt.Println(path, "-> no route")
			continue
		}
		fmt.Println(path, "->", route.Meta.Kind, route.Meta.Name, "timeout", route.Timeouts.Request)
	}
	_, err = manifest.Parse([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: books}\nspec: {ports: [{port: 70000}]}\n"))
	fmt.Println(err)
	// Output:
	// /v2/books/1 -> HTTPRoute books-v2 timeout 2s
	// /books/1 -> no route
	// document 1 (Service default/books): spec.ports[0].port: 70000 is not a port (1-65535)
}
