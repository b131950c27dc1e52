package manifest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Resources that load but cannot work as written are named with their
// file, document and field. Linkerd's policy controller takes the same
// resources the same way (policy-controller/k8s/index/src/inbound:
// an AuthorizationPolicy whose authentication is missing is not linked;
// a Server port name resolves only through the pod's named TCP container
// ports, and a port number applies whether declared or not), so nothing
// changes in what is served; only the log says it.
func TestProblems(t *testing.T) {
	const meshTLS = "---\napiVersion: policy.linkerd.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: m, namespace: ns-0}\nspec: {identities: ['*']}\n"
	const network = "---\napiVersion: policy.linkerd.io/v1alpha1\nkind: NetworkAuthentication\nmetadata: {name: net, namespace: ns-0}\nspec: {networks: [{cidr: 0.0.0.0/0}]}\n"
	srvRef := "{group: policy.linkerd.io, kind: Server, name: s}"
	bare := "apiVersion: v1\nkind: Pod\nmetadata: {name: bare, namespace: ns-1, labels: {app: app-0}}\n"
	for _, tc := range []struct {
		name, docs string
		want       []string // each a problem, in order
	}{
		{"all good", pod0 + "---" + server("s", "admin", "") + "---" + authorizationPolicy("a", srvRef, "[{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: m}, {group: policy.linkerd.io, kind: NetworkAuthentication, name: net}]") + meshTLS + network, nil},
		{"service account ref", pod0 + "---" + server("s", "8080", "") + "---" + authorizationPolicy("a", srvRef, "[{kind: ServiceAccount, name: sa-0}]"), nil},
		{"missing meshtls", pod0 + "---" + server("s", "8080", "") + "---" + authorizationPolicy("a", srvRef, "[{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: nobody}]"),
			[]string{"problems.yaml: document 3 (AuthorizationPolicy ns-0/a): spec.requiredAuthenticationRefs[0]: MeshTLSAuthentication ns-0/nobody is not defined in any file; the policy authorizes no one until it is"}},
		{"missing network", pod0 + "---" + server("s", "8080", "") + "---" + authorizationPolicy("a", srvRef, "[{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: m}, {group: policy.linkerd.io, kind: NetworkAuthentication, name: office}]") + meshTLS,
			[]string{"problems.yaml: document 3 (AuthorizationPolicy ns-0/a): spec.requiredAuthenticationRefs[1]: NetworkAuthentication ns-0/office is not defined"}},
		{"port name nobody declares", pod0 + "---" + server("s", "web", ""),
			[]string{`problems.yaml: document 2 (Server ns-0/s): spec.port: no Pod it selects (ns-0/pod-0) has a TCP container port named "web" (their TCP ports: 5432, 8080, 9990); their ports keep the default policy`}},
		{"port number nobody declares", pod0 + "---" + server("s", "7000", ""),
			[]string{"problems.yaml: document 2 (Server ns-0/s): spec.port: 7000 is no TCP container port of the Pods it selects (ns-0/pod-0, which declare 5432, 8080, 9990); the ports they serve keep the default policy"}},
		{"port number of a pod without ports", bare + "---\napiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: s, namespace: ns-1}\nspec: {podSelector: {matchLabels: {app: app-0}}, port: 7000}\n", nil},
		{"port name of a pod without ports", bare + "---\napiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: s, namespace: ns-1}\nspec: {podSelector: {matchLabels: {app: app-0}}, port: web}\n",
			[]string{`problems.yaml: document 2 (Server ns-1/s): spec.port: no Pod it selects (ns-1/bare) has a TCP container port named "web" (their TCP ports: none)`}},
		{"server selecting no pod", server("s", "web", ""), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "problems.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tc.docs), 0o644))
			r, err := Load(path)
			require.NoError(t, err)
			got := r.Problems()
			require.Len(t, got, len(tc.want), "%v", got)
			for i, want := range tc.want {
				assert.Contains(t, got[i].Error(), filepath.Dir(path)+"/"+want)
			}
		})
	}
}
