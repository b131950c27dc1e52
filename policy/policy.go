package policy

import (
	"github.com/inmesh/inmesh/hedge"
	"net/http"
	"strings"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"google.golang.org/grpc/codes"
)

// Policy is the outbound policy of one target. A Policy delivered by a
// source must be treated as immutable.
type Policy struct {
	// Parent is the resource the policy belongs to (a Service or an
	// EgressNetwork); its fields become the parent_* metric labels.
	Parent Metadata
	// Protocol says what the target speaks and which of the route lists
	// below apply.
	Protocol Protocol
	// DetectTimeout bounds protocol detection when Protocol is
	// [ProtocolDetect].
	DetectTimeout time.Duration
	// HTTP1 holds the routes of HTTP/1 traffic ([ProtocolDetect] and
	// [ProtocolHTTP1]); HTTP2 those of HTTP/2 traffic ([ProtocolDetect] and
	// [ProtocolHTTP2]).
	HTTP1, HTTP2 HTTPProtocol
	// GRPC holds the routes of [ProtocolGRPC].
	GRPC GRPCProtocol
	// Opaque holds the routes of [ProtocolOpaque], and of the traffic
	// that [ProtocolDetect] finds is not HTTP. The router sends no TCP
	// itself; these routes are carried for the proxies a control plane
	// serves.
	Opaque OpaqueProtocol
}

// OpaqueProtocol is the route list of opaque (TCP) traffic.
type OpaqueProtocol struct {
	Routes []OpaqueRoute
}

// OpaqueRoute is one route of opaque traffic: every connection goes to its
// backends (filters on them are ignored), unless the route forbids it.
type OpaqueRoute struct {
	Meta     Metadata
	Backends Distribution
	// Forbidden refuses every connection of the route (an
	// opaque_route.Forbidden filter on its rule): Linkerd's policy
	// controller answers so for a port that a Service does not declare,
	// and Linkerd's proxy then closes the connection ("forbidden TCP
	// route"). The router refuses the requests of a target whose opaque
	// policy forbids them: see [Table.Forbidden].
	Forbidden bool
}

// DefaultOpaqueRoute returns the route "opaq" that Linkerd's controller
// synthesises for the opaque traffic of a Service: every connection to
// backend.
func DefaultOpaqueRoute(backend Backend) OpaqueRoute {
	return OpaqueRoute{
		Meta:     DefaultMetadata("opaq"),
		Backends: Distribution{Kind: DistributionFirstAvailable, Backends: []RouteBackend{{Backend: backend}}},
	}
}

// Protocol is the kind of traffic a target carries.
type Protocol uint8

// The protocols of an OutboundPolicy. The zero value is ProtocolDetect.
const (
	ProtocolDetect Protocol = iota // HTTP/1 or HTTP/2, by detection
	ProtocolHTTP1
	ProtocolHTTP2
	ProtocolGRPC
	ProtocolOpaque // TCP; no HTTP routes apply
	ProtocolTLS    // TLS passthrough; no HTTP routes apply
)

var protocolNames = [...]string{"detect", "http1", "http2", "grpc", "opaque", "tls"}

// String returns the protocol's name as the proto oneof spells it.
func (p Protocol) String() string {
	if int(p) < len(protocolNames) {
		return protocolNames[p]
	}
	return "unknown"
}

// HTTPProtocol is the route list of HTTP/1 or HTTP/2 traffic.
type HTTPProtocol struct {
	Routes []HTTPRoute
	// FailureAccrual configures the backends' circuit breakers; nil means
	// none.
	FailureAccrual *FailureAccrual
}

// GRPCProtocol is the route list of gRPC traffic.
type GRPCProtocol struct {
	Routes         []GRPCRoute
	FailureAccrual *FailureAccrual
}

// Metadata names the resource a piece of policy came from. For
// configuration without a resource (the controller's default routes), Kind
// is "default", Group is empty and Name says which default it is; see
// [DefaultMetadata].
type Metadata struct {
	Group, Kind, Namespace, Name, Section string
	// Port is the resource's port; zero when none.
	Port uint16
}

// DefaultMetadata returns the metadata of configuration that no resource
// backs, such as the route "http" that Linkerd's controller synthesises
// when a Service has no routes.
func DefaultMetadata(name string) Metadata { return Metadata{Kind: "default", Name: name} }

