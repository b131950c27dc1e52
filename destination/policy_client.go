package destination

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"google.golang.org/grpc"
)

// PolicyWorkloadEnv is the environment variable in which Linkerd's proxy
// injector passes the workload string of the OutboundPolicies API.
const PolicyWorkloadEnv = "LINKERD2_PROXY_POLICY_WORKLOAD"

// PolicyWorkload returns the workload string of a pod, {"ns":..,"pod":..},
// for [WithWorkload].
func PolicyWorkload(namespace, pod string) string {
	b, _ := json.Marshal(struct {
		NS  string `json:"ns"`
		Pod string `json:"pod"`
	}{namespace, pod})
	return string(b)
}

// defaultWorkload is the workload string sent without [WithWorkload]: that
// of $LINKERD2_PROXY_POLICY_WORKLOAD, or else a pod named by this host in
// the namespace "default". Linkerd's controller refuses a watch without
// one.
var defaultWorkload = sync.OnceValue(func() string {
	if w := os.Getenv(PolicyWorkloadEnv); w != "" {
		return w
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "inmesh"
	}
	return PolicyWorkload("default", host)
})

// TrafficSpec is the target of an OutboundPolicies watch: an authority
// (host:port) or, when Authority is empty, an address.
type TrafficSpec struct {
	Authority string
	Addr      netip.AddrPort
}

// key is the key of t's watch: the authority itself (the caller's
// string, not a copy: a client holds thousands), or "addr=ip:port". An
// authority that starts as a key of another form would is marked
// "authority=" (see [Client.trafficSpec]).
func (t TrafficSpec) key() (string, error) {
	switch {
	case t.Authority != "":
		if strings.HasPrefix(t.Authority, "addr=") || strings.HasPrefix(t.Authority, "authority=") {
			return "authority=" + t.Authority, nil
		}
		return t.Authority, nil
	case t.Addr.IsValid():
		return "addr=" + t.Addr.String(), nil
	}
	return "", errors.New("destination: a TrafficSpec needs an authority or an address")
}

func (c *Client) initPolicies(cc grpc.ClientConnInterface) {
	c.policyAPI = outboundpb.NewOutboundPoliciesClient(cc)
	rl := ratelog.New(c.cfg.logger, 10*time.Second)
	c.policies = &watches[*outboundpb.OutboundPolicy, policy.Update]{
		c: c,
		kind: &kind[*outboundpb.OutboundPolicy, policy.Update]{
			name: "OutboundPolicies.Watch",
			open: func(ctx context.Context, key string, s sink[*outboundpb.OutboundPolicy], opts ...grpc.CallOption) (recvStream[*outboundpb.OutboundPolicy], error) {
				if c.mux != nil {
					if ok, err := subscribeMux(ctx, c.mux, watchespb.Kind_POLICY, c.trafficSpec(key), s, opts); ok || err != nil {
						return nil, err
					}
				}
				return c.policyAPI.Watch(ctx, c.trafficSpec(key), opts...)
			},
			decode: func(key string, _ policy.Update, _ bool, m *outboundpb.OutboundPolicy) (policy.Update, bool) {
				authority := key
				if strings.HasPrefix(key, "authority=") || strings.HasPrefix(key, "addr=") {
					authority = ""
				}
				p, err := decodePolicy(m, authority)
				if err != nil {
					rl.WarnErr("policy "+key, "rejected an outbound policy; keeping the last one", err, "target", policyTarget(key))
					return policy.Update{}, false
				}
				return policy.Update{Policy: p}, true
			},
			rejected: func(err error) policy.Update { return policy.Update{Err: err} },
			// "unknown target": no policy, as for a name outside the
			// search path; the profile and the defaults apply.
			notFound:   func() policy.Update { return noPolicy },
			unanswered: func(err error) policy.Update { return policy.Update{Err: err} },
		},
		m: make(map[string]*watch[*outboundpb.OutboundPolicy, policy.Update]),
	}
}

func (c *Client) trafficSpec(key string) *outboundpb.TrafficSpec {
	spec := &outboundpb.TrafficSpec{SourceWorkload: c.workload()}
	if a, ok := strings.CutPrefix(key, "authority="); ok {
		spec.Target = &outboundpb.TrafficSpec_Authority{Authority: a}
	} else if a, ok := strings.CutPrefix(key, "addr="); ok {
		ap, _ := netip.ParseAddrPort(a)
		spec.Target = &outboundpb.TrafficSpec_Addr{Addr: AddrToProto(ap)}
	} else {
		spec.Target = &outboundpb.TrafficSpec_Authority{Authority: key}
	}
	return spec
}

// policyTarget names the target of a policy watch's key in a log line:
// "authority=host:port" or "addr=ip:port".
func policyTarget(key string) string {
	if strings.HasPrefix(key, "authority=") || strings.HasPrefix(key, "addr=") {
		return key
	}
	return "authority=" + key
}

// WatchPolicy streams the outbound policy of target from the
// OutboundPolicies API, with the semantics of [policy.Source]: one stream
// per target however many watch it, re-established with backoff after any
// end or error, the last good policy in force meanwhile; a policy that
// fails to convert or compile is logged (rate-limited) with the field at
// fault and skipped. When the control plane rejects the target
// (InvalidArgument, FailedPrecondition) the last update has a nil Policy
// and an Err wrapping [ErrRejected]. Targets are bounded by
// [WithMaxWatches] (past it: [policy.ErrTooManyWatches]) and released
// [WithIdleTimeout] after their last watcher left.
func (c *Client) WatchPolicy(ctx context.Context, target TrafficSpec, update func(policy.Update)) (func(), error) {
	key, err := target.key()
	if err != nil {
		return nil, err
	}
	if target.Authority != "" && !c.inScope(target.Authority) {
		return outOfScope(c, ctx, noPolicy, update), nil
	}
	stop, err := c.policies.subscribe(c, ctx, key, update)
	if errors.Is(err, errTooManyWatches) {
		return nil, fmt.Errorf("%w: %w", policy.ErrTooManyWatches, err)
	}
	return stop, err
}

// Policies returns the client as a [policy.Source] of the policies of
// authorities, for a router. A name is asked for as an authority. An IP
// literal within [WithSearchNetworks] is asked for as an address, as
// Linkerd's proxy asks for its original destination: Linkerd's policy
// controller answers a Service's clusterIP with the Service's policy, and
// a name-less IP sent as an authority NotFound. Where it has no policy for
// the address, the address's profile from GetProfile decides, as in
// Linkerd's proxy: when the profile names an endpoint (the control plane
// knows the workload at that address) the source delivers a policy that
// forwards every request to that endpoint, with its identity, protocol
// hint and labels; when it names none (or there is no profile), one that
// forwards every request to the address itself, with no identity. A
// control plane that cannot be reached gives none.
func (c *Client) Policies() policy.Source { return policySource{c} }

type policySource struct{ c *Client }

func (s policySource) Watch(ctx context.Context, authority string, update func(policy.Update)) (func(), error) {
	if addr, ok := ipAuthority(authority); ok {
		if !s.c.inScope(authority) {
			return outOfScope(s.c, ctx, noPolicy, update), nil
		}
		return s.c.watchAddrPolicy(ctx, authority, addr, update)
	}
	return s.c.WatchPolicy(ctx, TrafficSpec{Authority: authority}, update)
}

// ipAuthority returns the address an IP-literal authority (ip:port) names.
func ipAuthority(a string) (netip.AddrPort, bool) {
	host, port, err := authority.Split(a)
	if err != nil {
		return netip.AddrPort{}, false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)), true
}
