package requireid

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// An identity is found as Linkerd's proxy compares names: DNS-like names
// in any ASCII case, URIs exactly, never on an endpoint that proves none.
func TestSatisfied(t *testing.T) {
	const books = "books.default.serviceaccount.identity.linkerd.cluster.local"
	const spiffe = "spiffe://cluster.local/ns/default/sa/books"
	for _, tc := range []struct {
		name, want, found string
		ok                bool
	}{
		{"the same name", books, books, true},
		{"the name in upper case", "BOOKS.default.serviceaccount.identity.linkerd.cluster.local", books, true},
		{"another name", "reviews.default.serviceaccount.identity.linkerd.cluster.local", books, false},
		{"plaintext", books, "", false},
		{"the same URI", spiffe, spiffe, true},
		{"a URI in another case", "spiffe://cluster.local/ns/default/sa/BOOKS", spiffe, false},
		{"a urn: URI in another case", "urn:example:BOOKS", "urn:example:books", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.ok, Satisfied(tc.want, tc.found))
		})
	}
}
