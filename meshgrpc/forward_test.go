package meshgrpc_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"

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

// serveEmbedded serves the embedded control plane over store on loopback
// until the test ends and returns a Destination client of it that looks
// up the loopback network's addresses.
func serveEmbedded(t *testing.T, store *controlplane.Store) *destination.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return dialLoopback(t, lis.Addr().String())
}

// dialTarget makes a fresh plaintext mesh channel to inmesh:///target.
func dialTarget(t *testing.T, dst *destination.Client, target string, opts ...meshgrpc.Option) testgrpc.TestServiceClient {
	t.Helper()
	opts = append([]meshgrpc.Option{meshgrpc.WithLogger(quiet), meshgrpc.WithDiscoveryWait(testutil.Timeout)}, opts...)
	cc, err := grpc.NewClient("inmesh:///"+target, meshgrpc.DialOptions(dst, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

// The calls to a forward backend's endpoint are recorded with no authority
// label, as Linkerd's proxy records them: a forward's concrete target has
// no authority (linkerd/app/outbound/src/http/logical/policy/router.rs,
// mk_concrete), and its endpoint labels write none without one
// (linkerd/app/core/src/metrics.rs, OutboundEndpointLabels), as the HTTP
// stack records a forward's requests. Against the embedded control plane:
// an address outside the cluster gets the egress-fallback policy, which
// forwards to it; a workload's address the forward to its profile's
// endpoint. A Service's calls keep its name.
func TestForwardBackendSeriesHaveNoAuthority(t *testing.T) {
	for _, tc := range []struct {
		name string
		// target is the channel's; endpoints, those of books.
		target    func(a netip.AddrPort) string
		endpoints bool
		authority string // the authority label wanted; "": none
	}{
		{"an address outside the cluster", func(a netip.AddrPort) string { return a.String() }, false, ""},
		{"a workload's address", func(a netip.AddrPort) string { return a.String() }, true, ""},
		{"a Service", func(netip.AddrPort) string { return books }, true, books},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startApp(t, &app{}, nil)
			store := controlplane.NewStore()
			manifests(t, store, booksService)
			if tc.endpoints {
				store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr, Weight: endpoint.DefaultWeight}}})
			}
			m := testutil.NewMetrics(t)
			c := dialTarget(t, serveEmbedded(t, store), tc.target(a.addr), meshgrpc.WithMeterProvider(m.Provider))
			for range 2 {
				_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
				require.NoError(t, err)
			}

			for _, family := range []string{"request_total", "response_total"} {
				lines := m.Lines(t, family, `direction="outbound"`, `target_addr="`+a.addr.String()+`"`)
				require.Len(t, lines, 1, "%s: %v", family, m.Lines(t, family))
				if tc.authority == "" {
					assert.NotContains(t, lines[0], "authority=", "%s", family)
				} else {
					assert.Contains(t, lines[0], `authority="`+tc.authority+`"`, "%s", family)
				}
				assert.True(t, strings.HasSuffix(lines[0], " 2"), "%s: %s", family, lines[0])
			}
		})
	}
}
