package destination

import (
	"github.com/inmesh/inmesh/balancer/endpoint"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
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

// EndpointSession is the decoder of one Get stream of c.
func EndpointSession(c *Client, authority string) func(*pb.Update) (endpoint.Update, bool) {
	return c.endpointSession(authority)
}
