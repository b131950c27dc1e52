package authz

import (
	"net/http"
	"net/netip"

	"github.com/inmesh/inmesh/identity"
)

// Explanation says how a port's policy would treat a request, without
// serving it: the Server, the route the request selects, and the
// authorization that admits it, or why it would be refused.
type Explanation struct {
	// Server is the Server in force on the port.
	Server Meta `json:"server"`
	// Route is the route the request selects; nil when none does.
	Route *Meta `json:"route,omitempty"`
	// Authorization admits the request; nil when none does.
	Authorization *Meta `json:"authorization,omitempty"`
	// Decision is "allow", "deny" (403) or "no route" (404).
	Decision string `json:"decision"`
	// RateLimit and MaxConcurrentRequests are the Server's limits, checked
	// after an allow.
	RateLimit             *RateLimit `json:"rate_limit,omitempty"`
	MaxConcurrentRequests int        `json:"max_concurrent_requests,omitempty"`
}

// Explain says how the policy of port would treat r from client, whose
// verified identity is peer (a zero Peer for a plaintext client). It
// starts the port's watch if the port was not seen yet, and changes no
// state: it takes no rate-limit token.
func (h *Handler) Explain(port uint16, r *http.Request, client netip.Addr, peer identity.Peer) Explanation {
	pol := h.port(port).cur.Load().pol
	s := pol.server
	e := Explanation{Server: s.Meta, RateLimit: s.RateLimit, MaxConcurrentRequests: s.MaxConcurrentRequests, Decision: "no route"}
	if pol.table == nil {
		return e
	}
	route, _ := pol.table.Select(r)
	if route == nil {
		return e
	}
	cr := &pol.routes[route.RouteIndex]
	rm := cr.meta
	e.Route = &rm
	if ai := cr.authorize(client.Unmap(), peer, h.cfg.noLocalhost); ai >= 0 {
		am := cr.authzs[ai].meta
		e.Authorization, e.Decision = &am, "allow"
	} else {
		e.Decision = "deny"
	}
	return e
}
