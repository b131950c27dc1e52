package controlplane_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/regtest"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
)

// A route whose RegularExpression the proxies cannot compile, inbound (a
// Server's) or outbound (a Service's), is refused when the manifests are
// loaded, naming the file, document and field, and the store keeps
// serving the last good manifests: the pod port's policy and the
// Service's policy stay ones that every client compiles. Before, the
// store took the route and served it; every client then refused the
// whole policy, a fresh inbound port falling to the default policy once
// its wait was over (see mesh TestInboundRouteWithBadRegexKeepsThePortsPolicy).
func TestRouteWithBadRegexKeepsTheLastGoodPolicy(t *testing.T) {
	const base = `apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: default, labels: {app: web}}
spec: {containers: [{name: web, ports: [{name: http, containerPort: 8080}]}]}
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: web-http, namespace: default}
spec: {podSelector: {matchLabels: {app: web}}, port: http}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {ports: [{name: http, port: 80}]}
---
`
	route := func(parent, regex string) string {
		return `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: admin, namespace: default}
spec:
  parentRefs: [` + parent + `]
  rules:
  - matches: [{path: {type: RegularExpression, value: "` + regex + `"}}]
`
	}
	c := regtest.Start(t, "")
	conn, err := grpc.NewClient(c.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), regTimeout)
	defer cancel()
	inbound := func() (proto.Message, error) {
		m, err := inboundpb.NewInboundServerPoliciesClient(conn).GetPort(ctx, &inboundpb.PortSpec{Workload: "default:web-0", Port: 8080})
		require.NoError(t, err)
		srv, err := destination.ServerFromProto(m)
		if err == nil {
			_, err = authz.Compile(srv)
		}
		return m, err
	}
	outbound := func() (proto.Message, error) {
		m, err := outboundpb.NewOutboundPoliciesClient(conn).Get(ctx, &outboundpb.TrafficSpec{SourceWorkload: "pod:default:caller",
			Target: &outboundpb.TrafficSpec_Authority{Authority: "web.default.svc.cluster.local:80"}})
		require.NoError(t, err)
		_, err = destination.PolicyFromProto(m)
		return m, err
	}
	for _, tc := range []struct {
		name, parent string
		answer       func() (proto.Message, error)
	}{
		{"inbound", "{group: policy.linkerd.io, kind: Server, name: web-http}", inbound},
		{"outbound", "{group: core, kind: Service, name: web, port: 80}", outbound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "web.yaml")
			require.NoError(t, os.WriteFile(path, []byte(base+route(tc.parent, "/admin/[a-z]+")), 0o644))
			require.NoError(t, c.Store.LoadManifests(path))
			good, err := tc.answer()
			require.NoError(t, err, "the clients compile the good policy")

			require.NoError(t, os.WriteFile(path, []byte(base+route(tc.parent, "/admin([")), 0o644))
			err = c.Store.LoadManifests(path)
			require.Error(t, err, "the route with a bad regex loaded")
			assert.Equal(t, path+": document 4 (HTTPRoute default/admin): spec.rules[0].matches[0].path.value: bad regular expression: error parsing regexp: missing closing ]: `[`", err.Error())
			served, err := tc.answer()
			assert.NoError(t, err, "the clients cannot compile the policy served")
			assert.True(t, proto.Equal(good, served), "the last good policy is served")
		})
	}
}
