package profiles

import (
	"net/netip"
	"time"
)

// Profile is the service profile of one destination authority. A Profile
// delivered by a [Source] must be treated as immutable.
type Profile struct {
	// FullyQualifiedName is the service name without the port, empty when
	// unknown.
	FullyQualifiedName string
	// Routes in match order: a request takes the first route whose
	// Condition matches, and the default route when none does.
	Routes []Route
	// RetryBudget bounds the retries of all routes of the profile; nil
	// means retries are disabled.
	RetryBudget *RetryBudget
	// DstOverrides split traffic across other authorities by weight.
	DstOverrides []WeightedDst
	// OpaqueProtocol says that traffic to this port is opaque TCP.
	OpaqueProtocol bool
	// Endpoint is set when the authority names one known endpoint rather
	// than a service.
	Endpoint *Endpoint
}

// Route is one route of a profile.
type Route struct {
	// Condition selects the requests of the route. It must not be nil.
	Condition RequestMatch
	// ResponseClasses in order: the first class whose condition matches a
	// response decides whether it is a failure.
	ResponseClasses []ResponseClass
	// Labels name the route's metrics; each becomes the label rt_<key>.
	Labels map[string]string
	// Retryable allows failed requests of the route to be retried under the
	// profile's retry budget.
	Retryable bool
	// Timeout bounds every request of the route, all attempts included;
	// zero means none.
	Timeout time.Duration
}

// RetryBudget bounds retries as a share of original requests, in the manner
// of Linkerd and Finagle.
type RetryBudget struct {
	// RetryRatio is the number of retries allowed per original request
	// (0.2: one retry for every five requests).
	RetryRatio float32
	// MinRetriesPerSecond are allowed whatever the ratio.
	MinRetriesPerSecond uint32
	// TTL is how long an original request counts toward the ratio.
	TTL time.Duration
}

// DefaultRetryBudget returns the budget a control plane sends for a service
// whose profile sets none: 20% extra, 10 retries a second, a 10 s window.
func DefaultRetryBudget() RetryBudget {
	return RetryBudget{RetryRatio: 0.2, MinRetriesPerSecond: 10, TTL: 10 * time.Second}
}

// WeightedDst is one target of a traffic split.
type WeightedDst struct {
	// Authority is the host:port to send the share to.
	Authority string
	// Weight is relative to the other targets; 10000 is 100%.
	Weight uint32
}

// ResponseClass marks the responses matching Condition as failures or
// successes.
type ResponseClass struct {
	Condition ResponseMatch
	IsFailure bool
}

// Endpoint describes one network endpoint of a destination.
type Endpoint struct {
	// Addr is the endpoint's IP address and port.
	Addr netip.AddrPort
	// Weight is the endpoint's relative share of traffic; 10000 is the
	// default.
	Weight uint32
	// Labels are metric labels of the endpoint (exported with a dst_
	// prefix). They include the labels of the set the endpoint came in.
	Labels map[string]string
	// Identity is the endpoint's expected TLS identity, empty when unknown.
	Identity string
	// ServerName is the TLS server name to send, when it differs from
	// Identity.
	ServerName string
	// H2 is the protocol hint that the endpoint is a mesh peer accepting
	// HTTP/2, so that HTTP/1 requests may be upgraded (orig-proto).
	H2 bool
	// Opaque is the protocol hint that the endpoint's traffic is opaque.
	Opaque bool
	// OpaqueTransportPort, when not zero, is the peer's inbound port for
	// the opaque transport.
	OpaqueTransportPort uint32
	// AuthorityOverride, when set, replaces the request's authority.
	AuthorityOverride string
}
