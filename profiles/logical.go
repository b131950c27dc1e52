package profiles

import (
	"net"
	"net/netip"
	"strings"
)

// LogicalAuthority returns where the requests to authority (host:port)
// that p routes go, when that is not authority itself: for an IP whose
// profile names its service (a Service's clusterIP), the service's fully
// qualified name with the authority's port, as Linkerd's proxy makes a
// profile's logical address (linkerd/service-profiles/src/proto.rs,
// convert_profile) and balances the requests a profile routes over it
// (linkerd/app/outbound/src/sidecar.rs, http/logical/profile.rs). It
// returns "" for a name, an IP whose profile names no service or names
// the IP itself, and a nil p.
func (p *Profile) LogicalAuthority(authority string) string {
	if p == nil || p.FullyQualifiedName == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(authority)
	if err != nil || port == "" {
		return ""
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return ""
	}
	name := strings.TrimSuffix(p.FullyQualifiedName, ".")
	if name == host {
		return "" // the profile of an IP named by the IP: nowhere else
	}
	return net.JoinHostPort(name, port)
}
