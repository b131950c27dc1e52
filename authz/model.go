package authz

import (
	"net/netip"

	"github.com/inmesh/inmesh/policy"
)

// Meta names the resource a piece of inbound policy came from; its fields
// are printed as the srv_*, route_*, authz_* and ratelimit_* metric labels.
// Configuration that no resource backs (the defaults) has group "" and kind
// "default", see [DefaultMeta].
type Meta struct {
	Group string `json:"group"`
	Kind  string `json:"kind"`
	Name  string `json:"name"`
}

// DefaultMeta returns the metadata of configuration no resource backs.
func DefaultMeta(name string) Meta { return Meta{Kind: "default", Name: name} }

// IsDefault reports whether m names no resource.
func (m Meta) IsDefault() bool { return m.Group == "" && m.Kind == "default" }

func (m Meta) policyMeta() policy.Metadata {
	return policy.Metadata{Group: m.Group, Kind: m.Kind, Name: m.Name}
}

// Protocol is the protocol a Server declares for its port.
type Protocol uint8

// The protocols of a Server. The zero value is ProtocolDetect.
const (
	ProtocolDetect Protocol = iota
	ProtocolHTTP1
	ProtocolHTTP2
	ProtocolGRPC
	ProtocolOpaque
	ProtocolTLS
)

var protocolNames = [...]string{"detect", "http1", "http2", "grpc", "opaque", "tls"}

// String returns the protocol's name: "detect", "http1", "http2", "grpc",
// "opaque" or "tls".
func (p Protocol) String() string {
	if int(p) < len(protocolNames) {
		return protocolNames[p]
	}
	return "unknown"
}

// Server is the inbound policy of one port.
type Server struct {
	// Meta names the Server (srv_* labels).
	Meta Meta
	// Protocol of the port. Opaque and TLS ports carry no HTTP: the
	// Handler answers every request to them 404, as no route matches.
	Protocol Protocol
	// Authorizations admit clients to every route of the Server. None
	// means that only route-level authorizations and the pod's own
	// loopback admit.
	Authorizations []Authz
	// Routes of the port, chosen by best match (host, then path, method,
	// headers, query parameters, then the earlier route). A request no
	// route matches is answered 404. No routes means one route, "default",
	// matching every request, as Linkerd's proxy reads a Server sent
	// without routes.
	Routes []Route
	// GRPCRoutes are the routes of a gRPC Server (and only of one), chosen
	// by best match as Routes are. None means one route, "default",
	// matching every request.
	GRPCRoutes []GRPCRoute
	// RateLimit limits the requests of the port; nil means none. Like
	// Linkerd's, a gRPC Server takes no rate limit.
	RateLimit *RateLimit
	// MaxConcurrentRequests bounds the requests of the port in flight at
	// once; a request past it is answered 503 at once. Zero means no
	// bound. It is inmesh's own (Linkerd has only a proxy-wide bound), set
	// from the annotation [AnnotationMaxConcurrentRequests].
	MaxConcurrentRequests int
}

// invalidServer is the Server of [InvalidServer], known by its address.
var invalidServer = &Server{
	Meta:   DefaultMeta("invalid"),
	Routes: []Route{{Meta: DefaultMeta("invalid"), Rules: []Rule{{}}}},
}

// InvalidServer returns the Server in force on a port whose control plane
// sent one that cannot be used (it does not convert or compile), as
// Linkerd's proxy puts its invalid policy in force
// (linkerd/proxy/server-policy ServerPolicy::invalid, from
// linkerd/app/inbound/src/policy/api.rs): one route, named
// default:invalid, matching every request and admitting nobody, not even
// the pod's own loopback. Every request is refused 403 (gRPC
// PERMISSION_DENIED) until a valid Server arrives: a mistake in a policy
// closes the port rather than opening it to the default. The Server is
// shared and must not be modified; a copy of it is an ordinary Server,
// whose route the pod's own loopback may take.
func InvalidServer() *Server { return invalidServer }

