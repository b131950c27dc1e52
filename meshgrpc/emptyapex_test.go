package meshgrpc_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// booksV1Service declares books-v1, the Service the calls of books are
// sent to while books has no endpoints.
const booksV1Service = `
---
apiVersion: v1
kind: Service
metadata: {name: books-v1, namespace: default}
spec: {ports: [{port: 7000}]}
`

// toV1Route returns a route of kind (GRPCRoute or HTTPRoute) that sends
// every call of books to books-v1.
func toV1Route(kind string) string {
	return `
---
apiVersion: gateway.networking.k8s.io/v1
kind: ` + kind + `
metadata: {name: to-v1, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - backendRefs: [{name: books-v1, port: 7000}]
`
}

// A Service with no endpoints, which the control plane answers with
// silence (as Linkerd's does) until the Destination client's first-message
// timeout turns it into "no endpoints", does not hold the first call of a
// new channel when its dst overrides or its route send every call to
// another Service: the call waits only for the Service it is sent to, as
// in Linkerd's proxy, whose distribution waits only for the backend it
// draws (linkerd/distribute/src/service/random.rs). The first-message
// timeout and the discovery wait are a minute, so that waiting for
// books's own endpoints would outlast the call's 30 s deadline.
func TestFirstCallToAServiceWithoutEndpointsTakesItsSplit(t *testing.T) {
	vip := testutil.ClusterIP(7000)
	for _, tc := range []struct {
		name    string
		target  string
		docs    string // manifests besides books and books-v1
		profile bool   // books's ServiceProfile overrides it 100% to books-v1
	}{
		{name: "dstOverrides", target: booksTarget, profile: true},
		{name: "GRPCRoute", target: booksTarget, docs: toV1Route("GRPCRoute")},
		{name: "HTTPRoute", target: booksTarget, docs: toV1Route("HTTPRoute")},
		{name: "clusterIP dstOverrides", target: "inmesh:///" + vip.String(), profile: true},
		{name: "clusterIP GRPCRoute", target: "inmesh:///" + vip.String(), docs: toV1Route("GRPCRoute")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := controlplane.NewStore()
			store.SetEndpoints(map[string][]endpoint.Endpoint{
				books:   {},
				booksV1: {{Addr: serveTestService(t, &namedApp{name: "v1"}), Weight: endpoint.DefaultWeight}},
			})
			manifests(t, store, testutil.ClusterIPService("default", "books", vip)+booksV1Service+tc.docs)
			if tc.profile {
				setOverrides(t, store, "", booksV1+" 100")
			}
			dst := serveStore(t, store, destination.WithLogger(quiet), destination.WithFirstMessageTimeout(time.Minute),
				destination.WithSearchNetworks(netip.MustParsePrefix("127.0.0.0/8")))
			cc, err := grpc.NewClient(tc.target, meshgrpc.DialOptions(dst, meshgrpc.WithLogger(quiet),
				meshgrpc.WithDiscoveryWait(time.Minute))...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = cc.Close() })
			c := testgrpc.NewTestServiceClient(cc)

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resp, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{})
			require.NoError(t, err, "the first call of a new channel")
			assert.Equal(t, "v1", resp.GetUsername())
			assert.Equal(t, "v1", whoStreams(t, c))
		})
	}
}