// IsDefault reports whether m names no resource.
func (m Metadata) IsDefault() bool { return m.Kind == "default" && m.Group == "" }

// HostMatch matches the host of a request's authority, without its port,
// ignoring ASCII case. The zero value matches the empty host only.
type HostMatch struct {
	// Exact is the host to match, when Suffix is false. A host that does not
	// end with "." also matches the same host with a trailing ".".
	Exact string
	// Suffix makes this a wildcard match: ReverseLabels holds the labels
	// after "*." in reverse order ("*.example.com" is ["com", "example"]),
	// and the host must have at least one more label in front of them.
	Suffix        bool
	ReverseLabels []string
}

// ParseHostMatch returns the match of a Gateway API hostname:
// "*.example.com" is a suffix match, anything else an exact one.
func ParseHostMatch(host string) HostMatch {
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		var labels []string
		for {
			i := strings.LastIndexByte(rest, '.')
			labels = append(labels, rest[i+1:])
			if i < 0 {
				break
			}
			rest = rest[:i]
		}
		return HostMatch{Suffix: true, ReverseLabels: labels}
	}
	return HostMatch{Exact: host}
}

// HTTPRoute is one HTTP route (an HTTPRoute resource) of a policy.
type HTTPRoute struct {
	// Meta names the route; its fields become the route_* metric labels.
	Meta Metadata
	// Hosts restrict the route to requests for these hosts; empty means any
	// host.
	Hosts []HostMatch
	// Rules of the route; a route with no rules matches nothing.
	Rules []HTTPRule
}

// HTTPRule is one rule of an HTTP route.
type HTTPRule struct {
	// Matches select the requests of the rule: any one of them may match,
	// and the best one counts. No matches means every request, as the path
	// prefix "/".
	Matches []HTTPRouteMatch
	// Filters apply, in order, to the requests of the rule.
	Filters []Filter
	// Backends say where the requests go.
	Backends Distribution
	// Timeouts of the rule's requests.
	Timeouts Timeouts
	// Retry is the counted retry policy; nil means no retries.
	Retry *Retry
	// AllowL5dRequestHeaders lets the l5d-retry-* and l5d-*-timeout request
	// headers override Retry and Timeouts.
	AllowL5dRequestHeaders bool
	// Hedge is the rule's hedging (beyond Linkerd); nil means none.
	Hedge *hedge.Policy
	// Mirrors copy the rule's requests to other backends (beyond Linkerd:
	// the Gateway API's RequestMirror filter); see [Mirror].
	Mirrors []Mirror
}

// HTTPRouteMatch holds when every condition it sets holds.
type HTTPRouteMatch struct {
	// Path is the path condition; nil means none (it counts as the prefix
	// "/" when comparing matches).
	Path *PathMatch
	// Headers must all match.
	Headers []HeaderMatch
	// QueryParams must all match.
	QueryParams []QueryParamMatch
	// Method is the request method to match, case-sensitive; empty means
	// any.
	Method string
}

// PathMatch is a condition on the request path (as sent, without the
// query).
type PathMatch struct {
	Kind PathKind
	// Value is the path, prefix or regular expression (Go RE2 syntax, which
	// must match the whole path).
	Value string
}

// PathKind is the kind of a [PathMatch] or of the path part of a [Match].
type PathKind uint8

// The kinds of path match. The zero value is PathPrefix.
const (
	PathPrefix PathKind = iota
	PathExact
	PathRegex
)

var pathKindNames = [...]string{"prefix", "exact", "regex"}

// String returns "prefix", "exact" or "regex".
func (k PathKind) String() string {
	if int(k) < len(pathKindNames) {
		return pathKindNames[k]
	}
	return "unknown"
}

// HeaderMatch holds when one value of the named header equals Value (bytes
// compared), or, when Regex is set, when Value as a regular expression
// matches one whole value made of visible ASCII. The name is
// case-insensitive; "Host" names the request's host.
type HeaderMatch struct {
	Name  string
	Value string
	Regex bool
}

