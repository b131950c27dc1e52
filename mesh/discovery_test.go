package mesh

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

const authors = "authors.default.svc.cluster.local:7000"

// namedApp serves its name, for telling endpoints apart.
func namedApp(t *testing.T, name string) endpoint.Endpoint {
	srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) }))
	return endpoint.Endpoint{Addr: netip.MustParseAddrPort(srv.Listener.Addr().String()), Weight: endpoint.DefaultWeight}
}

// With a discovery wait, against a control plane that serves Destination
// alone (as Linkerd's destination controller does: OutboundPolicies is
// answered Unimplemented), the first request of a fresh client waits only
// for the profile, not the whole bound, and follows it: the profile's
// dstOverrides send it, and every later one, to the other service. The
// requests after it do not wait either.
func TestDiscoveryWaitWithoutOutboundPolicies(t *testing.T) {
	const bound = 10 * time.Second
	store := controlplane.NewStore()
	sps, err := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  dstOverrides:
  - {authority: "` + authors + `", weight: 100}
`))
	require.NoError(t, err)
	store.SetServiceProfiles(sps)
	store.PutEndpoints(books, []endpoint.Endpoint{namedApp(t, "books")})
	store.PutEndpoints(authors, []endpoint.Endpoint{namedApp(t, "authors")})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	pb.RegisterDestinationServer(g, controlplane.NewServer(store, controlplane.WithLogger(quiet)))
	go g.Serve(lis)
	defer g.Stop()
	dst, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quiet))
	require.NoError(t, err)
	defer dst.Close()

	client := NewClient(WithDestination(dst), WithLogger(quiet), WithDiscoveryWait(bound))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: 2 * bound}
	get := func() (string, time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*bound)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "GET", "http://"+books+"/", nil)
		require.NoError(t, err)
		start := time.Now()
		resp, err := hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, 200, resp.StatusCode, string(b))
		return string(b), time.Since(start)
	}
	body, took := get()
	t.Logf("first request: %v", took.Round(time.Millisecond))
	assert.Equal(t, "authors", body, "the first request follows the profile's dstOverrides")
	assert.Less(t, took, bound/2, "the first request waited for an answer that cannot come")
	for i := range 3 {
		body, took := get()
		assert.Equal(t, "authors", body, "request %d", i+2)
		assert.Less(t, took, bound/2, "request %d waited", i+2)
	}
}

// With a discovery wait and a control plane whose port refuses
// connections, the first request of a fresh client does not wait for
// answers that cannot come: it takes the default route at once (to the
// endpoints of a static source here), as do the requests after it.
func TestDiscoveryWaitControlPlaneRefused(t *testing.T) {
	const bound = 10 * time.Second
	refuse := func(context.Context, string, string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	dst, err := destination.Dial("127.0.0.1:1", destination.WithLogger(quiet), destination.WithDialFunc(refuse))
	require.NoError(t, err)
	defer dst.Close()
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {namedApp(t, "books")}})
	require.NoError(t, err)

	client := NewClient(WithDestination(dst), WithEndpoints(eps), WithLogger(quiet), WithDiscoveryWait(bound))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: 2 * bound}
	for i := range 3 {
		start := time.Now()
		resp, err := hc.Get("http://" + books + "/")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		t.Logf("request %d: %v", i+1, took.Round(time.Millisecond))
		assert.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, "books", string(b))
		assert.Less(t, took, bound/2, "request %d waited for a control plane that refuses connections", i+1)
	}
}
