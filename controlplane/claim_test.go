package controlplane

import (
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Claims on one address are named in one order: the endpoint sets'
// first, then by authority, then by identity, so that two registrations
// of one authority with different identities give the same message every
// time, whatever order the map of claims hands them out in.
func TestClaimsAreNamedInOneOrder(t *testing.T) {
	ids := map[string]claim{
		"b.ns.serviceaccount.identity.linkerd.cluster.local": {identity: "b.ns.serviceaccount.identity.linkerd.cluster.local", authority: "books.ns.svc.cluster.local:80"},
		"a.ns.serviceaccount.identity.linkerd.cluster.local": {identity: "a.ns.serviceaccount.identity.linkerd.cluster.local", authority: "books.ns.svc.cluster.local:80"},
		"c.ns.serviceaccount.identity.linkerd.cluster.local": {identity: "c.ns.serviceaccount.identity.linkerd.cluster.local", authority: "authors.ns.svc.cluster.local:80"},
		"d.ns.serviceaccount.identity.linkerd.cluster.local": {identity: "d.ns.serviceaccount.identity.linkerd.cluster.local", authority: "zebra.ns.svc.cluster.local:80", file: true},
	}
	want := []string{"d", "c", "a", "b"}
	for range 50 {
		sorted := slices.SortedFunc(maps.Values(ids), func(a, b claim) int {
			if a.before(b) {
				return -1
			}
			return 1
		})
		got := make([]string, len(sorted))
		for i, c := range sorted {
			got[i] = c.identity[:1]
		}
		if !assert.Equal(t, want, got) {
			return
		}
	}
}
