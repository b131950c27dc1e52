package destination_test

import (
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/proxyapi/hedgepb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A rule's hedging travels in field 1001 of HttpRoute.Rule and
// GrpcRoute.Rule (a number Linkerd's messages do not use, which its proxies
// skip) and comes back as it went.
func TestHedgeWireRoundTrip(t *testing.T) {
	fixed := &hedge.Policy{Delay: 20 * time.Millisecond, MaxExtraLoad: 0.02}
	learnt := &hedge.Policy{Percentile: 95, Idempotent: true}
	backend := policy.Backend{Meta: policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "svc", Port: 80},
		Balancer: &policy.Balancer{Authority: "svc.ns.svc.cluster.local:80"}}
	httpRoute := policy.DefaultHTTPRoute(backend, nil, policy.Timeouts{})
	httpRoute.Rules[0].Hedge = fixed
	httpRoute.Rules = append(httpRoute.Rules, policy.HTTPRule{Backends: httpRoute.Rules[0].Backends, Hedge: learnt},
		policy.HTTPRule{Backends: httpRoute.Rules[0].Backends})
	p := &policy.Policy{Parent: policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "svc", Port: 80},
		Protocol: policy.ProtocolHTTP1, HTTP1: policy.HTTPProtocol{Routes: []policy.HTTPRoute{httpRoute}}}
	m := destination.PolicyToProto(p)
	rule := m.GetProtocol().GetHttp1().GetRoutes()[0].GetRules()[0]
	assert.True(t, hasField(t, marshal(t, rule), 1001), "field 1001 carries the hedge")
	back, err := destination.PolicyFromProto(m)
	require.NoError(t, err)
	rules := back.HTTP1.Routes[0].Rules
	assert.Equal(t, fixed, rules[0].Hedge)
	assert.Equal(t, learnt, rules[1].Hedge)
	assert.Nil(t, rules[2].Hedge, "no hedge, no field")
	assert.False(t, hasField(t, marshal(t, m.GetProtocol().GetHttp1().GetRoutes()[0].GetRules()[2]), 1001))

	g, err := destination.DecodeGRPCRule(&outboundpb.GrpcRoute_Rule{
		Backends: &outboundpb.GrpcRoute_Distribution{Kind: &outboundpb.GrpcRoute_Distribution_Empty_{Empty: &outboundpb.GrpcRoute_Distribution_Empty{}}},
		Hedge:    &hedgepb.Hedge{Delay: &hedgepb.Hedge_Fixed{Fixed: durationpb.New(5 * time.Millisecond)}},
	}, "r")
	require.NoError(t, err)
	assert.Equal(t, &hedge.Policy{Delay: 5 * time.Millisecond}, g.Hedge)
}

// A hedge the wire carries out of range fails its rule, naming the field.
func TestHedgeWireInvalid(t *testing.T) {
	empty := &outboundpb.GrpcRoute_Distribution{Kind: &outboundpb.GrpcRoute_Distribution_Empty_{Empty: &outboundpb.GrpcRoute_Distribution_Empty{}}}
	for _, tc := range []struct {
		name string
		h    *hedgepb.Hedge
		want string
	}{
		{"no delay", &hedgepb.Hedge{MaxExtraLoad: 0.1}, "r.hedge.delay: required"},
		{"zero delay", &hedgepb.Hedge{Delay: &hedgepb.Hedge_Fixed{Fixed: durationpb.New(0)}}, "r.hedge.fixed"},
		{"percentile 100", &hedgepb.Hedge{Delay: &hedgepb.Hedge_Percentile{Percentile: 100}}, "r.hedge.percentile"},
		{"share past one", &hedgepb.Hedge{Delay: &hedgepb.Hedge_Percentile{Percentile: 90}, MaxExtraLoad: 2}, "r.hedge: maxExtraLoad"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := destination.DecodeGRPCRule(&outboundpb.GrpcRoute_Rule{Backends: empty, Hedge: tc.h}, "r")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// hasField reports whether the top level of a message's encoding has field
// number n.
func hasField(t *testing.T, b []byte, n protowire.Number) bool {
	t.Helper()
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		require.GreaterOrEqual(t, l, 0)
		b = b[l:]
		if num == n {
			return true
		}
		l = protowire.ConsumeFieldValue(num, typ, b)
		require.GreaterOrEqual(t, l, 0)
		b = b[l:]
	}
	return false
}
