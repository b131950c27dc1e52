package authz

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/inmesh/inmesh/policy"
)

// Mode is a default inbound policy: what a port that no Server describes
// allows, as Linkerd's config.linkerd.io/default-inbound-policy names it.
type Mode string

// The default inbound policies.
const (
	AllUnauthenticated     Mode = "all-unauthenticated"
	AllAuthenticated       Mode = "all-authenticated"
	ClusterUnauthenticated Mode = "cluster-unauthenticated"
	ClusterAuthenticated   Mode = "cluster-authenticated"
	Deny                   Mode = "deny"
	Audit                  Mode = "audit"
)

// ParseMode returns the mode named s, or an error.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case AllUnauthenticated, AllAuthenticated, ClusterUnauthenticated, ClusterAuthenticated, Deny, Audit:
		return m, nil
	}
	return "", fmt.Errorf("default inbound policy: %q is not one of all-unauthenticated, all-authenticated, cluster-unauthenticated, cluster-authenticated, deny, audit", s)
}

// DefaultClusterNetworks are the cluster networks of Linkerd's policy
// controller when none are configured.
var DefaultClusterNetworks = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
}

// AllNetworks are every IPv4 and IPv6 address.
var AllNetworks = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// DefaultOptions shape the default Server of a mode.
type DefaultOptions struct {
	// ClusterNetworks are the networks of the cluster-* modes; nil means
	// [DefaultClusterNetworks].
	ClusterNetworks []netip.Prefix
	// ProbePaths are the paths of the kubelet's HTTP probes of the port;
	// with ProbeNetworks, they make a "probe" route that admits GET
	// requests for them from ProbeNetworks without authentication, so
	// that probes pass whatever the mode.
	ProbePaths []string
	// ProbeNetworks the probe route admits; none means no probe route.
	ProbeNetworks []netip.Prefix
	// Protocol of the port (ProtocolDetect by default).
	Protocol Protocol
}

// DefaultServer returns the Server Linkerd's policy controller sends for a
// port that no Server describes under mode: named group "", kind
// "default", the mode's name; one authorization of the same name (none for
// deny): all networks or the cluster networks, unauthenticated or any
// DNS-like mesh identity (audit: all networks, unauthenticated, logged);
// the route "default" matching every path with no authorizations of its
// own; and, with probe paths and networks, the route "probe".
func DefaultServer(mode Mode, opts DefaultOptions) (*Server, error) {
	if _, err := ParseMode(string(mode)); err != nil {
		return nil, err
	}
	cluster := opts.ClusterNetworks
	if cluster == nil {
		cluster = DefaultClusterNetworks
	}
	s := &Server{Meta: DefaultMeta(string(mode)), Protocol: opts.Protocol}
	anyIdentity := Authentication{MeshTLS: &MeshTLS{Suffixes: [][]string{{}}}}
	switch mode {
	case AllUnauthenticated, Audit:
		s.Authorizations = []Authz{{Meta: DefaultMeta(string(mode)), Networks: networks(AllNetworks)}}
	case AllAuthenticated:
		s.Authorizations = []Authz{{Meta: DefaultMeta(string(mode)), Networks: networks(AllNetworks), Authentication: anyIdentity}}
	case ClusterUnauthenticated:
		s.Authorizations = []Authz{{Meta: DefaultMeta(string(mode)), Networks: networks(cluster)}}
	case ClusterAuthenticated:
		s.Authorizations = []Authz{{Meta: DefaultMeta(string(mode)), Networks: networks(cluster), Authentication: anyIdentity}}
	}
	s.Routes = DefaultRoutes(opts.ProbePaths, opts.ProbeNetworks)
	return s, nil
}

// DefaultRoutes returns the routes of a Server without routes of its own:
// "default", every path, no authorizations of its own; and "probe", GET of
// each probe path (its query dropped, "/" when empty) admitted from
// probeNetworks without authentication, when both are given.
func DefaultRoutes(probePaths []string, probeNetworks []netip.Prefix) []Route {
	routes := []Route{{
		Meta:  DefaultMeta("default"),
		Rules: []Rule{{Matches: []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: "/"}}}}},
	}}
	if len(probePaths) == 0 || len(probeNetworks) == 0 {
		return routes
	}
	probe := Route{
		Meta:           DefaultMeta("probe"),
		Rules:          []Rule{{}},
		Authorizations: []Authz{{Meta: DefaultMeta("probe"), Networks: networks(probeNetworks)}},
	}
	seen := map[string]bool{}
	for _, p := range probePaths {
		p, _, _ = strings.Cut(p, "?")
		if p == "" {
			p = "/"
		}
		if seen[p] {
			continue
		}
		seen[p] = true
		probe.Rules[0].Matches = append(probe.Rules[0].Matches,
			policy.HTTPRouteMatch{Method: "GET", Path: &policy.PathMatch{Kind: policy.PathExact, Value: p}})
	}
	return append(routes, probe)
}

func networks(ps []netip.Prefix) []Network {
	out := make([]Network, len(ps))
	for i, p := range ps {
		out[i] = Network{Net: p}
	}
	return out
}

// AnnotationMaxConcurrentRequests is the pod or Server annotation that sets
// [Server.MaxConcurrentRequests]: a positive integer (inmesh's own; Linkerd
// has no per-Server concurrency limit).
const AnnotationMaxConcurrentRequests = "inmesh.io/max-concurrent-requests"

// MaxConcurrentRequestsFrom returns the limit that annotations set with
// [AnnotationMaxConcurrentRequests]; zero when absent.
func MaxConcurrentRequestsFrom(annotations map[string]string) (int, error) {
	v, ok := annotations[AnnotationMaxConcurrentRequests]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("annotations[%q]: %q is not a positive integer", AnnotationMaxConcurrentRequests, v)
	}
	return n, nil
}
