package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
)

// BenchmarkManifestReload measures a reload of the policy manifests of
// 2,000 Services, each with an HTTPRoute and each watched by an
// OutboundPolicies stream over a real gRPC connection: every reload
// changes the route of one Service, so that one stream is woken and the
// others are only compared.
func BenchmarkManifestReload(b *testing.B) {
	const n = 2000
	docs := func(path string) *manifest.Resources {
		var yaml strings.Builder
		for i := range n {
			p := fmt.Sprintf("/api/%d", i)
			if i == 0 {
				p = path
			}
			fmt.Fprintf(&yaml, "---\napiVersion: v1\nkind: Service\nmetadata: {name: svc-%d, namespace: default}\nspec: {clusterIP: 10.96.%d.%d, ports: [{name: http, port: 8080}]}\n",
				i, i/250, i%250+1)
			fmt.Fprintf(&yaml, "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r-%d, namespace: default}\n"+
				"spec:\n  parentRefs: [{group: core, kind: Service, name: svc-%d, port: 8080}]\n"+
				"  rules:\n  - matches: [{path: {type: PathPrefix, value: %s}, method: GET}]\n    timeouts: {request: 5s}\n"+
				"  - matches: [{path: {type: PathPrefix, value: /}}]\n", i, i, p)
		}
		r, err := manifest.LoadFiles(manifest.File{Name: "fleet.yaml", Data: []byte(yaml.String())})
		require.NoError(b, err)
		return r
	}
	one, other := docs("/one"), docs("/other")
	store := controlplane.NewStore()
	store.SetManifests(one)
	conn, err := grpc.NewClient(serveStore(b, store), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 100*testutil.Timeout)
	b.Cleanup(cancel)
	pol := outboundpb.NewOutboundPoliciesClient(conn)
	var first grpc.ServerStreamingClient[outboundpb.OutboundPolicy]
	for i := range n {
		spec := &outboundpb.TrafficSpec{SourceWorkload: "default:web-0",
			Target: &outboundpb.TrafficSpec_Authority{Authority: fmt.Sprintf("svc-%d.default.svc.cluster.local:8080", i)}}
		st, err := pol.Watch(ctx, spec)
		require.NoError(b, err)
		_, err = st.Recv()
		require.NoError(b, err)
		if i == 0 {
			first = st
		}
	}
	// The one stream each reload wakes takes its answers as they come.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := first.Recv(); err != nil {
				return
			}
		}
	}()
	b.Cleanup(func() { cancel(); <-done })

	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if i%2 == 1 {
			store.SetManifests(other)
		} else {
			store.SetManifests(one)
		}
	}
}
