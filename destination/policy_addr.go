package destination

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"sync"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// watchAddrPolicy watches the policy of an IP address as Linkerd's proxy
// discovers its original destination (linkerd/app/outbound/src/discover.rs,
// resolver): the OutboundPolicies API by address and GetProfile for
// authority, side by side. A policy from the API is delivered as it is.
// Where the API has none (NotFound: no Service has that clusterIP, as for
// a pod's address; or no answer), the profile decides: one that names an
// endpoint gives a policy that forwards to it (see endpointPolicy); where
// the API answered NotFound or is not served (Unimplemented), a profile
// answer that names none (a profile without endpoint, NotFound or a
// rejection) gives a policy that forwards to addr itself, with no
// identity, as Linkerd's proxy forwards to the original destination; a
// profile that cannot come (the control plane unreachable, the client's
// bound) gives the API's answer. The first
// update waits for both answers, unless the API's is a policy, so that a
// request that waits for discovery never goes out before the endpoint's
// identity is known. Both watches share the client's streams of their
// targets (the router watches the profile too).
func (c *Client) watchAddrPolicy(ctx context.Context, authority string, addr netip.AddrPort, update func(policy.Update)) (func(), error) {
	j := &addrPolicy{addr: addr, update: update}
	stopPolicy, err := c.WatchPolicy(ctx, TrafficSpec{Addr: addr}, j.policy)
	if err != nil {
		return nil, err
	}
	stopProfile, err := c.Watch(ctx, authority, j.profile)
	if err != nil {
		// No profile can come (too many watches): the API's answers alone.
		j.profile(profiles.Update{Err: err})
		return stopPolicy, nil
	}
	return func() {
		stopPolicy()
		stopProfile()
	}, nil
}

// addrPolicy joins the policy and profile answers of an address. Its
// methods are the watches' update functions; they deliver under mu, so
// that updates leave in the order their answers were joined.
type addrPolicy struct {
	addr   netip.AddrPort
	update func(policy.Update)

	mu       sync.Mutex
	pol      *policy.Update     // the API's last answer; nil before the first
	profiled bool               // the profile answered
	ep       *endpoint.Endpoint // the profile's endpoint, nil when none
	// none: the control plane's answer for the profile names no endpoint
	// (a profile without one, or an error status it sent).
	none bool
}

func (j *addrPolicy) policy(u policy.Update) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.pol = &u
	j.deliverLocked()
}

func (j *addrPolicy) profile(u profiles.Update) {
	var ep *endpoint.Endpoint
	if u.Profile != nil {
		ep = u.Profile.Endpoint
	}
	// A rejection is the control plane's answer: it has no profile. An
	// unreachable control plane or a refused watch said nothing.
	none := ep == nil && (u.Err == nil || errors.Is(u.Err, ErrRejected))
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.profiled && sameEndpoint(ep, j.ep) && none == j.none {
		return // nothing that the policy is made of changed
	}
	j.profiled, j.ep, j.none = true, ep, none
	if j.pol != nil && j.pol.Policy != nil {
		return // the Service's policy applies; the profile does not count
	}
	j.deliverLocked()
}

// deliverLocked delivers the joined answer, when there is one.
func (j *addrPolicy) deliverLocked() {
	switch {
	case j.pol == nil:
		// The API has not answered yet.
	case j.pol.Policy != nil:
		j.update(*j.pol)
	case !j.profiled:
		// No policy: the profile's endpoint may give one.
	case j.ep != nil:
		j.update(policy.Update{Policy: endpointPolicy(*j.ep)})
	case j.none && (j.pol.Err == nil || status.Code(j.pol.Err) == codes.Unimplemented):
		// No policy (NotFound, or a control plane without the API) and
		// no endpoint: the address itself, its identity unknown.
		j.update(policy.Update{Policy: endpointPolicy(endpoint.Endpoint{Addr: j.addr, Weight: endpoint.DefaultWeight})})
	default:
		j.update(*j.pol)
	}
}

// sameEndpoint reports whether a and b are the same endpoint, labels
// included; nil is no endpoint.
func sameEndpoint(a, b *endpoint.Endpoint) bool {
	if a == nil || b == nil {
		return a == b
	}
	return reflect.DeepEqual(*a, *b)
}

// endpointPolicy is the policy Linkerd's proxy synthesizes for an address
// whose profile names its endpoint (linkerd/app/outbound/src/discover.rs,
// synthesize_forward_policy): every request, HTTP/1 or HTTP/2, by one
// route named "endpoint" (default metadata), without filters, timeouts or
// retries, to one forward backend, the endpoint with its identity,
// protocol hint and labels.
func endpointPolicy(ep endpoint.Endpoint) *policy.Policy {
	meta := policy.DefaultMetadata("endpoint")
	backend := policy.Backend{Meta: meta, Forward: &ep}
	routes := []policy.HTTPRoute{{
		Meta: meta,
		Rules: []policy.HTTPRule{{
			Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{Weight: 1, Backend: backend}}},
		}},
	}}
	return &policy.Policy{
		Parent:   meta,
		Protocol: policy.ProtocolDetect,
		HTTP1:    policy.HTTPProtocol{Routes: routes},
		HTTP2:    policy.HTTPProtocol{Routes: routes},
		Opaque:   policy.OpaqueProtocol{Routes: []policy.OpaqueRoute{{Meta: meta, Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{Weight: 1, Backend: backend}}}}}},
	}
}
