package destination_test

import (
	"testing"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/proxyapi/mirrorpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A GRPCRoute rule's request mirrors travel in field 1002 of
// GrpcRoute.Rule, as an HTTPRoute rule's do in HttpRoute.Rule, and come
// back as they went; a rule without mirrors has no field 1002; a bad
// mirror fails its rule, naming the field.
func TestGRPCMirrorsOverTheWire(t *testing.T) {
	parent := policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "echo", Port: 50051}
	backend := policy.Backend{Meta: parent, Balancer: &policy.Balancer{Authority: "echo.ns.svc.cluster.local:50051"}}
	mirrors := []policy.Mirror{{Meta: policy.Metadata{Group: "core", Kind: "Service", Namespace: "ns", Name: "shadow", Port: 50052},
		Authority: "shadow.ns.svc.cluster.local:50052", Ratio: policy.Ratio{Numerator: 1, Denominator: 4}}}
	dist := policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{Backend: backend}}}
	p := &policy.Policy{Parent: parent, Protocol: policy.ProtocolGRPC, GRPC: policy.GRPCProtocol{Routes: []policy.GRPCRoute{{
		Meta:  policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "GRPCRoute", Namespace: "ns", Name: "r"},
		Rules: []policy.GRPCRule{{Backends: dist, Mirrors: mirrors}, {Backends: dist}},
	}}}}
	m := destination.PolicyToProto(p)
	rules := m.GetProtocol().GetGrpc().GetRoutes()[0].GetRules()
	assert.True(t, hasField(t, marshal(t, rules[0]), 1002), "field 1002 carries the mirror")
	assert.False(t, hasField(t, marshal(t, rules[1]), 1002), "no mirror, no field")
	back, err := destination.PolicyFromProto(m)
	require.NoError(t, err)
	got := back.GRPC.Routes[0].Rules
	assert.Equal(t, mirrors, got[0].Mirrors)
	assert.Nil(t, got[1].Mirrors)
	_, err = policy.Compile(back, policy.Options{})
	require.NoError(t, err, "a gRPC route may mirror")

	empty := &outboundpb.GrpcRoute_Distribution{Kind: &outboundpb.GrpcRoute_Distribution_Empty_{Empty: &outboundpb.GrpcRoute_Distribution_Empty{}}}
	_, err = destination.DecodeGRPCRule(&outboundpb.GrpcRoute_Rule{Backends: empty,
		InmeshRequestMirrors: []*mirrorpb.RequestMirror{{Metadata: rules[0].GetInmeshRequestMirrors()[0].GetMetadata()}}}, "r")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "r.inmesh_request_mirrors[0]: one of dst and forward is required")
}
