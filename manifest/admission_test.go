package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The loader refuses the MeshTLSAuthentications that Linkerd's policy
// admission refuses, naming the document and field, and takes the ones
// it admits. The rows are the cases of linkerd2's
// policy-test/tests/admit_meshtls_authentication.rs (the CRD's schema:
// one of identities and identityRefs, at least one of either) and of the
// identity checks in policy-controller/runtime/src/validation.rs (what
// policy-controller/runtime/src/admission.rs asks of each identity),
// named by their test functions there.
func TestMeshTLSAuthenticationAdmission(t *testing.T) {
	doc := func(spec string) string {
		return "apiVersion: policy.linkerd.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: test, namespace: ns-0}\nspec: " + spec + "\n"
	}
	ids := func(id string) string { return doc("{identities: [" + `"` + id + `"` + "]}") }
	const where = "document 1 (MeshTLSAuthentication ns-0/test): "
	for _, tc := range []struct {
		name, doc string
		wantErr   string // "": admitted
	}{
		// admit_meshtls_authentication.rs
		{"accepts_valid_ref", doc("{identityRefs: [{kind: ServiceAccount, name: default}]}"), ""},
		{"accepts_ns_ref", doc("{identityRefs: [{kind: Namespace, name: default}]}"), ""},
		{"rejects_namespaced_namespace", doc("{identityRefs: [{kind: Namespace, name: default, namespace: default}]}"),
			where + "spec.identityRefs[0].namespace: a Namespace reference takes no namespace"},
		{"accepts_strings", doc("{identities: [example.id]}"), ""},
		{"rejects_empty", doc("{}"), where + "spec: identities or identityRefs must name at least one identity"},
		{"rejects_both_refs_and_strings", doc("{identities: [example.id], identityRefs: [{kind: ServiceAccount, name: default}]}"),
			where + "spec.identityRefs: set beside identities"},

		// validation.rs
		{"valid_dns", ids("system.local"), ""},
		{"valid_dns_all", ids("*"), ""},
		{"valid_dns_prefix", ids("*.system.local"), ""},
		{"invalid_dns_suffix", ids("system.local.*"), where + `spec.identities[0]: identity "system.local.*" is invalid: not a SPIFFE ID nor a DNS-like name`},
		{"invalid_dns_trailing_dot", ids("system.local."), "not a SPIFFE ID nor a DNS-like name"},
		{"invalid_dns_leading_dot", ids(".system.local"), "not a SPIFFE ID nor a DNS-like name"},
		{"invalid_dns_double_dots", ids("system..local"), "not a SPIFFE ID nor a DNS-like name"},
		{"valid_spiffe_no_path", ids("spiffe://trustdomain"), ""},
		{"valid_spiffe_with_path", ids("spiffe://trustdomain/path/element"), ""},
		{"invalid_spiffe_scheme", ids("http://domain.test/path/element"), "not a SPIFFE ID nor a DNS-like name"},
		{"invalid_spiffe_wrong_scheme", ids("spiffe:/path/element"), "not a SPIFFE ID nor a DNS-like name"},
		{"invalid_spiffe_empty_trust_domain", ids("spiffe:///path/element"), "the SPIFFE trust domain is missing"},
		{"invalid_spiffe_no_slashes_in_scheme", ids("spiffe:path/element"), "not a SPIFFE ID nor a DNS-like name"},
		{"invalid_spiffe_uri_with_query", ids("spiffe://domain.test/path/element?query="), "a SPIFFE path segment holds only"},
		{"invalid_spiffe_uri_with_fragment", ids("spiffe://domain.test/path/element#fragment-1"), "a SPIFFE path segment holds only"},
		{"invalid_spiffe_uri_with_str_port", ids("spiffe://domain.test:8080/path/element"), "a SPIFFE trust domain holds only"},
		{"invalid_spiffe_uri_with_user_info", ids("spiffe://user:password@test.org/path/element"), "a SPIFFE trust domain holds only"},
		{"invalid_spiffe_uri_with_trailing_slash", ids("spiffe://test.org/"), "a SPIFFE path ends with no slash"},
		{"invalid_spiffe_uri_with_empty_segment", ids("spiffe://test.org//"), "a SPIFFE path has no empty segments"},
		{"invalid_spiffe_uri_str_with_path_with_trailing_slash", ids("spiffe://test.org/path/other/"), "a SPIFFE path ends with no slash"},
		{"invalid_spiffe_uri_str_with_dot_segment", ids("spiffe://test.org/./other"), "a SPIFFE path has no . or .. segments"},
		{"invalid_spiffe_uri_str_with_double_dot_segment", ids("spiffe://test.org/../other"), "a SPIFFE path has no . or .. segments"},

		// The regular expression of a DNS-like identity in validation.rs,
		// beyond its tests: the later identity of a list is checked too.
		{"uppercase", ids("Web.ns.serviceaccount.identity.linkerd.cluster.local"), "not a SPIFFE ID nor a DNS-like name"},
		{"a star past the first label", doc(`{identities: ["*.a.b", "a.*.b"]}`), where + `spec.identities[1]: identity "a.*.b" is invalid`},
		{"a label ending in a dash", ids("a-.b"), "not a SPIFFE ID nor a DNS-like name"},
		{"a Linkerd identity", ids("web.ns-0.serviceaccount.identity.linkerd.cluster.local"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse([]byte(tc.doc))
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Len(t, r.MeshTLSAuthentications, 1)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// The NetworkAuthentications that Linkerd's policy admission refuses
// (policy-controller/runtime/src/admission.rs, validate_networks) are
// refused with their field named; the rows are the cases of linkerd2's
// policy-test/tests/admit_network_authentication.rs.
func TestNetworkAuthenticationAdmission(t *testing.T) {
	doc := func(networks string) string {
		return "apiVersion: policy.linkerd.io/v1alpha1\nkind: NetworkAuthentication\nmetadata: {name: test, namespace: ns-0}\nspec: {networks: " + networks + "}\n"
	}
	const where = "document 1 (NetworkAuthentication ns-0/test): "
	for _, tc := range []struct {
		name, doc string
		wantErr   string // "": admitted
	}{
		{"accepts_valid", doc("[{cidr: 10.1.0.0/24}, {cidr: 10.1.1.0/24, except: [10.1.1.0/28]}]"), ""},
		{"accepts_ip_except", doc("[{cidr: 10.1.0.0/16, except: [10.1.1.1]}]"), ""},
		{"rejects_except_whole_cidr", doc("[{cidr: 10.1.1.0/24, except: [10.1.0.0/16]}]"),
			where + "spec.networks[0].except[0]: 10.1.0.0/16 is not inside 10.1.1.0/24"},
		{"rejects_except_not_in_cidr", doc("[{cidr: 10.1.1.0/24, except: [10.1.2.0/24]}]"),
			where + "spec.networks[0].except[0]: 10.1.2.0/24 is not inside 10.1.1.0/24"},
		{"rejects_invalid_cidr", doc("[{cidr: 10.1.0.0/16, except: [bogus]}]"),
			where + `spec.networks[0].except[0]: "bogus" is not a network`},
		{"rejects_empty", doc("[]"), where + "spec.networks: must list at least one network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse([]byte(tc.doc))
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Len(t, r.NetworkAuthentications, 1)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// A file with a MeshTLSAuthentication Linkerd's admission refuses fails
// to load, naming the file, the document and the field.
func TestLoadNamesInvalidIdentity(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authn.yaml")
	good := "apiVersion: policy.linkerd.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: ok, namespace: ns-0}\nspec: {identities: ['*']}\n"
	bad := strings.Replace(strings.Replace(good, "name: ok", "name: bad", 1), "'*'", "'web.*'", 1)
	require.NoError(t, os.WriteFile(path, []byte(good+"---\n"+bad), 0o644))
	_, err := Load(path)
	assert.ErrorContains(t, err, path+`: document 2 (MeshTLSAuthentication ns-0/bad): spec.identities[0]: identity "web.*" is invalid`)
}
