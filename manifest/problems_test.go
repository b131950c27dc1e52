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
		// Linkerd's controller ignores annotations it does not read; a typo
		// of one of its retry or timeout annotations is named.
		{"route annotation typo", "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns-0, annotations: {retry.linkerd.io/http: 5xx, retry.linkerd.io/limt: \"3\", timeout.linkerd.io/requests: 1s, example.com/x: z}}\nspec: {ports: [{port: 80}]}\n",
			[]string{
				`problems.yaml: document 1 (Service ns-0/web): metadata.annotations["retry.linkerd.io/limt"]: not an annotation Linkerd reads`,
				`problems.yaml: document 1 (Service ns-0/web): metadata.annotations["timeout.linkerd.io/requests"]: not an annotation Linkerd reads`,
			}},
		{"route annotations Linkerd reads", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: ns-0, annotations: {retry.linkerd.io/http: 5xx, retry.linkerd.io/grpc: unavailable, retry.linkerd.io/limit: \"2\", retry.linkerd.io/timeout: 1s, timeout.linkerd.io/request: 1s, timeout.linkerd.io/response: 1s, timeout.linkerd.io/idle: 1s}}\nspec:\n  parentRefs: [{kind: Service, group: core, name: web, port: 80}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n", nil},
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

// Services that share a spec.clusterIP (a copied manifest whose clusterIP
// was not changed) load, and are a problem naming each of them by file
// and document: the control plane refuses a GetProfile of that address,
// as Linkerd's controller does (controller/api/destination/server.go
// getSvcID), where it answered the first of them before. A clusterIP of
// one Service, None, or absent is no problem.
func TestServicesSharingAClusterIPAreAProblem(t *testing.T) {
	service := func(name, clusterIP string) string {
		return "apiVersion: v1\nkind: Service\nmetadata: {name: " + name + ", namespace: default}\nspec: {clusterIP: " + clusterIP + ", ports: [{port: 5432}]}\n"
	}
	r, err := LoadFiles(
		File{Name: "db.yaml", Data: []byte(service("db", "10.96.0.10") + "---\n" + service("cache", "10.96.0.11"))},
		File{Name: "web.yaml", Data: []byte(service("web", "10.96.0.10") + "---\n" + service("headless", "None") + "---\n" +
			service("copy", "10.96.0.10") + "---\n" + service("other", `""`))},
	)
	require.NoError(t, err, "they load")
	var got []string
	for _, p := range r.Problems() {
		got = append(got, p.Error())
	}
	assert.Equal(t, []string{
		"web.yaml: document 3 (Service default/copy): spec.clusterIP: 10.96.0.10 is also the clusterIP of db.yaml: document 1 (Service default/db) and web.yaml: document 1 (Service default/web); " +
			"a GetProfile or an OutboundPolicies lookup of 10.96.0.10 is refused (FailedPrecondition) until one Service alone has it",
	}, got)
}
