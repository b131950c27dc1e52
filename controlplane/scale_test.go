package controlplane_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
)

// policyAnswers are the answers of a control plane, on a plaintext gRPC
// connection to addr, to an OutboundPolicies lookup of each authority.
func policyAnswers(t *testing.T, addr string, authorities []string) map[string]addrAnswer {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	pol := outboundpb.NewOutboundPoliciesClient(conn)
	out := make(map[string]addrAnswer)
	for _, a := range authorities {
		m, err := pol.Get(ctx, &outboundpb.TrafficSpec{SourceWorkload: "default:web-0",
			Target: &outboundpb.TrafficSpec_Authority{Authority: a}})
		if err != nil {
			out["policy "+a] = addrAnswer{Status: status.Code(err).String() + ": " + status.Convert(err).Message()}
			continue
		}
		out["policy "+a] = addrAnswer{Msg: m}
	}
	return out
}

// The Services of the scale tests: books and reviews, with a route from
// reviews to books, then after reloads a Service renamed, one removed and
// one added, and the route moved to another parent.
const (
	scaleBooks = `
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default, annotations: {config.linkerd.io/opaque-ports: "5432"}}
spec: {ports: [{name: http, port: 7000}, {name: db, port: 5432}]}
`
	scaleReviews = `
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: default}
spec: {ports: [{name: http, port: 9000}]}
`
	scaleAuthors = `
apiVersion: v1
kind: Service
metadata: {name: authors, namespace: default}
spec: {ports: [{name: http, port: 7000}]}
`
	scaleRoute = `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: to-books, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: PARENT}]
  rules: [{matches: [{path: {type: PathPrefix, value: /books}}], backendRefs: [{name: books, port: 7000}]}]
`
)

func scaleManifests(t *testing.T, docs ...string) *manifest.Resources {
	t.Helper()
	var files []manifest.File
	for i, d := range docs {
		files = append(files, manifest.File{Name: "doc" + string(rune('a'+i)) + ".yaml", Data: []byte(d)})
	}
	r, err := manifest.LoadFiles(files...)
	require.NoError(t, err)
	return r
}

