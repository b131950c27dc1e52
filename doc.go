// Package inmesh is an in-process service-mesh data plane: the features of
// Linkerd's proxy as composable net/http middleware.
//
// The work is done by the sub-packages, each usable alone:
//
//   - [github.com/inmesh/inmesh/destination]: clients of Linkerd's
//     Destination API (endpoints and service profiles) and OutboundPolicies
//     API, and the conversions between their wire messages and the models.
//
//   - [github.com/inmesh/inmesh/controlplane]: the embedded control plane:
//     the Destination and OutboundPolicies server, fed from ServiceProfile
//     YAML, static endpoints and Gateway API manifests, and the Identity
//     issuer.
//
//   - [github.com/inmesh/inmesh/profiles]: the service-profile model and its
//     compiler to a route table.
//
//   - [github.com/inmesh/inmesh/router]: the one Router, which routes,
//     retries, times out and records each request by the ServiceProfile or
//     the outbound policy of its destination.
//
//   - [github.com/inmesh/inmesh/orig-proto] (package origproto): HTTP/1
//     between mesh peers over one multiplexed HTTP/2 connection, and back.
//
//   - [github.com/inmesh/inmesh/backoff]: the backoff policy, dialer and
//     retry loop used by every reconnecting client.
//
//   - [github.com/inmesh/inmesh/classify]: response classification and the
//     request and response metrics.
//
// See the README for the quick start and the package map.
package inmesh