// QueryParamMatch holds when one parameter of the query has the name and a
// value equal to Value, or matched whole by Value as a regular expression
// when Regex is set. Names and values are compared after form decoding
// ("+" is a space, %XX a byte).
type QueryParamMatch struct {
	Name  string
	Value string
	Regex bool
}

// GRPCRoute is one gRPC route (a GRPCRoute resource) of a policy.
type GRPCRoute struct {
	Meta  Metadata
	Hosts []HostMatch
	Rules []GRPCRule
}

// GRPCRule is one rule of a gRPC route; see [HTTPRule]. Its filters may be
// request header modifiers and gRPC failure injectors.
type GRPCRule struct {
	// Matches select the calls of the rule; no matches means every request.
	Matches                []GRPCRouteMatch
	Filters                []Filter
	Backends               Distribution
	Timeouts               Timeouts
	Retry                  *Retry
	AllowL5dRequestHeaders bool
	Hedge                  *hedge.Policy
	// Mirrors copy the rule's calls to other backends (the GRPCRoute
	// RequestMirror filter); see [Mirror].
	Mirrors []Mirror
}

// GRPCRouteMatch holds for POST requests to the rpc whose headers all
// match.
type GRPCRouteMatch struct {
	// Service is the full service name (pkg.Service); empty means any.
	Service string
	// Method is the method name; empty means any.
	Method  string
	Headers []HeaderMatch
}

// Filter is one filter of a rule or a backend: exactly one of its fields
// is set. HTTP rules take every kind but GRPCFailureInjector; gRPC rules
// take RequestHeaders and GRPCFailureInjector.
type Filter struct {
	RequestHeaders      *HeaderModifier
	ResponseHeaders     *HeaderModifier
	Redirect            *Redirect
	FailureInjector     *FailureInjector
	GRPCFailureInjector *GRPCFailureInjector
}

// HeaderModifier edits headers: Add appends values, then Set replaces
// them, then Remove deletes headers.
type HeaderModifier struct {
	Add, Set []Header
	Remove   []string
}

// Header is one header field.
type Header struct {
	Name, Value string
}

// Apply edits h: add, then set, then remove.
func (m *HeaderModifier) Apply(h http.Header) {
	for _, f := range m.Add {
		foldInto(h, f.Name)
		h.Add(f.Name, f.Value)
	}
	for _, f := range m.Set {
		foldInto(h, f.Name)
		h.Set(f.Name, f.Value)
	}
	for _, name := range m.Remove {
		foldInto(h, name)
		h.Del(name)
	}
}

// foldInto moves the values of keys of h that differ from name's
// canonical form only in case (a header set on an http.Header by map
// assignment) under the canonical key, so that the header is modified
// whatever case the request used, as header names are case-insensitive.
func foldInto(h http.Header, name string) {
	ck := http.CanonicalHeaderKey(name)
	for k, vs := range h {
		if k != ck && len(k) == len(ck) && strings.EqualFold(k, ck) {
			h[ck] = append(h[ck], vs...)
			delete(h, k)
		}
	}
}

// Redirect answers requests with a redirect to the same URL with the
// fields it sets replaced.
type Redirect struct {
	// Scheme replaces the scheme; empty keeps it.
	Scheme string
	// Host replaces the host; empty keeps it.
	Host string
	// Port replaces the port; zero keeps it.
	Port uint16
	// Path rewrites the path; nil keeps it.
	Path *PathModifier
	// Status is the redirect's status code; zero means 301.
	Status int
}

// StatusCode returns the status code of the redirect: Status, or 301.
func (r *Redirect) StatusCode() int {
	if r.Status == 0 {
		return http.StatusMovedPermanently
	}
	return r.Status
}

// PathModifier rewrites a path: to Full when Prefix is false, else by
// replacing the part a prefix match matched with Full.
type PathModifier struct {
	Full   string
	Prefix bool
}

// FailureInjector answers a share of requests with an error response
// whose l5d-proxy-error header carries Message.
type FailureInjector struct {
	Status  int
	Message string
	// Ratio is the share of requests that fail; the zero Ratio means all.
	Ratio Ratio
}

// GRPCFailureInjector fails a share of calls with the gRPC status Code and
// Message (grpc-message).
type GRPCFailureInjector struct {
	Code    codes.Code
	Message string
	Ratio   Ratio
}

