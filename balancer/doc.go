// Package balancer sends each request to one endpoint of its authority:
// power of two choices over a peak-EWMA load estimate, as Linkerd and
// Finagle balance.
//
// A [Balancer] learns the endpoints of each authority from a [Source]: the
// destination client's Get stream (destination.Client is a Source), or a
// [StaticSource] for a program without a control plane. The endpoints are
// the plain data of package github.com/inmesh/inmesh/balancer/endpoint,
// which models and sources share without knowing the balancer. With a
// [SplitSource] ([WithSplits]) it also applies each authority's traffic
// split (a [Split]), such as the dst overrides of its ServiceProfile
// (profiles.Splits). The balancer knows no control plane and no routing
// model.
//
// A request goes to its endpoint with the Host its caller sent, whatever
// authority it was balanced over (a router's backend, a split's target),
// as Linkerd's proxy sends the application's authority; only an endpoint's
// AuthorityOverride replaces it, and then the request also loses its
// l5d-dst-canonical header. Its metrics are labelled by the authority it
// was balanced over.
//
// Each endpoint's load is its round-trip-time estimate times the number of
// its requests in flight plus one. A new endpoint starts at a default RTT
// (30 ms); a response slower than the estimate to its first body chunk
// raises it at once, a faster one pulls it down by an exponential average
// with a 10 s time constant, and the estimate decays while the endpoint is
// idle. A request stays in flight until the first chunk of its response
// body (or the body's end, failure or closing, if that comes first), as
// in Linkerd's balancer: a long stream that has begun is not load. A
// request that fails without a response (connection refused or reset)
// counts as a penalty RTT (5 s), not as a fast answer. A request its
// caller gives up before its response head (a timeout, a cancellation)
// counts as a sample of the time it waited, so an endpoint too slow for
// its callers looks slow. A request whose
// connection the endpoint refused was not sent, so it goes to another
// endpoint in rotation, up to [MaxRefusedConnects] in all, when its body
// can be sent again. Two endpoints are
// drawn at random by weight; the second wins only when its load is clearly
// lower (by a quarter), so that endpoints of about equal load share traffic
// by weight while a real difference in load decides otherwise.
//
// Everything a request reads (the split, the endpoint set and its weights)
// is one immutable snapshot behind an atomic pointer; updates build a new
// snapshot and never block requests. Load statistics are kept across
// updates for the endpoints that stay.
//
// # Endpoint health
//
// With [WithFailureAccrual] an endpoint that fails trips: consecutive
// failures, or in unified mode also a success rate below a threshold, in
// which a rate limit (429, RESOURCE_EXHAUSTED) counts against it. A
// failure is what Linkerd's breaker counts: a response that the classifier
// of the request's route (package classify, whose default rules apply
// without a route) classifies as a failure, a response stream that fails,
// and a request failing without a response. By the default rules a gRPC
// call fails with UNKNOWN, DEADLINE_EXCEEDED, PERMISSION_DENIED, INTERNAL,
// UNAVAILABLE or DATA_LOSS, in the headers or trailers, whatever its HTTP
// status, and succeeds without a status; a plain HTTP request fails with
// a 5xx. The verdict is taken when the response body ends; a body its
// caller drops before the end counts as it stood (the class of its head;
// a gRPC call without its status, a success). A tripped endpoint gets
// nothing for its penalty, then exactly one probe; a good answer restores
// it, a bad one trips it again for a penalty that doubles (jittered) up
// to the maximum. The ejection floor
// keeps a number of endpoints in rotation whatever they answer.
//
// A router's policy backend may carry its own failure accrual, queue and
// load penalties ([BackendConfig], [WithBackendConfig]). The authority is
// then balanced under each configuration apart, as a Linkerd proxy gives
// each backend its own balancer: the endpoints' loads and health belong to
// one configuration, so a request under another neither sees nor resets
// them, and a probe is answered under the configuration that sent it.
//
// A request holds its authority until its response body ends: an
// authority with a stream in flight is never idle, and its state (loads,
// health, queue, watches) outlives any idle timeout ([WithIdleTimeout]).
//
// With [WithPenaltyPeakEWMA] a response that signals overload (a 429, a
// 503 or another 5xx; a Trailers-Only gRPC RESOURCE_EXHAUSTED,
// UNAVAILABLE, UNKNOWN, DEADLINE_EXCEEDED, INTERNAL or DATA_LOSS) counts
// as an RTT sample of a penalty (5 s, or the estimate if higher) in place
// of its time, raised by a longer Retry-After (429, 503) or
// grpc-retry-pushback-ms (RESOURCE_EXHAUSTED, UNAVAILABLE; capped), never
// shortened by a shorter one, as Linkerd's load biaser does: the penalty
// is the estimate's new peak, which decays as any peak and which the
// endpoint's later fast answers pull down.
//
// When no endpoint of an authority is in rotation (all out of it, or none
// at all), requests wait in its queue ([WithQueue]: 100 requests, 3 s). A request still waiting at the
// failfast timeout gets a 504 carrying [ErrFailFast], one past the
// capacity a 503 carrying [ErrLoadShed] at once (as Linkerd's proxy
// answers them); [ResponseError] tells a
// router which. The first fail-fast puts the queue in failfast, as
// linkerd2-proxy's queue: the requests waiting then fail fast with it,
// and later ones get [ErrLoadShed] at once, until a request finds an
// endpoint in rotation (a probe after a breaker's penalty, a new
// endpoint). A fail-fast means the backend has nothing ready: a router
// may move a first-available distribution to its next backend and retry
// the request; a load shed is not retried.
//
// With [WithEndpointRemoved] the Balancer says when it is done with an
// endpoint's address: no authority's set holds it any more and its last
// request, counted until its response body ends, is over. A client closes
// its connections to it then, as Linkerd's proxy drops a removed
// endpoint's connections once its responses are done, rather than keep
// them until their idle timeout. Requests to the address of a forward
// backend ([WithForward]) and fallbacks to an IP address count too.
//
// [Balancer.Endpoints] and [Balancer.EndpointsHandler] report each
// endpoint's state. The outbound_http_balancer_* families (Linkerd's
// names) go to the provider of [WithMeterProvider].
package balancer
