package controlplane

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/balancer/endpoint"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
)

// A stream's answers carry only what changed between two sets: a new
// endpoint, one whose any field changed, one that went (an add before a
// remove); an unchanged set (or labels that went from nil to empty) sends
// nothing.
func TestEndpointDiffSendsOnlyChanges(t *testing.T) {
	a := netip.MustParseAddrPort("10.0.0.1:8080")
	b := netip.MustParseAddrPort("10.0.0.2:8080")
	ep := func(addr netip.AddrPort, mod func(*endpoint.Endpoint)) endpoint.Endpoint {
		e := endpoint.Endpoint{Addr: addr, Weight: 10, Identity: "web.default.serviceaccount.identity.linkerd.cluster.local", H2: true}
		if mod != nil {
			mod(&e)
		}
		return e
	}
	addrs := func(u *pb.Update) (added, removed []string) {
		for _, w := range u.GetAdd().GetAddrs() {
			added = append(added, protoAddr(w.GetAddr()).String())
		}
		for _, r := range u.GetRemove().GetAddrs() {
			removed = append(removed, protoAddr(r).String())
		}
		return added, removed
	}
	both := []endpoint.Endpoint{ep(a, nil), ep(b, nil)}
	out := endpointDiff(nil, both, nil)
	require.Len(t, out, 1)
	added, _ := addrs(out[0])
	assert.ElementsMatch(t, []string{a.String(), b.String()}, added)
	assert.Equal(t, "web.default.serviceaccount.identity.linkerd.cluster.local",
		out[0].GetAdd().GetAddrs()[0].GetTlsIdentity().GetDnsLikeIdentity().GetName(), "the identity is encoded")

	assert.Empty(t, endpointDiff(both, []endpoint.Endpoint{ep(a, nil), ep(b, nil)}, nil), "nothing changed")
	assert.Empty(t, endpointDiff(both, []endpoint.Endpoint{ep(a, func(e *endpoint.Endpoint) { e.Labels = map[string]string{} }), ep(b, nil)}, nil),
		"nil and empty labels")

	for name, mod := range map[string]func(*endpoint.Endpoint){
		"weight":   func(e *endpoint.Endpoint) { e.Weight = 20 },
		"labels":   func(e *endpoint.Endpoint) { e.Labels = map[string]string{"zone": "a"} },
		"opaque":   func(e *endpoint.Endpoint) { e.Opaque = true },
		"identity": func(e *endpoint.Endpoint) { e.Identity = "books.default.serviceaccount.identity.linkerd.cluster.local" },
	} {
		changed := []endpoint.Endpoint{ep(a, mod), ep(b, nil)}
		out := endpointDiff(both, changed, nil)
		require.Len(t, out, 1, name)
		added, removed := addrs(out[0])
		assert.Equal(t, []string{a.String()}, added, name)
		assert.Empty(t, removed, name)
		out = endpointDiff(changed, both, nil)
		require.Len(t, out, 1, name+", back")
		added, _ = addrs(out[0])
		assert.Equal(t, []string{a.String()}, added, name+", back")
	}

	out = endpointDiff(both, []endpoint.Endpoint{ep(b, nil)}, nil)
	require.Len(t, out, 1)
	_, removed := addrs(out[0])
	assert.Equal(t, []string{a.String()}, removed)

	// An add and a remove at once: the add first.
	c := netip.MustParseAddrPort("10.0.0.3:8080")
	out = endpointDiff(both, []endpoint.Endpoint{ep(b, nil), ep(c, nil)}, nil)
	require.Len(t, out, 2)
	added, _ = addrs(out[0])
	_, removed = addrs(out[1])
	assert.Equal(t, []string{c.String()}, added)
	assert.Equal(t, []string{a.String()}, removed)
}

// protoAddr decodes an IPv4 TcpAddress.
func protoAddr(a *pb.TcpAddress) netip.AddrPort {
	ip := a.GetIp().GetIpv4()
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), uint16(a.GetPort()))
}
