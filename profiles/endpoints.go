package profiles

// EndpointSet is the state of an authority's endpoints, as a source of
// endpoints (the destination client's Get stream, a static source) knows
// it. It is immutable once published.
type EndpointSet struct {
	// Exists is false when the source says the service does not exist
	// (no_endpoints{exists: false}); a caller may then fall back to the
	// authority's own address.
	Exists bool
	// Endpoints, sorted by address. Empty with Exists true means the
	// service has no endpoints now: requests fail fast.
	Endpoints []Endpoint
}

// EndpointsUpdate is one state of an endpoints watch.
type EndpointsUpdate struct {
	// Set is the endpoint set now known, nil with Err.
	Set *EndpointSet
	// Err says why there is no set (the lookup was rejected, or the source
	// watches too many authorities: [ErrTooManyWatches]).
	Err error
}
