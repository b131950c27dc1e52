// Package requireid holds the rule by which inmesh's outbound stacks honour
// l5d-require-id, the request header (gRPC metadata) in which an
// application names the identity that the endpoint of its request must
// prove over mTLS, as Linkerd's outbound proxy honours it
// (linkerd/app/outbound/src/http/require_id_header.rs): the request goes
// out only when the identity its endpoint's connection verified in its
// handshake is the one named, and is refused unsent otherwise. Both
// orig-proto's Transport and meshgrpc's balancer use it.
package requireid

import (
	"strings"

	"github.com/inmesh/inmesh/identity"
)

// Want returns the identity that a value of l5d-require-id requires, as
// Linkerd's proxy parses it ([identity.ParseID]): a DNS-like name,
// lowercased, or a URI. A value that is no identity (an empty one, one
// with spaces, a name with a trailing dot) requires nothing: Linkerd's
// proxy removes the header and sends the request as it would without it.
func Want(v string) (string, bool) {
	return identity.ParseID(v)
}

// Satisfied reports whether an endpoint whose connections verified the
// identity found ("": none, plaintext) satisfies the required identity
// want: a DNS-like name in any ASCII case, as Linkerd compares names; a
// URI identity exactly. Nothing satisfies a requirement on an endpoint
// that proves no identity.
func Satisfied(want, found string) bool {
	if found == "" {
		return false
	}
	if strings.IndexByte(want, ':') >= 0 { // a URI identity; a DNS-like one has no colon
		return want == found
	}
	return strings.EqualFold(want, found)
}

// Reason is the reason a request requiring want is refused by an endpoint
// that proves found ("": none), for l5d-proxy-error or a gRPC status.
func Reason(want, found string) string {
	msg := "identity required: " + want + ", the endpoint proves "
	if found == "" {
		return msg + "no identity (plaintext)"
	}
	return msg + found
}
