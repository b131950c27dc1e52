package destination_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/inmesh/inmesh/proxyapi/outlierpb"
)

// Outlier detection travels as field 1003 of Backend.BalanceP2c: a policy
// with it comes back equal from the wire, a Linkerd proxy sees only an
// unknown field it skips, and a bad value from the wire is refused naming
// the field.
func TestPolicyWireOutlierDetection(t *testing.T) {
	od := &policy.OutlierDetection{Interval: time.Second, BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second, MaxEjectionPercent: 20,
		SuccessRate:       &policy.SuccessRateEjection{StdevFactor: 1000, EnforcementPercentage: 100, MinimumHosts: 5, RequestVolume: 100},
		FailurePercentage: &policy.FailurePercentageEjection{Threshold: 10, EnforcementPercentage: 100, MinimumHosts: 5, RequestVolume: 50}}
	backend := policy.Backend{Meta: policy.Metadata{Group: "core", Kind: "Service", Namespace: "default", Name: "books", Port: 7000},
		Queue:    policy.Queue{Capacity: 100, FailFastTimeout: 3 * time.Second},
		Balancer: &policy.Balancer{Authority: "books.default.svc.cluster.local:7000", DefaultRTT: 30 * time.Millisecond, Decay: 10 * time.Second, Outlier: od}}
	route := policy.DefaultHTTPRoute(backend, nil, policy.Timeouts{})
	p := &policy.Policy{Parent: policy.Metadata{Group: "core", Kind: "Service", Namespace: "default", Name: "books", Port: 7000},
		Protocol: policy.ProtocolHTTP1, HTTP1: policy.HTTPProtocol{Routes: []policy.HTTPRoute{route}}}

	wire := marshal(t, destination.PolicyToProto(p))
	var m outboundpb.OutboundPolicy
	require.NoError(t, proto.Unmarshal(wire, &m))
	back, err := destination.PolicyFromProto(&m)
	require.NoError(t, err)
	got := back.HTTP1.Routes[0].Rules[0].Backends.Backends[0].Backend.Balancer
	assert.Equal(t, od, got.Outlier)

	// Field 1003 of the balancer, skipped as unknown by a reader without it.
	bl := &outboundpb.Backend_BalanceP2C{OutlierDetection: destination.OutlierToProto(od)}
	raw := marshal(t, bl)
	num, typ, n := protowire.ConsumeTag(raw)
	require.Positive(t, n)
	assert.Equal(t, protowire.Number(1003), num)
	assert.Equal(t, protowire.BytesType, typ)
	require.Equal(t, len(raw), n+protowire.ConsumeFieldValue(num, typ, raw[n:]))

	// Without it, the balancer has none.
	p.HTTP1.Routes[0].Rules[0].Backends.Backends[0].Backend.Balancer.Outlier = nil
	back, err = destination.PolicyFromProto(destination.PolicyToProto(p))
	require.NoError(t, err)
	assert.Nil(t, back.HTTP1.Routes[0].Rules[0].Backends.Backends[0].Backend.Balancer.Outlier)

	// A bad value is refused with its path.
	_, err = destination.DecodeOutlier(&outlierpb.OutlierDetection{MaxEjectionPercent: 150}, "balancer.outlier_detection")
	assert.EqualError(t, err, "balancer.outlier_detection.maxEjectionPercent: 150 is more than 100")
}
