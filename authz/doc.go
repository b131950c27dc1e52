// Package authz is inbound policy for Go services, with Linkerd's semantics:
// the Servers of a pod's ports, their authorizations (client networks and
// mesh TLS identities), their HTTP routes with route-level authorizations
// and filters, and local rate limits, as plain data ([Server]); a compiler
// that validates it ([Compile]); and a [Handler] that enforces the current
// policy of each port on every request.
//
// A request is authorized on its own, never by its connection: a path with
// a dot-segment or an encoded '/' or '.' is refused (400, beyond Linkerd,
// so that a path is authorized as the application reads it); the best
// route is chosen (none: 404), then the route's authorizations, the
// Server's and the pod's own loopback are tried in that order, any one
// admitting it (none: 403); then the route's filters apply; then the rate
// limits (429) and the Server's in-flight limit (503). Denials are answered
// with an empty body, as gRPC statuses to gRPC requests, and counted in
// Linkerd's metric families (inbound_http_authz_allow_total,
// inbound_http_authz_deny_total, inbound_http_route_not_found_total,
// inbound_http_local_ratelimit_total) with Linkerd's label values.
//
// Linkerd's proxy authorizes only opaque, TLS and other non-HTTP traffic
// per connection (inbound_tcp_authz_* families); HTTP it authorizes per
// request, as here. The Handler serves HTTP only, so a port whose Server
// says opaque or TLS has no HTTP routes, and its requests get 404, as
// Linkerd's proxy answers HTTP on a port whose policy has no HTTP routes.
//
// The package knows no protobuf and no control plane: a [Source] delivers
// Servers, however they were obtained.
package authz
