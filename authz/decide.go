package authz

import (
	"net/http"
	"net/netip"
	"strconv"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/policy"
)

// Conn is what a port's policy reads of the connection a request came on.
type Conn struct {
	// Local is the address the connection was accepted on: its port picks
	// the policy and it is what the target_* labels say, unless the
	// Handler has [WithTarget].
	Local netip.AddrPort
	// Remote is the client's address; its IP is what authorizations'
	// networks are matched against.
	Remote netip.AddrPort
	// Peer is the client's mesh TLS and verified identity, as the identity
	// layer in front of the policy found it (HasPeer). Without such a
	// layer (HasPeer false) the client is plaintext, labelled
	// tls="disabled".
	Peer    identity.Peer
	HasPeer bool
}

// Decision is what a port's policy decided of one request
// ([Handler.Decide]) and, once [Handler.Admit] let it through the limits,
// its place among the port's requests in flight, given back by
// [Decision.Done]. It is for servers that are not an http.Handler (such
// as grpc-go's); [Handler.ServeHTTP] decides through it too.
type Decision struct {
	// Status is 0 while the request is allowed; otherwise the HTTP status
	// the mesh answers it with: 400 (ambiguous path), 403 (no
	// authorization admits the client), 404 (no route), 429 (rate
	// limited), 503 (too many requests in flight), or the status of a
	// route's filter.
	Status int
	// Cause says why, in Linkerd's proxy's words ("unauthorized request
	// on route", "no route found for request", "total rate limit
	// exceeded: 10rps", ...).
	Cause string
	// Route is the route the request selected and Match how; nil when
	// none did. The route's filters apply to an allowed request, before
	// [Handler.Admit].
	Route *policy.Route
	Match policy.Match

	a              *active
	p              *port
	key            seriesKey
	client, target netip.AddrPort
	clientID       string // the verified identity the rate limits key on
	meshed         bool
	held           bool
	labels         *classify.Labels
	next           http.Handler // WithLabelledNext's handler for labels
}

// Labels are the allowed request's target, srv_*, route_*, authz_* and tls
// labels, for the inbound request and response metrics of the layers after
// the policy (classify.WithLabels); nil for a refused request.
func (d *Decision) Labels() *classify.Labels {
	if d.Status != 0 {
		return nil
	}
	return d.labels
}

// Message is what the mesh tells the client of a refusal, as Linkerd's
// proxy words its l5d-proxy-error: "client <ip:port>: server: <ip:port>:
// <cause>"; empty for clients that are not meshed (no TLS client
// identity), which Linkerd tells nothing.
func (d *Decision) Message() string {
	if !d.meshed || d.Status == 0 {
		return ""
	}
	return "client " + d.client.String() + ": server: " + d.target.String() + ": " + d.Cause
}

// Refuse makes d a refusal with status and cause, such as a route's
// failure injector answers.
func (d *Decision) Refuse(status int, cause string) {
	d.Status, d.Cause = status, cause
}

// Decide authorizes r, which came on c, under its port's current policy,
// and counts it in the authz metric families. While the port's first
// answer is pending, it waits for it ([WithPolicyWait]); a request whose
// context ends first is 503, as is one to a port the Source never answered
// for once the Handler is closed ([Handler.Close]). Then an ambiguous path is 400;
// no route 404; no authorization of the route, of the Server or of
// localhost admitting the client 403; otherwise Status is 0 and the
// route's filters are the caller's to apply before [Handler.Admit]. It
// allocates nothing when it allows.
func (h *Handler) Decide(r *http.Request, c Conn) Decision {
	target := h.cfg.target
	if !target.IsValid() {
		target = c.Local
	}
	p := h.port(target.Port())
	peer := c.Peer
	if p.pending.Load() {
		if p.wait(r.Context()) != nil {
			d := Decision{client: c.Remote, target: target, meshed: peer.TLS && peer.ID != ""}
			d.Refuse(http.StatusServiceUnavailable, causePolicyPending)
			return d
		}
	}
	a := p.cur.Load()
	if a.fallback != nil {
		h.in.unavailable.Add(r.Context(), a.fallback)
	}
	pol := a.pol
	ip := c.Remote.Addr().Unmap()
	d := Decision{a: a, p: p, client: c.Remote, target: target, clientID: peer.ID, meshed: peer.TLS && peer.ID != ""}
	d.key = seriesKey{target: target, tls: tlsOf(peer, c.HasPeer || h.cfg.meshTLS, ip)}
	if d.key.tls == tlsTrue {
		d.key.clientID = peer.ID
	}

	if r.URL != nil && (ambiguousPath(r.URL.Path, r.URL.RawPath) || pol.table.IsGRPC() && escapedPath(r)) {
		d.Refuse(http.StatusBadRequest, causeAmbiguousPath)
		return d
	}
	if pol.table != nil {
		d.Route, d.Match = pol.table.Select(r)
	}
	if d.Route == nil {
		d.key.fam = famNotFound
		a.series.add(d.key)
		d.Refuse(http.StatusNotFound, causeNoRoute)
		return d
	}
	cr := &pol.routes[d.Route.RouteIndex]
	d.key.route = d.Route.RouteIndex
	ai := cr.authorize(ip, peer, h.cfg.noLocalhost)
	if ai < 0 {
		d.key.fam = famDeny
		a.series.add(d.key)
		h.log.Info("deny "+cr.meta.Name, "Request denied", "server", pol.server.Meta.Name, "route", cr.meta.Name,
			"client.ip", ip.String(), "client.tls", peer.TLS, "client.id", peer.ID)
		d.Refuse(http.StatusForbidden, causeUnauthorized)
		return d
	}
	d.key.fam, d.key.authz = famAllow, ai
	e := a.series.add(d.key)
	d.labels, d.next = e.labels, e.next
	if cr.authzs[ai].audit {
		h.log.Info("audit "+cr.meta.Name, "Request allowed", "server", pol.server.Meta.Name, "route", cr.meta.Name,
			"authz", cr.authzs[ai].meta.Name, "client.ip", ip.String(), "client.tls", peer.TLS, "client.id", peer.ID)
	}
	return d
}

// Admit takes the request d allowed through the Server's rate limits,
// then its limit of requests in flight, counting a refusal in
// inbound_http_local_ratelimit_total (or inmesh's
// inbound_http_concurrency_limit_total). It returns false, with d's
// Status 429 or 503, when a limit refuses; after true the caller must
// call d.Done once the request has ended. A refused d (Status set) is not
// admitted.
func (h *Handler) Admit(d *Decision) bool {
	if d.Status != 0 || d.a == nil {
		return false
	}
	pol := d.a.pol
	if pol.limiter != nil {
		if scope, rps := pol.limiter.check(h.cfg.now(), d.clientID); scope != limitNone {
			d.key.fam, d.key.scope = famRateLimit, scope
			d.a.series.add(d.key)
			d.Refuse(http.StatusTooManyRequests, limitCause(scope, rps))
			return false
		}
	}
	if max := int64(pol.server.MaxConcurrentRequests); max > 0 {
		if d.p.inflight.Add(1) > max {
			d.p.inflight.Add(-1)
			d.key.fam = famConcurrency
			d.a.series.add(d.key)
			d.Refuse(http.StatusServiceUnavailable, "concurrency limit exceeded: "+strconv.FormatInt(max, 10)+" requests")
			return false
		}
		d.held = true
	}
	return true
}

// Done gives back the place among the port's requests in flight that
// [Handler.Admit] took; it does nothing the second time, or for a request
// that was not admitted.
func (d *Decision) Done() {
	if d.held {
		d.held = false
		d.p.inflight.Add(-1)
	}
}
