package destination

import (
	"runtime"
	"time"
	"weak"

	"github.com/inmesh/inmesh/balancer/endpoint"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
)

// The decoders below are unexported; the tests of package destination_test
// reach them through these names.
var (
	DecodePolicy           = policyFromProto
	DecodeHTTPMatch        = httpMatchFromProto
	DecodeHTTPFilters      = httpFiltersFromProto
	DecodeRatio            = ratioFromProto
	DecodeTimeouts         = timeoutsFromProto
	DecodeHTTPDistribution = httpDistributionFromProto
	DecodeOutlier          = outlierFromProto
	OutlierToProto         = outlierToProto
	DecodeGRPCRule         = grpcRuleFromProto
	TargetAttr             = targetAttr
)

// PolicyRequest returns the OutboundPolicies request of c's watch of spec.
func PolicyRequest(c *Client, spec TrafficSpec) (*outboundpb.TrafficSpec, error) {
	key, err := spec.key()
	if err != nil {
		return nil, err
	}
	return c.trafficSpec(key), nil
}

// EndpointSession is the decoder of one Get stream of c: it holds what
// the stream published, as the stream's watch does.
func EndpointSession(c *Client, authority string) func(*pb.Update) (endpoint.Update, bool) {
	var prev endpoint.Update
	fresh := true
	return func(m *pb.Update) (endpoint.Update, bool) {
		u, ok := c.decodeEndpoints(authority, prev, fresh, m)
		if ok {
			prev, fresh = u, false
		}
		return u, ok
	}
}

// ProfileWatchCollected returns a probe that collects garbage and reports
// whether the profile watch authority has now (when the probe was made)
// has been freed.
func ProfileWatchCollected(c *Client, authority string) func() bool {
	c.profiles.mu.Lock()
	ref := weak.Make(c.profiles.m[authority])
	c.profiles.mu.Unlock()
	return func() bool {
		runtime.GC()
		return ref.Value() == nil
	}
}

// ProfileWatchIdleTimer returns the idle timer of the profile watch
// authority, nil while it has none (a subscriber, or not yet idle).
func ProfileWatchIdleTimer(c *Client, authority string) *time.Timer {
	c.profiles.mu.Lock()
	w := c.profiles.m[authority]
	c.profiles.mu.Unlock()
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.idleTimer
}
