package destination

import (
	"net/netip"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestMirrorsOverTheWire checks that a rule's request mirrors travel in
// inmesh's field 1002 of HttpRoute.Rule, never as a Filter (whose unknown
// kind would make a Linkerd proxy fail the route), and come back as they
// went; and that bad mirrors are refused with the field named.
func TestMirrorsOverTheWire(t *testing.T) {
	backend := policy.Backend{Meta: policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "web", Port: 80},
		Balancer: &policy.Balancer{Authority: "web.ns.svc.cluster.local:80"}}
	mirrors := []policy.Mirror{
		{Meta: policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "shadow", Port: 80},
			Authority: "shadow.ns.svc.cluster.local:80", Ratio: policy.Ratio{Numerator: 20, Denominator: 100}},
		{Meta: policy.Metadata{Kind: "default", Name: "fwd"}, Forward: &endpoint.Endpoint{Addr: netip.MustParseAddrPort("10.0.0.9:8080"), Weight: 1}},
	}
	p := &policy.Policy{Parent: policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "web", Port: 80},
		Protocol: policy.ProtocolHTTP1, HTTP1: policy.HTTPProtocol{Routes: []policy.HTTPRoute{{
			Meta: policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "ns", Name: "r"},
			Rules: []policy.HTTPRule{{
				Filters:  []policy.Filter{{RequestHeaders: &policy.HeaderModifier{Set: []policy.Header{{Name: "x-a", Value: "1"}}}}},
				Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{Backend: backend}}},
				Mirrors:  mirrors,
			}},
		}}}}
	b, err := proto.Marshal(PolicyToProto(p))
	require.NoError(t, err)
	var m outboundpb.OutboundPolicy
	require.NoError(t, proto.Unmarshal(b, &m))
	rule := m.GetProtocol().GetHttp1().GetRoutes()[0].GetRules()[0]
	require.Len(t, rule.GetFilters(), 1, "mirrors are no Filter")
	assert.NotNil(t, rule.GetFilters()[0].GetRequestHeaderModifier())
	rb, err := proto.Marshal(rule)
	require.NoError(t, err)
	n := 0
	for len(rb) > 0 {
		num, typ, l := protowire.ConsumeTag(rb)
		require.GreaterOrEqual(t, l, 0)
		if num == 1002 {
			n++
		}
		rb = rb[l:]
		l = protowire.ConsumeFieldValue(num, typ, rb)
		require.GreaterOrEqual(t, l, 0)
		rb = rb[l:]
	}
	assert.Equal(t, 2, n, "each mirror is one field 1002")

	back, err := PolicyFromProto(&m)
	require.NoError(t, err)
	assert.Equal(t, mirrors, back.HTTP1.Routes[0].Rules[0].Mirrors)

	rule.InmeshRequestMirrors[0].Kind = nil
	_, err = PolicyFromProto(&m)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "inmesh_request_mirrors[0]: one of dst and forward is required")
}
