package mesh

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
)

// TestInboundRouteWithBadRegexKeepsThePortsPolicy: a manifest change
// that adds an inbound HTTPRoute whose path regex has a typo to the
// books pod's Server (whose only authorization admits 127.0.0.3) is
// refused by the control plane's loader, which keeps the last good
// manifests; a workload that starts afterwards gets the Server's policy:
// a client the Server refuses gets 403, the one it admits 200. Before,
// the loader took the route, the control plane served it, the workload's
// client refused the policy ("rejected an inbound policy"), had none to
// keep, and once its wait was over the default policy
// (all-unauthenticated) served the refused client: a typo failed the
// port open. Real sockets, plaintext, from distinct loopback addresses.
func TestInboundRouteWithBadRegexKeepsThePortsPolicy(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := netip.MustParseAddrPort(lis.Addr().String()).Port()
	path := filepath.Join(t.TempDir(), "books.yaml")
	require.NoError(t, os.WriteFile(path, []byte(callersManifests(port)), 0o644))
	store := controlplane.NewStore()
	require.NoError(t, store.LoadManifests(path))
	require.NoError(t, os.WriteFile(path, []byte(callersManifests(port)+`---
apiVersion: policy.linkerd.io/v1beta3
kind: HTTPRoute
metadata: {name: books-admin, namespace: default}
spec:
  parentRefs: [{group: policy.linkerd.io, kind: Server, name: books-http}]
  rules:
  - matches: [{path: {type: RegularExpression, value: "/admin(["}}]
`), 0o644))
	assert.ErrorContains(t, store.LoadManifests(path), "document 5 (HTTPRoute default/books-admin): spec.rules[0].matches[0].path.value: bad regular expression")

	cpl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
	go g.Serve(cpl)
	defer g.Stop()
	dst, err := destination.Dial(cpl.Addr().String(), destination.WithLogger(quiet), destination.WithWorkload("default:books-0"))
	require.NoError(t, err)
	defer dst.Close()
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		WithLogger(quiet), WithInboundPolicy(authz.WithSource(dst.InboundPolicies()), authz.WithoutLocalhost(),
			authz.WithPolicyWait(testutil.Timeout/2))) // within getFrom's timeout
	defer srv.Close()
	hs := origproto.NewServer(srv)
	hs.ErrorLog = quietLog
	go hs.Serve(srv.Listener(lis))
	defer hs.Close()

	assert.Equal(t, http.StatusForbidden, getFrom(t, "127.0.0.2", lis.Addr().String()), "a client the Server refuses")
	assert.Equal(t, http.StatusOK, getFrom(t, "127.0.0.3", lis.Addr().String()), "the client the Server admits")
}
