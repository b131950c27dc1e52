package manifest

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// indexYAML is a namespace of Services, routes (one naming two Services,
// one naming its Service twice), Pods and Servers for the lookups by name.
const indexYAML = `
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec: {selector: {app: books}, ports: [{name: http, port: 7000}]}
---
apiVersion: v1
kind: Service
metadata: {name: authors, namespace: default}
spec: {ports: [{name: http, port: 7001}]}
---
apiVersion: v1
kind: Service
metadata: {name: books, namespace: shop}
spec: {ports: [{name: http, port: 7000}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: both, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}, {kind: Service, group: core, name: authors}]
  rules: [{matches: [{path: {type: PathPrefix, value: /both}}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: twice, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}, {kind: Service, group: core, name: books}]
  rules: [{matches: [{path: {type: PathPrefix, value: /twice}}]}]
---
apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: default, labels: {app: books}}
spec: {serviceAccountName: books, containers: [{name: books, ports: [{name: http, containerPort: 7000}]}]}
---
apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: shop, labels: {app: books}}
spec: {serviceAccountName: shop-books, containers: [{name: books}]}
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: books-http, namespace: default}
spec: {podSelector: {matchLabels: {app: books}}, port: http, proxyProtocol: HTTP/1}
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: books-http, namespace: shop}
spec: {podSelector: {matchLabels: {app: books}}, port: 7000, proxyProtocol: gRPC}
`

// moreYAML adds a Service, a route to it and a Pod it selects, and for
// the Server books-http of default and shop, of the same name, an
// HTTPRoute, AuthorizationPolicies with their authentications and a rate
// limit in default.
const moreYAML = `
apiVersion: policy.linkerd.io/v1beta3
kind: HTTPRoute
metadata: {name: books-inbound, namespace: default}
spec:
  parentRefs: [{group: policy.linkerd.io, kind: Server, name: books-http}]
  rules: [{matches: [{path: {type: Exact, value: /books}}]}]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: NetworkAuthentication
metadata: {name: cluster, namespace: default}
spec: {networks: [{cidr: 10.0.0.0/8}]}
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: web, namespace: default}
spec: {identities: [web.default.serviceaccount.identity.linkerd.cluster.local]}
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: books-web, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books-http}
  requiredAuthenticationRefs:
  - {group: policy.linkerd.io, kind: NetworkAuthentication, name: cluster}
  - {group: policy.linkerd.io, kind: MeshTLSAuthentication, name: web}
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: route-web, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: HTTPRoute, name: books-inbound}
  requiredAuthenticationRefs: [{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: web}]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: HTTPLocalRateLimitPolicy
metadata: {name: books-limit, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books-http}
  total: {requestsPerSecond: 100}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: default}
spec: {selector: {app: reviews}, ports: [{name: http, port: 9000}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: reviews, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: reviews}]
  rules: [{matches: [{path: {type: PathPrefix, value: /reviews}}]}]
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-0, namespace: default, labels: {app: reviews}}
spec: {serviceAccountName: reviews, containers: [{name: reviews}]}
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: reviews-http, namespace: default}
spec: {podSelector: {matchLabels: {app: reviews}}, port: 9000, proxyProtocol: HTTP/2}
`

func loadIndexYAML(t *testing.T, files ...File) *Resources {
	t.Helper()
	r, err := LoadFiles(files...)
	require.NoError(t, err)
	return r
}

// lookupAnswers are the answers of r's lookups by name (Service, Pod,
// the policy of a Service port, the Server of a pod port and the
// identities that may register a Service) for the names of indexYAML and
// moreYAML, and for names that neither holds.
func lookupAnswers(r *Resources) map[string]any {
	out := make(map[string]any)
	for _, ns := range []string{"default", "shop", "other"} {
		for _, name := range []string{"books", "authors", "reviews", "nobody"} {
			k := ns + "/" + name
			out["service "+k] = r.Service(ns, name)
			out["registration "+k] = r.RegistrationIdentities(ns, name, InboundOptions{})
			for _, port := range []uint16{7000, 7001, 9000} {
				out["policy "+k+":"+strconv.Itoa(int(port))] = r.PolicyFrom("default", ns, name, port)
			}
		}
		for _, pod := range []string{"books-0", "reviews-0", "nobody"} {
			k := ns + "/" + pod
			out["pod "+k] = r.Pod(ns, pod)
			for _, port := range []uint16{7000, 9000} {
				srv, err := r.InboundServer(ns, pod, port, InboundOptions{})
				if err != nil {
					out["inbound "+k+":"+strconv.Itoa(int(port))] = err.Error()
				} else {
					out["inbound "+k+":"+strconv.Itoa(int(port))] = srv
				}
			}
		}
	}
	return out
}

