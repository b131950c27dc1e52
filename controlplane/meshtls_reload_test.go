package controlplane

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
)

// A reload whose MeshTLSAuthentication lists an identity Linkerd's policy
// admission refuses (policy-controller/runtime/src/validation.rs), or
// sets both identities and identityRefs (the CRD's oneOf), is rejected:
// the warning names the file, document and field, and the embedded
// control plane keeps serving the pod port's last good policy over
// InboundServerPolicies. Before, the document loaded and the policy
// served changed.
func TestInvalidMeshTLSAuthenticationKeepsTheLastGoodPolicy(t *testing.T) {
	const base = `apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: default, labels: {app: books}}
spec: {containers: [{name: app, ports: [{name: http, containerPort: 7000}]}]}
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: books, namespace: default}
spec: {podSelector: {matchLabels: {app: books}}, port: http}
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: books-authors, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books}
  requiredAuthenticationRefs: [{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: authors}]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: authors, namespace: default}
`
	const goodID = "web.default.serviceaccount.identity.linkerd.cluster.local"
	for _, tc := range []struct {
		name, spec, wantLog string
	}{
		{"a star past the first label", "spec: {identities: [" + goodID + ", 'web.*.serviceaccount']}\n",
			`document 4 (MeshTLSAuthentication default/authors): spec.identities[1]: identity \"web.*.serviceaccount\" is invalid`},
		{"a SPIFFE path with a trailing slash", "spec: {identities: ['spiffe://cluster.local/ns/default/']}\n",
			`document 4 (MeshTLSAuthentication default/authors): spec.identities[0]: identity \"spiffe://cluster.local/ns/default/\" is invalid: a SPIFFE path ends with no slash`},
		{"identities and identityRefs", "spec: {identities: [" + goodID + "], identityRefs: [{kind: ServiceAccount, name: web}]}\n",
			`document 4 (MeshTLSAuthentication default/authors): spec.identityRefs: set beside identities`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "books.yaml")
			w := &stampedWriter{t: t}
			w.write(file, base+"spec: {identities: ["+goodID+"]}\n")
			store := NewStore()
			logs := &testutil.LogLines{}
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()
			require.NoError(t, WatchManifestFiles(ctx, store, dir, 5*time.Millisecond, WithLogger(logs.Logger())))

			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			g := grpc.NewServer()
			NewServer(store).Register(g)
			go func() { _ = g.Serve(lis) }()
			t.Cleanup(g.Stop)
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			require.NoError(t, err)
			t.Cleanup(func() { conn.Close() })
			served := func() *inboundpb.Server {
				m, err := inboundpb.NewInboundServerPoliciesClient(conn).GetPort(ctx, &inboundpb.PortSpec{Workload: "default:books-0", Port: 7000})
				require.NoError(t, err)
				return m
			}
			good := served()
			require.Contains(t, good.String(), goodID, "the good policy admits the identity")

			w.write(file, base+tc.spec)
			require.Eventually(t, func() bool { return logs.Count("rejected a control-plane file") == 1 },
				defaultTestTimeout, 5*time.Millisecond, "the bad document was never rejected; log:\n%s", logs.String())
			line := logs.String()
			assert.Contains(t, line, file+": "+tc.wantLog, "the warning names the file, document and field")
			assert.True(t, proto.Equal(good, served()), "the last good policy is served")
		})
	}
}
