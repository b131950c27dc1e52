package profiles

import (
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/hedge"
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
	DstOverrides []endpoint.WeightedDst
	// OpaqueProtocol says that traffic to this port is opaque TCP.
	OpaqueProtocol bool
	// Endpoint is set when the authority names one known endpoint rather
	// than a service.
	Endpoint *endpoint.Endpoint
}

// Route is one route of a profile.
type Route struct {
	// Condition selects the requests of the route; [Compile] leaves out a
	// route without one.
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
	// zero means none, and so does a negative one, which [Compile] leaves
	// out.
	Timeout time.Duration
	// Hedge is the route's hedging (beyond Linkerd, from the
	// ServiceProfile's hedge.inmesh.io annotations); nil means none. Its
	// hedges are bounded by the profile's retry budget too.
	Hedge *hedge.Policy
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

// ResponseClass marks the responses matching Condition as failures or
// successes.
type ResponseClass struct {
	Condition ResponseMatch
	IsFailure bool
}