// Route is one inbound HTTP route of a Server.
type Route struct {
	// Meta names the route (route_* labels).
	Meta Meta
	// Hosts restrict the route to requests for these hosts; empty means
	// any host.
	Hosts []policy.HostMatch
	// Rules of the route; a route with no rules matches nothing.
	Rules []Rule
	// Authorizations admit clients to this route, in addition to the
	// Server's.
	Authorizations []Authz
}

// Rule is one rule of an inbound route.
type Rule struct {
	// Matches select the requests of the rule, the best one counting;
	// none means every request.
	Matches []policy.HTTPRouteMatch
	// Filters apply in order to the authorized requests of the rule:
	// request header modifiers, redirects and failure injectors.
	Filters []policy.Filter
}

// GRPCRoute is one inbound gRPC route of a gRPC Server.
type GRPCRoute struct {
	// Meta names the route (route_* labels).
	Meta Meta
	// Hosts restrict the route to requests for these hosts; empty means
	// any host.
	Hosts []policy.HostMatch
	// Rules of the route; a route with no rules matches nothing.
	Rules []GRPCRule
	// Authorizations admit clients to this route, in addition to the
	// Server's.
	Authorizations []Authz
}

// GRPCRule is one rule of an inbound gRPC route.
type GRPCRule struct {
	// Matches select the calls of the rule; none means every request.
	Matches []policy.GRPCRouteMatch
	// Filters apply in order to the authorized calls of the rule: request
	// header modifiers and gRPC failure injectors.
	Filters []policy.Filter
}

// Authz admits the clients that connect from one of its networks and pass
// its authentication.
type Authz struct {
	// Meta names the authorization (authz_* labels).
	Meta Meta
	// Networks the client's IP must be in; at least one is required.
	Networks []Network
	// Authentication the client must pass.
	Authentication Authentication
}

// Network holds the addresses in Net and in none of Except.
type Network struct {
	Net    netip.Prefix
	Except []netip.Prefix
}

// Contains reports whether ip is in n.
func (n *Network) Contains(ip netip.Addr) bool {
	if !n.Net.Contains(ip) {
		return false
	}
	for _, e := range n.Except {
		if e.Contains(ip) {
			return false
		}
	}
	return true
}

// Authentication is what an [Authz] asks of a client: nothing when MeshTLS
// is nil (unauthenticated: plaintext and meshed clients alike), else mesh
// TLS as MeshTLS says.
type Authentication struct {
	MeshTLS *MeshTLS
}

// MeshTLS admits clients whose connection is mesh TLS terminated here.
type MeshTLS struct {
	// Unauthenticated admits any such client, with or without an
	// identity; the lists are then ignored.
	Unauthenticated bool
	// Identities admits a client whose verified identity equals one of
	// them.
	Identities []string
	// Suffixes admits a client whose verified identity is DNS-like and
	// ends with "." followed by the parts joined with dots ([a b] is
	// ".a.b"); a suffix with no parts admits every DNS-like identity.
	// SPIFFE (URI) identities match exact Identities only.
	Suffixes [][]string
}

// RateLimit is a Server's local rate limits, in requests per second; a
// zero rate is no limit. Each limiter allows bursts as large as its rate.
type RateLimit struct {
	// Meta names the limit (ratelimit_* labels).
	Meta Meta `json:"meta"`
	// Total limits all the requests of the port.
	Total uint32 `json:"total,omitempty"`
	// Identity limits the requests of each client identity; the clients
	// without an identity share one limit.
	Identity uint32 `json:"identity,omitempty"`
	// Overrides replace Identity for the identities they list; the
	// identities of one override share its limit.
	Overrides []Override `json:"overrides,omitempty"`
}

// Override is a rate limit shared by the identities it lists.
type Override struct {
	RPS        uint32   `json:"rps"`
	Identities []string `json:"identities"`
}
