// Package meshgrpc brings grpc-go clients and servers into the mesh through
// grpc-go's own extension points.
//
// A client joins with
//
//	conn, err := grpc.NewClient("inmesh:///books.default.svc.cluster.local:7000",
//		meshgrpc.DialOptions(dst, meshgrpc.WithIdentity(local))...)
//
// where dst is a [destination.Client]: the resolver (scheme "inmesh") follows
// the authority's endpoints from the Destination API, the balancer picks an
// endpoint by power of two choices over peak-EWMA load with failure accrual
// (the logic of package balancer; a call is load on its endpoint until its
// first response message, so a long stream that has begun is not), the
// interceptors apply the authority's
// GRPCRoute policy (deadline, counted retries on gRPC codes, failure
// injection, request mirrors of unary calls, Linkerd's
// outbound_grpc_route_* metrics), or the HTTPRoutes of a Service without
// GRPCRoutes, and the transport credentials speak mTLS to every endpoint
// that has an identity. The policy comes from [destination.Client.Policies],
// as the HTTP router's does: a target that is an IP literal within
// [destination.WithSearchNetworks] gets its Service's policy (a clusterIP)
// or the forward to its profile's endpoint (a pod's address), or to the
// address itself when the control plane knows neither; its own endpoints
// are never asked of the Destination API's Get, which refuses an IP. An IP
// literal outside those networks is never looked up: its calls go to the
// address itself, in plaintext, as the HTTP stack's requests do.
//
// A call whose metadata names in l5d-require-id ([RequireIDMetadata]) the
// identity its endpoint must prove is sent, without that metadata, only to
// an endpoint whose connection verified that identity in its mTLS
// handshake, as Linkerd's outbound proxy and the HTTP stack honour the
// header; otherwise it fails UNAVAILABLE unsent. The metadata is removed
// from every call, honoured or not, after routing, and the balancer checks
// each attempt against the endpoint it picks.
//
// A GRPCRoute marked idempotent with a hedge delay (the hedge.inmesh.io
// annotations) hedges its unary calls, and its server-streaming and bidi
// calls until their response headers: after the delay a second attempt goes
// to an endpoint the call has not tried, within the route's share of extra
// load, and gRFC A6's rules decide which attempt is the call's (an answer or
// a fatal status ends the call; UNAVAILABLE and the route's retry codes do
// not).
//
// A server joins with
//
//	srv := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithIdentity(local))...)
//
// which records Linkerd's inbound metrics, terminates mTLS, puts the caller's
// verified identity in the context (identity.PeerFromContext, as in the HTTP
// stack) and, with [WithInboundPolicy], enforces the port's authorizations
// and rate limits.
//
// The package is built from the others of the module and holds no second copy
// of their rules.
package meshgrpc
