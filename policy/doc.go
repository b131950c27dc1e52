// Package policy holds the OutboundPolicy model of inmesh: the routes that
// Linkerd's OutboundPolicies API (and Gateway API HTTPRoute and GRPCRoute
// resources behind it) give a target, as plain Go data. A [Policy] names its
// parent resource and protocol and carries [HTTPRoute]s or [GRPCRoute]s, each
// with host matches and rules; a rule has request matches, [Filter]s (header
// modifiers, redirects, failure injectors), a backend [Distribution],
// [Timeouts], a counted [Retry] policy and the l5d-* header switch.
//
// The model is plain data: the package imports no protobuf and no control
// plane (destination.PolicyFromProto decodes the wire form of Linkerd's
// OutboundPolicies API into it; a forward backend's address is an
// endpoint.Endpoint of package github.com/inmesh/inmesh/balancer/endpoint).
// [Compile] turns a Policy into an immutable [Table] whose Select picks the
// route of a request by best match, exactly as Linkerd's proxy does, not
// first match:
//
//   - a route with host matches applies only to the hosts it names, and beats
//     every route without host matches; an exact host beats a suffix
//     (*.example.com), a longer exact host or suffix beats a shorter one;
//   - then the rule whose best matching condition has the longest path match
//     (exact, prefix and regex compared only by the number of bytes matched: an
//     exact or prefix match counts its own length, a regex the whole path); then
//     more header matches; then more query-parameter matches; then a method
//     match;
//   - ties go to the earlier route, then the earlier rule.
//
// A regex must match the whole path; a prefix matches whole segments ("/foo"
// matches "/foo" and "/foo/x", not "/foobar"; a trailing "/" is ignored); a
// rule with no matches matches every request like the prefix "/". gRPC rules
// compare the rpc service, then method (either may be empty: any), then the
// header count. Selection does not allocate.
//
// The package knows no control plane and no router: the destination package
// feeds it, the router executes its tables.
package policy