// Ratio is Numerator/Denominator, a probability. The zero Ratio means 1
// (always); otherwise Denominator must be positive and Numerator at most
// Denominator.
type Ratio struct {
	Numerator, Denominator uint32
}

// Probability returns the ratio as a number in [0, 1].
func (r Ratio) Probability() float64 {
	if r.Denominator == 0 {
		return 1
	}
	return float64(r.Numerator) / float64(r.Denominator)
}

// Distribution spreads the requests of a rule over backends.
type Distribution struct {
	Kind DistributionKind
	// Backends of a first-available or random-available distribution; at
	// least one.
	Backends []RouteBackend
}

// DistributionKind is how a [Distribution] picks a backend.
type DistributionKind uint8

// The distribution kinds. The zero value is DistributionEmpty.
const (
	// DistributionEmpty has no backends: requests fail.
	DistributionEmpty DistributionKind = iota
	// DistributionFirstAvailable uses the first backend that is ready.
	DistributionFirstAvailable
	// DistributionRandomAvailable picks among ready backends at random by
	// weight.
	DistributionRandomAvailable
)

var distributionNames = [...]string{"empty", "first_available", "random_available"}

// String returns the distribution's name as the proto oneof spells it.
func (k DistributionKind) String() string {
	if int(k) < len(distributionNames) {
		return distributionNames[k]
	}
	return "unknown"
}

// RouteBackend is one backend of a distribution.
type RouteBackend struct {
	Backend Backend
	// Weight is the backend's share in a random-available distribution,
	// relative to the others; ignored otherwise.
	Weight uint32
	// Filters apply to the requests sent to this backend, after the rule's.
	Filters []Filter
}

// Backend is a destination of requests: a load balancer over the endpoints
// of an authority, or one forward address. A backend with neither fails
// its requests, as Linkerd's proxy does.
type Backend struct {
	// Meta names the backend; its fields become the backend_* metric
	// labels.
	Meta     Metadata
	Balancer *Balancer
	Forward  *endpoint.Endpoint
	Queue    Queue
}

// Balancer balances requests over the endpoints that the Destination API's
// Get returns for Authority, by power of two choices over peak EWMA load.
type Balancer struct {
	// Authority is the name to resolve, host:port.
	Authority string
	// DefaultRTT is the latency assumed of an endpoint before any is
	// observed; Decay is the EWMA window.
	DefaultRTT, Decay time.Duration
	// Penalty, when not nil, selects the 429-aware load estimator.
	Penalty *LoadPenalty
	// Outlier, when not nil, ejects outlier endpoints (inmesh only).
	Outlier *OutlierDetection
}

// LoadPenalty adds a latency penalty to an endpoint that answers with
// overload (429, RESOURCE_EXHAUSTED). PenaltyDecay is carried as the
// control plane sends it; the balancer ignores it, as Linkerd's proxy
// does (a penalty fades with the RTT estimate's Decay).
type LoadPenalty struct {
	Penalty, MaxRetryAfter, PenaltyDecay time.Duration
}

// Queue bounds the requests waiting for a backend.
type Queue struct {
	Capacity uint32
	// FailFastTimeout is how long the backend may stay unready before its
	// queued requests fail.
	FailFastTimeout time.Duration
}

// Timeouts of a rule; zero fields mean none.
type Timeouts struct {
	// Request bounds the whole exchange, both streams.
	Request time.Duration
	// Response bounds the time from the end of the request to the end of
	// the response.
	Response time.Duration
	// Idle bounds the time without any frame in either direction.
	Idle time.Duration
}

// The defaults of a [Retry], the values Linkerd's policy controller sends.
const (
	DefaultMaxRetries      = 1
	DefaultMaxRequestBytes = 64 << 10
)

// DefaultRetryBackoff returns the backoff between retries of a [Retry]
// that sets none: 25 ms doubling to 250 ms, with full jitter.
func DefaultRetryBackoff() backoff.Policy {
	return backoff.Policy{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond, Jitter: 1}
}

