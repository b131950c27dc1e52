// Package endpoint holds the endpoint model that the balancer consumes and
// its sources produce: an [Endpoint] (address, weight, labels, identity and
// protocol hints), the [Set] of an authority's endpoints, one [Update] of an
// endpoints watch, and the [WeightedDst] of a traffic split.
//
// It is plain data and imports only the standard library, so that a model
// (a ServiceProfile's dst overrides, a policy backend's forward address), a
// source (the destination client, an endpoints file) and the balancer can
// all name these types without knowing one another.
package endpoint

import "net/netip"

// DefaultWeight is the weight of an endpoint that sets none, the
// Destination API's default; it is also 100% of a traffic split.
const DefaultWeight = 10000

// Endpoint describes one network endpoint of a destination.
type Endpoint struct {
	// Addr is the endpoint's IP address and port.
	Addr netip.AddrPort
	// Weight is the endpoint's relative share of traffic; [DefaultWeight]
	// is the default.
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

// Set is the state of an authority's endpoints, as a source of endpoints
// (the destination client's Get stream, a static source) knows it. It is
// immutable once published.
type Set struct {
	// Exists is false when the source says the service does not exist
	// (no_endpoints{exists: false}); a caller may then fall back to the
	// authority's own address.
	Exists bool
	// Endpoints, sorted by address. Empty with Exists true means the
	// service has no endpoints now: requests fail fast.
	Endpoints []Endpoint
}

// Update is one state of an endpoints watch.
type Update struct {
	// Set is the endpoint set now known, nil with Err.
	Set *Set
	// Err says why there is no set: the lookup was rejected, or the source
	// already watches as many authorities as it may.
	Err error
}

// WeightedDst is one target of a traffic split.
type WeightedDst struct {
	// Authority is the host:port to send the share to.
	Authority string
	// Weight is relative to the other targets; [DefaultWeight] is 100%.
	Weight uint32
}
