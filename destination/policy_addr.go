package destination

import (
	"context"
	"net/netip"
	"reflect"
	"sync"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
)

// watchAddrPolicy watches the policy of an IP address as Linkerd's proxy
// discovers its original destination (linkerd/app/outbound/src/discover.rs,
// resolver): the OutboundPolicies API by address and GetProfile for
// authority, side by side. A policy from the API is delivered as it is.
// Where the API has none (NotFound: no Service has that clusterIP, as for
// a pod's address; or no answer), the profile decides: one that names an
// endpoint gives a policy that forwards to it (see endpointPolicy), any
// other answer none. The first update waits for both answers, unless the
// API's is a policy, so that a request that waits for discovery never goes
// out before the endpoint's identity is known. Both watches share the
// client's streams of their targets (the router watches the profile too).
func (c *Client) watchAddrPolicy(ctx context.Context, authority string, addr netip.AddrPort, update func(policy.Update)) (func(), error) {
	j := &addrPolicy{update: update}
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
	update func(policy.Update)

	mu       sync.Mutex
	pol      *policy.Update     // the API's last answer; nil before the first
	profiled bool               // the profile answered
	ep       *endpoint.Endpoint // the profile's endpoint, nil when none
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
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.profiled && sameEndpoint(ep, j.ep) {
		return // nothing that the policy is made of changed
	}
	j.profiled, j.ep = true, ep
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
