// Package profileroute is the ServiceProfile side of package router: it
// holds the route table of each authority a profile source delivers, and
// runs requests by it (route selection, timeouts, budgeted retries,
// the route_* metrics) on the outbound side ([Router.Transport],
// [Resolved.RoundTrip]) and the inbound side ([Router.Handler]). Package
// router is its only user and configures it from its own options.
package profileroute
