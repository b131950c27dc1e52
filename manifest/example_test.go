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

// A Pod, a Server selecting its port by name and an AuthorizationPolicy
// requiring a ServiceAccount become the inbound policy of the pod's port;
// a port no Server selects gets the default policy.
func ExampleResources_InboundServer() {
	res, err := manifest.Parse([]byte(`
apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: shop, labels: {app: books}}
spec:
  containers:
  - name: books
    ports: [{name: http, containerPort: 7000}]
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: books-http, namespace: shop}
spec:
  podSelector: {matchLabels: {app: books}}
  port: http
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: books-from-web, namespace: shop}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books-http}
  requiredAuthenticationRefs: [{kind: ServiceAccount, name: web}]
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv, err := res.InboundServer("shop", "books-0", 7000, manifest.InboundOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(srv.Meta.Kind, srv.Meta.Name, srv.Routes[0].Meta.Name)
	for _, a := range srv.Authorizations {
		fmt.Println(a.Meta.Name, a.Authentication.MeshTLS.Identities)
	}
	other, _ := res.InboundServer("shop", "books-0", 9090, manifest.InboundOptions{})
	fmt.Println(other.Meta.Kind, other.Meta.Name)
	// Output:
	// server books-http default
	// books-from-web [web.shop.serviceaccount.identity.linkerd.cluster.local]
	// default all-unauthenticated
}
