package profiles_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inmesh/inmesh/profiles"
)

// The logical authority is the profile's fully qualified name with the
// authority's port, for an IP only, as Linkerd's proxy makes a profile's
// addr (linkerd/service-profiles/src/proto.rs convert_profile:
// NameAddr::from((fully_qualified_name, port)); no name, no addr).
func TestLogicalAuthority(t *testing.T) {
	named := &profiles.Profile{FullyQualifiedName: "books.default.svc.cluster.local"}
	for _, tc := range []struct {
		name, authority string
		profile         *profiles.Profile
		want            string
	}{
		{"a clusterIP with its Service's name", "10.96.0.10:8080", named, "books.default.svc.cluster.local:8080"},
		{"an IPv6 clusterIP", "[fd00::a]:8080", named, "books.default.svc.cluster.local:8080"},
		{"a name with a trailing dot", "10.96.0.10:80", &profiles.Profile{FullyQualifiedName: "books.default.svc.cluster.local."}, "books.default.svc.cluster.local:80"},
		{"a pod's address: no name", "10.42.0.7:8080", &profiles.Profile{}, ""},
		{"no profile", "10.96.0.10:8080", nil, ""},
		{"a name is its own authority", "books.default.svc.cluster.local:8080", named, ""},
		{"no port", "10.96.0.10", named, ""},
		{"an IP's profile named by the IP", "10.96.0.10:8080", &profiles.Profile{FullyQualifiedName: "10.96.0.10"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.profile.LogicalAuthority(tc.authority))
		})
	}
}
