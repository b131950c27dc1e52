package policy

import (
	"fmt"

	"github.com/inmesh/inmesh/balancer/endpoint"
)

// Mirror sends a copy of a rule's requests to another backend and
// discards its response: the Gateway API's RequestMirror filter of
// HTTPRoute and GRPCRoute, with the percent and fraction of newer
// versions. Linkerd's
// proxy has no such filter; inmesh carries it beside Linkerd's fields,
// where a Linkerd proxy does not look.
//
// The copy is the request as the rule's filters leave it (header
// modifiers applied), before the backend's own filters, sent once per
// request (never per retry) with its Host set to the mirror's authority.
// A mirror never delays or fails the request it copies.
type Mirror struct {
	// Meta names the mirror backend; its fields become the backend_*
	// labels of outbound_{http,grpc}_route_mirror_requests_total.
	Meta Metadata
	// Authority is the host:port whose endpoints the Destination API's Get
	// returns: the mirror is balanced as any backend is. Exactly one of
	// Authority and Forward is set.
	Authority string
	// Forward is the one address of a mirror without discovery.
	Forward *endpoint.Endpoint
	// Ratio is the share of the rule's requests that are mirrored; the
	// zero Ratio means all of them, a zero Numerator over a positive
	// Denominator none.
	Ratio Ratio
}

// Target returns where the copies go: the authority, or the forward
// address.
func (m *Mirror) Target() string {
	if m.Forward != nil {
		return m.Forward.Addr.String()
	}
	return m.Authority
}

// checkMirrors validates the mirrors of a rule.
func checkMirrors(ms []Mirror, path string, opts Options) error {
	if len(ms) == 0 {
		return nil
	}
	if len(ms) > opts.MaxMatches {
		return fmt.Errorf("%s: %d mirrors is more than the limit of %d", path, len(ms), opts.MaxMatches)
	}
	for i, m := range ms {
		mpath := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case m.Authority == "" && m.Forward == nil:
			return fmt.Errorf("%s: one of authority and forward is required", mpath)
		case m.Authority != "" && m.Forward != nil:
			return fmt.Errorf("%s: both authority and forward set", mpath)
		case m.Forward != nil && !m.Forward.Addr.IsValid():
			return fmt.Errorf("%s.forward: not an address", mpath)
		}
		if r := m.Ratio; r.Denominator == 0 && r.Numerator != 0 || r.Numerator > r.Denominator && r.Denominator != 0 {
			return fmt.Errorf("%s.ratio: %d/%d is not a share between 0 and 1", mpath, r.Numerator, r.Denominator)
		}
	}
	return nil
}