// The endpoint sets a store serves, and its answers by Service name and
// address, follow every change as a store given the state reached at
// once: registrations for an authority that has no file set, then gets
// one (the file's endpoint wins an address both give), registrations of
// one authority in either order of their ids, a file set removed under a
// registration, registrations renewed, deregistered and emptied, every
// file set replaced; and reloads of the manifests that rename, remove and
// add a Service and move a route to another parent. A change rebuilds only
// the sets it touches, and the lookups by Service name read an index of
// the manifests: a set or an index left behind answers what the fresh
// store does not.
func TestServedSetsAndServicesFollowEveryChange(t *testing.T) {
	const (
		booksA   = "books.default.svc.cluster.local:7000"
		booksDB  = "books.default.svc.cluster.local:5432"
		reviewsA = "reviews.default.svc.cluster.local:9000"
		authorsA = "authors.default.svc.cluster.local:7000"
		ghostA   = "ghost.default.svc.cluster.local:80" // named by no manifest
	)
	ep := func(addr, id string, labels ...string) endpoint.Endpoint {
		e := endpoint.Endpoint{Addr: netip.MustParseAddrPort(addr), Identity: id}
		if len(labels) == 2 {
			e.Labels = map[string]string{labels[0]: labels[1]}
		}
		return e
	}
	store := controlplane.NewStore()
	docs := []string{scaleBooks, scaleReviews, replaceParent(scaleRoute, "reviews")}
	store.SetManifests(scaleManifests(t, docs...))
	addr := serveStore(t, store)

	profiles := []string{booksA, booksDB, reviewsA, authorsA, ghostA, "books.default.svc.cluster.local:8000",
		"127.0.0.1:7000", "127.0.0.2:7000", "127.0.0.3:7000", "127.0.0.4:80", "127.0.0.5:9000"}
	authorities := []string{booksA, booksDB, reviewsA, authorsA, ghostA}

	// served spot-checks the merge: the endpoints served for an
	// authority, as address and the label "by" (who gave it); nil when
	// the authority is not served.
	served := func(a string) []string {
		eps, ok := store.EndpointSets()[a]
		if !ok {
			return nil
		}
		out := []string{}
		for _, e := range eps {
			out = append(out, e.Addr.String()+" "+e.Labels["by"])
		}
		return out
	}
	for _, step := range []struct {
		name string
		do   func()
		want map[string][]string // served(authority)
	}{
		{"a registration of an authority without a file set", func() {
			store.PutRegistered("b", map[string][]endpoint.Endpoint{booksA: {ep("127.0.0.2:7000", "reg-id", "by", "b")}})
		}, map[string][]string{booksA: {"127.0.0.2:7000 b"}}},
		{"a second registration of it, first by id, at the same address", func() {
			store.PutRegistered("a", map[string][]endpoint.Endpoint{
				booksA: {ep("127.0.0.2:7000", "reg-id", "by", "a"), ep("127.0.0.3:7000", "reg-id")},
				ghostA: {ep("127.0.0.4:80", "reg-id")},
			})
		}, map[string][]string{booksA: {"127.0.0.2:7000 a", "127.0.0.3:7000 "}, ghostA: {"127.0.0.4:80 "}}},
		{"the file gives the authority, at a registered address", func() {
			store.PutEndpoints(booksA, []endpoint.Endpoint{ep("127.0.0.1:7000", "file-id"), ep("127.0.0.3:7000", "file-id", "by", "file")})
		}, map[string][]string{booksA: {"127.0.0.1:7000 ", "127.0.0.2:7000 a", "127.0.0.3:7000 file"}}},
		{"the file gives another port of the Service", func() {
			store.PutEndpoints(booksDB, []endpoint.Endpoint{ep("127.0.0.1:5432", "file-id")})
		}, nil},
		{"a registration renewed with other endpoints", func() {
			store.PutRegistered("a", map[string][]endpoint.Endpoint{
				booksA:   {ep("127.0.0.3:7000", "reg-id", "by", "a")},
				reviewsA: {ep("127.0.0.5:9000", "reg-id")},
			})
		}, map[string][]string{booksA: {"127.0.0.1:7000 ", "127.0.0.2:7000 b", "127.0.0.3:7000 file"}, reviewsA: {"127.0.0.5:9000 "}}},
		{"the file set is removed under the registrations", func() {
			store.DeleteEndpoints(booksA)
		}, map[string][]string{booksA: {"127.0.0.2:7000 b", "127.0.0.3:7000 a"}}},
		{"a registration with an empty set", func() {
			store.PutRegistered("c", map[string][]endpoint.Endpoint{authorsA: nil})
		}, map[string][]string{authorsA: {}, ghostA: nil}},
		{"every file set replaced", func() {
			store.SetEndpoints(map[string][]endpoint.Endpoint{
				booksA:   {ep("127.0.0.2:7000", "file-id", "by", "file")},
				reviewsA: {ep("127.0.0.5:9000", "file-id")},
			})
		}, nil},
		{"reload: the route moves to books, reviews is renamed authors", func() {
			docs = []string{scaleBooks, scaleAuthors, replaceParent(scaleRoute, "books")}
			store.SetManifests(scaleManifests(t, docs...))
		}, nil},
		{"reload: books removed, reviews added back", func() {
			docs = []string{scaleReviews, scaleAuthors, replaceParent(scaleRoute, "authors")}
			store.SetManifests(scaleManifests(t, docs...))
		}, nil},
		{"a registration leaves", func() {
			store.DeleteRegistered("b")
		}, nil},
		{"reload: books back", func() {
			docs = []string{scaleBooks, scaleReviews, scaleAuthors, replaceParent(scaleRoute, "books")}
			store.SetManifests(scaleManifests(t, docs...))
		}, nil},
		{"the other registrations leave", func() {
			store.DeleteRegistered("a")
			store.DeleteRegistered("c")
		}, nil},
		{"every file set removed", func() {
			store.SetEndpoints(nil)
		}, map[string][]string{booksA: nil}},
	} {
		step.do()
		for a, want := range step.want {
			assert.Equal(t, want, served(a), "%s: endpoints served for %s", step.name, a)
		}
		fresh := store.Fresh()
		fresh.SetManifests(scaleManifests(t, docs...)) // an index of its own
		if !assert.Equal(t, fresh.EndpointSets(), store.EndpointSets(),
			"%s: endpoint sets of a fresh store with the store's state (expected) and of the store (actual)", step.name) {
			break
		}
		freshAddr := serveStore(t, fresh)
		got, want := addrAnswers(t, addr, profiles, nil), addrAnswers(t, freshAddr, profiles, nil)
		for k, v := range policyAnswers(t, addr, authorities) {
			got[k] = v
		}
		for k, v := range policyAnswers(t, freshAddr, authorities) {
			want[k] = v
		}
		if !assert.Empty(t, cmp.Diff(want, got, protocmp.Transform()),
			"%s: answers of the store after the changes (+) and of a fresh store with its state (-)", step.name) {
			break
		}
	}
}

func replaceParent(route, parent string) string { return strings.Replace(route, "PARENT", parent, 1) }
