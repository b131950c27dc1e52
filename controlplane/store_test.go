package controlplane

import (
	"context"
	"github.com/inmesh/inmesh/profiles"
	"net/netip"
	"os"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
)

func TestParseEndpoints(t *testing.T) {
	sets, err := manifest.ParseEndpoints([]byte(`
- authority: books.default.svc.cluster.local:7000
  endpoints:
  - addr: 127.0.0.1:4143
    weight: 10000
    h2: true
    opaqueTransportPort: 4143
    identity: books.default.serviceaccount.identity.linkerd.cluster.local
    labels: {pod: books-0, replica: 1}
  - addr: "[::1]:4144"
- authority: Empty.Default.svc.cluster.local.:80
  endpoints: []
`))
	require.NoError(t, err)
	require.Len(t, sets, 2)
	eps := sets["books.default.svc.cluster.local:7000"]
	require.Len(t, eps, 2)
	assert.Equal(t, endpoint.Endpoint{
		Addr: netip.MustParseAddrPort("127.0.0.1:4143"), Weight: 10000, H2: true, OpaqueTransportPort: 4143,
		Identity: "books.default.serviceaccount.identity.linkerd.cluster.local",
		Labels:   map[string]string{"pod": "books-0", "replica": "1"},
	}, eps[0])
	assert.Equal(t, uint32(endpoint.DefaultWeight), eps[1].Weight)
	empty, ok := sets["empty.default.svc.cluster.local:80"]
	assert.True(t, ok, "authority normalised")
	assert.Empty(t, empty)

	bad := []struct{ yaml, want string }{
		{"- authority: a:80\n  endpoints:\n  - addr: nope\n", `[0].endpoints[0].addr: "nope" is not an ip:port address`},
		{"- authority: a\n", `[0].authority: "a" is not host:port`},
		{"- authority: a:80\n  endpoints:\n  - addr: 1.2.3.4:80\n    wieght: 1\n", "[0].endpoints[0].wieght: unknown field"},
		{"- authority: a:80\n  endpoints:\n  - addr: 1.2.3.4:80\n    h2: yes please\n", "[0].endpoints[0].h2: must be true or false"},
		{"- authority: a:80\n  endpoints:\n  - addr: 1.2.3.4:80\n    weight: -1\n", "[0].endpoints[0].weight: -1 is not a whole number"},
		{"- authority: a:80\n- authority: A:80\n", `[1].authority: a:80 is listed twice`},
		{"authority: a:80\n", "must be a list"},
		{"- [unclosed\n", "bad YAML"},
	}
	for _, b := range bad {
		_, err := manifest.ParseEndpoints([]byte(b.yaml))
		assert.ErrorContains(t, err, b.want, b.yaml)
	}
}

func TestStoreLoadKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/books.yaml"
	writeFile(t, good, testutil.FullProfile)
	store := NewStore()
	require.NoError(t, store.LoadServiceProfiles(good))
	p := storedProfile(store, "books.default.svc.cluster.local", 7000)
	require.Len(t, p.Routes, 3)

	broken := dir + "/broken.yaml"
	writeFile(t, broken, "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: web.ns.svc.cluster.local}\nspec: {}\n---\n"+
		"apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: x.ns.svc.cluster.local}\nspec:\n  routes:\n  - name: r\n    condition: {pathRegex: /x}\n    timeout: 3x\n")
	err := store.LoadServiceProfiles(good, broken)
	assert.EqualError(t, err, broken+`: document 2 (ServiceProfile x.ns.svc.cluster.local): spec.routes[0].timeout: "3x" is not a duration (like 300ms or 10s)`)
	p = storedProfile(store, "books.default.svc.cluster.local", 7000)
	assert.Len(t, p.Routes, 3, "the last good profiles stay served")

	epFile := dir + "/endpoints.yaml"
	writeFile(t, epFile, "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1:4143\n")
	require.NoError(t, store.LoadEndpoints(epFile))
	writeFile(t, epFile, "- authority: books.default.svc.cluster.local:7000\n  endpoints:\n  - addr: 127.0.0.1\n")
	assert.ErrorContains(t, store.LoadEndpoints(epFile), epFile+": [0].endpoints[0].addr")
	eps, exists := store.endpointSet("books.default.svc.cluster.local:7000")
	assert.True(t, exists)
	assert.Len(t, eps, 1)
}

// BenchmarkApplyAdd1000 measures the client applying one add of 1,000
// endpoints: conversion, the set update and the sorted snapshot.

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

// storedProfile is the profile the store's ServiceProfile of name gives
// port.
func storedProfile(s *Store, name string, port uint32) *profiles.Profile {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.profiles[profileIDOf(&profiles.ServiceProfile{Name: name})].ProfileFor(port)
}

// An endpoint of the endpoints file with a SPIFFE identity gives the
// server name its proxy answers TLS for in serverName, and a Get stream
// sends both as Linkerd's controller sends an ExternalWorkload's
// (controller/api/destination/endpoint_translator.go): the URI as a
// uri_like_identity and the name as the DNS-like server_name, which
// Linkerd's proxy needs to reach a URI identity over mTLS
// (linkerd/proxy/api-resolve/src/pb.rs to_identity). A server name that is
// no DNS-like name, or without an identity, is an error naming the field.
func TestEndpointsFileSpiffeIdentityWithServerName(t *testing.T) {
	const spiffeID = "spiffe://example.org/ns/books/sa/books"
	path := t.TempDir() + "/endpoints.yaml"
	writeFile(t, path, `
- authority: books.default.svc.cluster.local:7000
  endpoints:
  - addr: 127.0.0.1:4143
    identity: `+spiffeID+`
    serverName: books.example
`)
	store := NewStore()
	require.NoError(t, store.LoadEndpoints(path))
	cp := serve(t, NewServer(store, WithLogger(quietLogger)))
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	st, err := rawClient(t, cp.addr).Get(ctx, &pb.GetDestination{Path: "books.default.svc.cluster.local:7000"})
	require.NoError(t, err)
	up, err := recvTimeout(t, st.Recv)
	require.NoError(t, err)
	addrs := up.GetAdd().GetAddrs()
	require.Len(t, addrs, 1)
	want := &pb.TlsIdentity{
		Strategy:   &pb.TlsIdentity_UriLikeIdentity_{UriLikeIdentity: &pb.TlsIdentity_UriLikeIdentity{Uri: spiffeID}},
		ServerName: &pb.TlsIdentity_DnsLikeIdentity{Name: "books.example"},
	}
	assert.True(t, proto.Equal(want, addrs[0].GetTlsIdentity()), "tls_identity %v", addrs[0].GetTlsIdentity())

	for _, b := range []struct{ yaml, want string }{
		{"- authority: a:80\n  endpoints:\n  - addr: 1.2.3.4:80\n    identity: " + spiffeID + "\n    serverName: " + spiffeID + "\n",
			`[0].endpoints[0].serverName: "` + spiffeID + `" is not a DNS-like name`},
		{"- authority: a:80\n  endpoints:\n  - addr: 1.2.3.4:80\n    serverName: books.example\n",
			"[0].endpoints[0].serverName: a server name needs an identity"},
	} {
		_, err := manifest.ParseEndpoints([]byte(b.yaml))
		assert.ErrorContains(t, err, b.want, b.yaml)
	}
}