// The lookups by name answer from an index of the Resources what a scan of
// its resources finds, and a Resources changed by replacing its slices
// after a lookup (a resource added or taken away) answers as one loaded
// with its new content: the index never answers for resources that are
// gone, nor misses new ones. A route whose parentRefs name two Services
// applies to both, and one that names its Service twice applies once.
func TestLookupsByNameFollowTheResources(t *testing.T) {
	indexFile, moreFile := File{Name: "index.yaml", Data: []byte(indexYAML)}, File{Name: "more.yaml", Data: []byte(moreYAML)}
	r := loadIndexYAML(t, indexFile)

	for _, tc := range []struct {
		ns, name   string
		port       uint16
		wantRoutes []string
	}{
		{"default", "books", 7000, []string{"both", "twice"}},
		{"default", "authors", 7001, []string{"both"}},
		{"shop", "books", 7000, []string{"http"}}, // the default route
	} {
		var got []string
		for _, route := range r.PolicyFrom(tc.ns, tc.ns, tc.name, tc.port).HTTP1.Routes {
			got = append(got, route.Meta.Name)
		}
		assert.Equal(t, tc.wantRoutes, got, "routes of %s/%s:%d", tc.ns, tc.name, tc.port)
	}
	assert.Equal(t, []string{"books.default.serviceaccount.identity.linkerd.cluster.local"},
		r.RegistrationIdentities("default", "books", InboundOptions{}), "the Pods of its namespace it selects")
	for _, ns := range []string{"default", "shop", "other"} {
		for _, name := range []string{"books", "authors", "books-0", "nobody"} {
			var svc *Service
			for _, s := range r.Services {
				if s.Namespace == ns && s.Name == name {
					svc = s
					break
				}
			}
			assert.Same(t, svc, r.Service(ns, name), "Service %s/%s", ns, name)
			var pod *Pod
			for _, p := range r.Pods {
				if p.Namespace == ns && p.Name == name {
					pod = p
					break
				}
			}
			assert.Same(t, pod, r.Pod(ns, name), "Pod %s/%s", ns, name)
		}
	}

	more := loadIndexYAML(t, moreFile)
	both := loadIndexYAML(t, indexFile, moreFile)
	lookupAnswers(r) // the index is in use before the changes below
	r.Services = append(r.Services, more.Services...)
	r.HTTPRoutes = append(r.HTTPRoutes, more.HTTPRoutes...)
	r.Pods = append(r.Pods, more.Pods...)
	r.Servers = append(r.Servers, more.Servers...)
	r.AuthorizationPolicies = append(r.AuthorizationPolicies, more.AuthorizationPolicies...)
	r.MeshTLSAuthentications = append(r.MeshTLSAuthentications, more.MeshTLSAuthentications...)
	r.NetworkAuthentications = append(r.NetworkAuthentications, more.NetworkAuthentications...)
	r.HTTPLocalRateLimitPolicies = append(r.HTTPLocalRateLimitPolicies, more.HTTPLocalRateLimitPolicies...)
	r.sort()
	srv, err := r.InboundServer("default", "books-0", 7000, InboundOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"books-inbound"}, []string{srv.Routes[0].Meta.Name}, "routes of default/books-http")
	assert.Len(t, srv.Routes[0].Authorizations, 1, "authorizations of its route")
	assert.Equal(t, "books-web", srv.Authorizations[0].Meta.Name, "authorizations of default/books-http")
	assert.NotNil(t, srv.RateLimit, "rate limit of default/books-http")
	srv, err = r.InboundServer("shop", "books-0", 7000, InboundOptions{})
	require.NoError(t, err)
	assert.Empty(t, srv.Authorizations, "shop/books-http has none of default's")
	assert.Nil(t, srv.RateLimit, "shop/books-http has none of default's")
	assert.Equal(t, lookupAnswers(both), lookupAnswers(r), "resources added")

	// One kind replaced alone.
	r.AuthorizationPolicies = nil
	srv, err = r.InboundServer("default", "books-0", 7000, InboundOptions{})
	require.NoError(t, err)
	assert.Empty(t, srv.Routes[0].Authorizations, "authorizations of its route, the policies gone")
	assert.Empty(t, srv.Authorizations, "authorizations of default/books-http, the policies gone")
	r.AuthorizationPolicies = both.AuthorizationPolicies

	r.Services = r.Services[:1]
	r.HTTPRoutes, r.Pods, r.Servers = nil, r.Pods[1:], r.Servers[1:]
	r.AuthorizationPolicies, r.MeshTLSAuthentications = r.AuthorizationPolicies[1:], nil
	assert.Equal(t, lookupAnswers(&Resources{
		Services: both.Services[:1], Pods: both.Pods[1:], Servers: both.Servers[1:],
		AuthorizationPolicies: both.AuthorizationPolicies[1:], NetworkAuthentications: both.NetworkAuthentications,
		HTTPLocalRateLimitPolicies: both.HTTPLocalRateLimitPolicies,
	}), lookupAnswers(r), "resources taken away")
}
