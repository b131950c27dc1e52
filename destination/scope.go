package destination

import (
	"context"
	"net/netip"
	"strings"
	"sync/atomic"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
)

// DefaultSearchSuffixes are the names the [Client] looks up unless
// [WithSearchSuffixes] says otherwise: the cluster's service names, as
// Linkerd's proxy does by default (LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES).
func DefaultSearchSuffixes() []string { return []string{"svc.cluster.local."} }

// WithSearchSuffixes sets the DNS suffixes of the authorities the client
// looks up (default [DefaultSearchSuffixes]); "." stands for every name. A
// name outside them is never sent to the control plane: its watch opens no
// stream and takes no room under [WithMaxWatches], and reports at once that
// there is no profile, no policy and no such service (a caller then uses
// the default route and the authority's own address). This keeps whatever
// Hosts an application sends from growing the control plane's and the
// client's state. Suffixes are matched on label boundaries, case-insensitive,
// with or without the trailing dot. No argument looks nothing up by name.
func WithSearchSuffixes(suffixes ...string) Option {
	return optionFunc(func(c *config) {
		c.suffixes = c.suffixes[:0:0]
		for _, s := range suffixes {
			c.suffixes = append(c.suffixes, strings.Trim(strings.ToLower(s), "."))
		}
	})
}

// WithSearchNetworks sets the networks whose IP-literal authorities the
// client looks up (default: none), as Linkerd's
// LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS; any other IP literal is
// outside the search path (see [WithSearchSuffixes]). Against Linkerd, give
// the cluster's pod and service networks: an address's policy is asked for
// by address, which gets a Service's clusterIP its Service's policy and a
// pod's IP its identity (see [Client.Policies]).
func WithSearchNetworks(networks ...netip.Prefix) Option {
	return optionFunc(func(c *config) { c.networks = append(c.networks[:0:0], networks...) })
}

// inScope reports whether authority is looked up. An authority that does
// not parse is: the control plane rejects it, as it would any other.
func (c *Client) inScope(a string) bool {
	host, _, err := authority.Split(a)
	if err != nil {
		return true
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		for _, n := range c.cfg.networks {
			if n.Contains(ip) {
				return true
			}
		}
		return false
	}
	for _, s := range c.cfg.suffixes {
		if s == "" || host == s || strings.HasSuffix(host, "."+s) {
			return true
		}
	}
	return false
}

// outOfScope answers a watch outside the search path with one update and no
// stream. It keeps nothing once the update is delivered: under a flood of
// names outside the path, every authority a router or balancer holds has
// such a watch, so it is a goroutine that ends, not a mailbox that stays.
func outOfScope[U any](c *Client, ctx context.Context, u U, update func(U)) func() {
	done := make(chan struct{})
	var stopped atomic.Bool
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(done)
		if !stopped.Load() && ctx.Err() == nil && c.ctx.Err() == nil {
			update(u)
		}
	}()
	return func() {
		stopped.Store(true)
		<-done
	}
}

// The updates a watch outside the search path gets.
var (
	noProfile = profiles.Update{}
	noService = endpoint.Update{Set: &endpoint.Set{Exists: false}}
	noPolicy  = policy.Update{}
)
