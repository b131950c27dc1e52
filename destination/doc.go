// Package destination holds the clients of Linkerd's control-plane APIs: a
// [Client] of the Destination API (io.linkerd.proxy.destination.Destination)
// that watches the endpoints (Get) and service profiles (GetProfile) of
// authorities over one gRPC connection, and, through [Client.Policies], of
// the OutboundPolicies API. The embedded servers of these APIs are in
// package [github.com/inmesh/inmesh/controlplane].
//
// The Client is a [profiles.Source] and, through WatchEndpoints, a source
// of endpoints for package [github.com/inmesh/inmesh/balancer]. It keeps one stream per watched
// authority, shared by every caller; re-subscribes with backoff after any
// stream end or error, keeping the last state in force meanwhile; treats
// InvalidArgument and FailedPrecondition as "no profile" and stops; says
// at once "no such service, no profile, no policy" for a target the control
// plane answers does not exist (NotFound, or GetProfile's Unknown "not
// found"), and keeps asking; counts a GetProfile stream that sends nothing
// before a deadline as failed; keeps a silent Get stream open, as "exists,
// no endpoints yet" (what Linkerd's controller means by it) for an
// authority never answered and with the last endpoints in force after a
// reconnect; and tells the watchers of a profile or policy that no answer
// can come yet (a control plane without the API, one that refuses the
// caller or cannot be reached), so that nobody waits for one.
//
// The package is the one place where wire messages become models and back,
// for the clients here and the servers of the control plane alike:
// [ProfileFromProto] and [ProfileToProto] for the profiles model,
// [PolicyFromProto] and [PolicyToProto] for the policy model (the
// OutboundPolicies API, [Client.WatchPolicy]), and [EndpointFromProto] and
// [EndpointToProto] for the endpoints of both, each decoding error naming
// the field at fault. The models themselves import no protobuf.
//
// The wire types are in package [destinationpb] and its siblings; they use
// Linkerd's proto names, so the Client works against a Linkerd control
// plane and a Linkerd proxy works against the embedded control plane.
package destination
