package e2e

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// A fresh proxy with -discovery-wait against a control plane that serves
// the Destination API alone, as Linkerd's destination controller does
// (OutboundPolicies is answered Unimplemented): its first request does not
// wait out the bound, and it follows the profile it waited for, whose
// dstOverrides send every request to another service's endpoint.
func TestDiscoveryWaitWithDestinationAlone(t *testing.T) {
	needCurl(t)
	bin := build(t)
	const authors = "authors.default.svc.cluster.local:7000"
	const bound = 8 * time.Second // under curl's 10 s
	named := func(name string) endpoint.Endpoint {
		app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) }))
		t.Cleanup(app.Close)
		return endpoint.Endpoint{Addr: netip.MustParseAddrPort(strings.TrimPrefix(app.URL, "http://")), Weight: endpoint.DefaultWeight}
	}
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
	store.PutEndpoints(books, []endpoint.Endpoint{named("books")})
	store.PutEndpoints(authors, []endpoint.Endpoint{named("authors")})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	pb.RegisterDestinationServer(g, controlplane.NewServer(store))
	go g.Serve(lis)
	defer g.Stop()

	app := httptest.NewServer(http.NotFoundHandler()) // the proxy's own application, unused
	defer app.Close()
	p := start(t, filepath.Join(bin, "proxy"), nil, "-destination", lis.Addr().String(),
		"-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-metrics", "127.0.0.1:0",
		"-app", strings.TrimPrefix(app.URL, "http://"), "-discovery-wait", bound.String())
	out := p.waitLog(t, listenRe("outbound"))
	for i := range 4 {
		start := time.Now()
		status, _, body := curl(t, "-H", "Host: "+books, "http://"+out+"/")
		took := time.Since(start)
		t.Logf("request %d: %d %q in %v", i+1, status, body, took.Round(time.Millisecond))
		assert.Equal(t, 200, status)
		assert.Equal(t, "authors", body, "request %d follows the profile's dstOverrides", i+1)
		assert.Less(t, took, bound/2, "request %d waited for an answer that cannot come", i+1)
	}
}