// Retry is the counted retry policy of a rule. Its zero value retries once,
// requests of up to 64 KiB, with the default backoff, and only after an
// error (fail-fast, a per-try timeout, REFUSED_STREAM): it lists no
// retryable response status. Linkerd's policy controller never sends zero
// limits, so zero limits mean defaults.
type Retry struct {
	// MaxRetries is the number of retries after the first attempt; zero
	// means [DefaultMaxRetries].
	MaxRetries uint32
	// MaxRequestBytes is the largest request body that is kept for retries;
	// zero means [DefaultMaxRequestBytes].
	MaxRequestBytes uint32
	// StatusRanges are the retryable response statuses; empty means none,
	// as in Linkerd, whose controller sends no range for a route without
	// a retry.linkerd.io/http annotation.
	StatusRanges []StatusRange
	// GRPCCodes are the retryable statuses of a gRPC call; empty means
	// none.
	GRPCCodes []codes.Code
	// Timeout bounds each attempt from the end of its request body until
	// its response headers, so a slow upload does not count; zero means
	// none. The last attempt is not bounded.
	Timeout time.Duration
	// Backoff is the wait between attempts; nil means
	// [DefaultRetryBackoff].
	Backoff *backoff.Policy
}

// StatusRange is an inclusive range of HTTP status codes.
type StatusRange struct {
	Start, End uint16
}

// Limit returns the number of retries allowed after the first attempt.
func (r *Retry) Limit() int {
	if r.MaxRetries == 0 {
		return DefaultMaxRetries
	}
	return int(r.MaxRetries)
}

// BodyLimit returns the largest request body that may be retried.
func (r *Retry) BodyLimit() int64 {
	if r.MaxRequestBytes == 0 {
		return DefaultMaxRequestBytes
	}
	return int64(r.MaxRequestBytes)
}

// BackoffPolicy returns the wait between attempts.
func (r *Retry) BackoffPolicy() backoff.Policy {
	if r.Backoff == nil {
		return DefaultRetryBackoff()
	}
	return *r.Backoff
}

// RetryableStatus reports whether an HTTP rule retries a response with
// this status code.
func (r *Retry) RetryableStatus(code int) bool {
	for _, s := range r.StatusRanges {
		if code >= int(s.Start) && code <= int(s.End) {
			return true
		}
	}
	return false
}

// RetryableCode reports whether a gRPC rule retries a call that ended with
// this status code.
func (r *Retry) RetryableCode(c codes.Code) bool {
	for _, rc := range r.GRPCCodes {
		if rc == c {
			return true
		}
	}
	return false
}

// FailureAccrual configures the circuit breaker of each endpoint:
// exactly one of Consecutive and Unified is set.
type FailureAccrual struct {
	Consecutive *ConsecutiveFailures
	Unified     *UnifiedAccrual
	// MinReadyEndpoints is the number of endpoints of a pool that are never
	// ejected; zero means no floor.
	MinReadyEndpoints uint32
}

// ConsecutiveFailures trips an endpoint's breaker after MaxFailures
// failures in a row (zero disables it), for a time that Backoff grows.
type ConsecutiveFailures struct {
	MaxFailures uint32
	Backoff     backoff.Policy
}

// UnifiedAccrual trips an endpoint's breaker when its success rate over
// Window falls below SuccessRateThreshold (after MinRequests requests), or
// after MaxConsecutiveFailures failures in a row. A zero threshold or
// count disables that dimension.
type UnifiedAccrual struct {
	SuccessRateThreshold   float64
	Window                 time.Duration
	MinRequests            uint32
	MaxConsecutiveFailures uint32
	Backoff                backoff.Policy
}

// DefaultHTTPRoute returns the route Linkerd's policy controller sends for
// a Service that no HTTPRoute targets: named "http" (route_kind="default",
// route_name="http"), one rule matching the prefix "/", all traffic to
// backend, with the Service's retry policy (nil for none) and timeouts.
func DefaultHTTPRoute(backend Backend, retry *Retry, timeouts Timeouts) HTTPRoute {
	return HTTPRoute{
		Meta: DefaultMetadata("http"),
		Rules: []HTTPRule{{
			Matches:  []HTTPRouteMatch{{Path: &PathMatch{Kind: PathPrefix, Value: "/"}}},
			Backends: Distribution{Kind: DistributionFirstAvailable, Backends: []RouteBackend{{Backend: backend}}},
			Timeouts: timeouts,
			Retry:    retry,
		}},
	}
}
