// Package router holds the one Router that executes the route tables of
// both of Linkerd's routing models: ServiceProfiles (package profiles) and
// outbound policies (package policy, HTTPRoute and GRPCRoute). On the
// outbound side ([Router.Transport]) it selects the route, applies the
// filters, runs timeouts and retries through one exchange loop, picks the
// backend of the route's distribution and records the route metrics of the
// model: route_* for profiles, outbound_{http,grpc}_route_* for policies.
// On the inbound side ([Router.Handler]) it routes the server's own
// authorities by their ServiceProfiles. [Router.Explain] says why a
// request takes its route. One [Option] type configures both sides.
package router
