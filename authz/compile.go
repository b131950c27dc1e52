package authz

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/policy"
)

// Limits of what [Compile] accepts.
const (
	MaxAuthorizations = 256 // authorizations of a Server or of a route
	MaxNetworks       = 256 // networks of an authorization, excepts of a network
	MaxIdentities     = 1024
)

// localhostAuthz is the authorization every compiled Server carries after
// its own, at Server and at route level: the pod's own loopback addresses,
// unauthenticated, named Default("localhost") as Linkerd's proxy adds it.
var localhostAuthz = Authz{
	Meta: DefaultMeta("localhost"),
	Networks: []Network{
		{Net: netip.MustParsePrefix("127.0.0.1/32")},
		{Net: netip.MustParsePrefix("::1/128")},
	},
}

// Policy is a compiled [Server]: its route table, the authorizations of
// each route (route-level, then the Server's, then localhost), its rate
// limiters and its metric labels. A Policy is immutable but for its rate
// limiters' state, and safe for concurrent use.
type Policy struct {
	server  *Server
	table   *policy.RouteTable // nil: no HTTP routes
	routes  []compiledRoute    // by route index
	limiter *limiter           // nil: no rate limit
}

type compiledRoute struct {
	meta   Meta
	authzs []compiledAuthz
}

type compiledAuthz struct {
	meta      Meta
	nets      []Network
	meshTLS   bool // authentication required
	anyTLS    bool // MeshTLS.Unauthenticated
	exact     []string
	suffixes  []string // ".a.b"; "" is any DNS identity
	audit     bool
	localhost bool
}

// Server returns the Server p was compiled from. It must not be modified.
func (p *Policy) Server() *Server { return p.server }

// Compile validates s and compiles it, or returns an error naming the
// field at fault ("routes[1].authorizations[0].networks[0].except[1]: ...").
func Compile(s *Server) (*Policy, error) {
	if s == nil {
		return nil, fmt.Errorf("server: nil")
	}
	if int(s.Protocol) >= len(protocolNames) {
		return nil, fmt.Errorf("protocol: unknown protocol %d", s.Protocol)
	}
	if s.MaxConcurrentRequests < 0 {
		return nil, fmt.Errorf("maxConcurrentRequests: %d is negative", s.MaxConcurrentRequests)
	}
	serverAuthzs, err := compileAuthzs(s.Authorizations, "authorizations")
	if err != nil {
		return nil, err
	}
	// The pod's own loopback is admitted everywhere but on the invalid
	// Server, which admits nobody.
	var localhost []compiledAuthz
	if s != invalidServer {
		lh, _ := compileAuthz(&localhostAuthz, "localhost")
		lh.localhost = true
		localhost = []compiledAuthz{lh}
	}
	p := &Policy{server: s}
	switch {
	case s.Protocol == ProtocolGRPC:
		if len(s.Routes) > 0 {
			return nil, fmt.Errorf("routes: a grpc Server takes gRPC routes (grpcRoutes)")
		}
		if err := p.compileGRPC(s, serverAuthzs, localhost); err != nil {
			return nil, err
		}
	case s.Protocol != ProtocolOpaque && s.Protocol != ProtocolTLS:
		if len(s.GRPCRoutes) > 0 {
			return nil, fmt.Errorf("grpcRoutes: only a grpc Server takes gRPC routes")
		}
		if err := p.compileHTTP(s, serverAuthzs, localhost); err != nil {
			return nil, err
		}
	}
	if rl := s.RateLimit; rl != nil {
		if s.Protocol == ProtocolGRPC || s.Protocol == ProtocolOpaque || s.Protocol == ProtocolTLS {
			return nil, fmt.Errorf("rateLimit: a %s Server takes no rate limit", s.Protocol)
		}
		if p.limiter, err = newLimiter(rl); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (p *Policy) compileHTTP(s *Server, serverAuthzs, localhost []compiledAuthz) error {
	routes := s.Routes
	if len(routes) == 0 {
		routes = DefaultRoutes(nil, nil)
	}
	if len(routes) > policy.MaxRoutes {
		return fmt.Errorf("routes: %d routes is more than the limit of %d", len(routes), policy.MaxRoutes)
	}
	proto := policy.HTTPProtocol{Routes: make([]policy.HTTPRoute, len(routes))}
	p.routes = make([]compiledRoute, len(routes))
	for i, r := range routes {
		path := fmt.Sprintf("routes[%d]", i)
		var err error
		if p.routes[i], err = compileRoute(r.Meta, r.Authorizations, path, serverAuthzs, localhost); err != nil {
			return err
		}
		pr := policy.HTTPRoute{Meta: r.Meta.policyMeta(), Hosts: r.Hosts, Rules: make([]policy.HTTPRule, len(r.Rules))}
		for j, rule := range r.Rules {
			for k, f := range rule.Filters {
				if f.ResponseHeaders != nil || f.GRPCFailureInjector != nil {
					return fmt.Errorf("%s.rules[%d].filters[%d]: only request header modifiers, redirects and failure injectors apply to inbound HTTP routes", path, j, k)
				}
			}
			pr.Rules[j] = policy.HTTPRule{Matches: rule.Matches, Filters: rule.Filters}
		}
		proto.Routes[i] = pr
	}
	var err error
	if p.table, err = policy.CompileHTTP(s.Meta.policyMeta(), proto, policy.Options{}, "routes"); err != nil {
		// The route list's own paths read "routes.routes[i]...".
		return errors.New(strings.TrimPrefix(err.Error(), "routes."))
	}
	return nil
}

func (p *Policy) compileGRPC(s *Server, serverAuthzs, localhost []compiledAuthz) error {
	routes := s.GRPCRoutes
	if len(routes) == 0 {
		routes = []GRPCRoute{{Meta: DefaultMeta("default"), Rules: []GRPCRule{{}}}}
	}
	if len(routes) > policy.MaxRoutes {
		return fmt.Errorf("grpcRoutes: %d routes is more than the limit of %d", len(routes), policy.MaxRoutes)
	}
	proto := policy.GRPCProtocol{Routes: make([]policy.GRPCRoute, len(routes))}
	p.routes = make([]compiledRoute, len(routes))
	for i, r := range routes {
		path := fmt.Sprintf("grpcRoutes[%d]", i)
		var err error
		if p.routes[i], err = compileRoute(r.Meta, r.Authorizations, path, serverAuthzs, localhost); err != nil {
			return err
		}
		pr := policy.GRPCRoute{Meta: r.Meta.policyMeta(), Hosts: r.Hosts, Rules: make([]policy.GRPCRule, len(r.Rules))}
		for j, rule := range r.Rules {
			pr.Rules[j] = policy.GRPCRule{Matches: rule.Matches, Filters: rule.Filters}
		}
		proto.Routes[i] = pr
	}
	var err error
	if p.table, err = policy.CompileGRPC(s.Meta.policyMeta(), proto, policy.Options{}, "grpcRoutes"); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "grpcRoutes."))
	}
	return nil
}

// compileRoute is a route's authorizations: its own, then the Server's,
// then localhost (unless the Server is the invalid one).
func compileRoute(meta Meta, authzs []Authz, path string, serverAuthzs, localhost []compiledAuthz) (compiledRoute, error) {
	routeAuthzs, err := compileAuthzs(authzs, path+".authorizations")
	if err != nil {
		return compiledRoute{}, err
	}
	all := make([]compiledAuthz, 0, len(routeAuthzs)+len(serverAuthzs)+len(localhost))
	all = append(append(append(all, routeAuthzs...), serverAuthzs...), localhost...)
	return compiledRoute{meta: meta, authzs: all}, nil
}

func compileAuthzs(as []Authz, path string) ([]compiledAuthz, error) {
	if len(as) > MaxAuthorizations {
		return nil, fmt.Errorf("%s: %d authorizations is more than the limit of %d", path, len(as), MaxAuthorizations)
	}
	out := make([]compiledAuthz, len(as))
	for i := range as {
		var err error
		if out[i], err = compileAuthz(&as[i], fmt.Sprintf("%s[%d]", path, i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func compileAuthz(a *Authz, path string) (compiledAuthz, error) {
	c := compiledAuthz{meta: a.Meta, audit: a.Meta.IsDefault() && a.Meta.Name == string(Audit)}
	if len(a.Networks) == 0 {
		return c, fmt.Errorf("%s.networks: at least one network is required", path)
	}
	if len(a.Networks) > MaxNetworks {
		return c, fmt.Errorf("%s.networks: %d networks is more than the limit of %d", path, len(a.Networks), MaxNetworks)
	}
	c.nets = make([]Network, len(a.Networks))
	for i, n := range a.Networks {
		npath := fmt.Sprintf("%s.networks[%d]", path, i)
		if !n.Net.IsValid() {
			return c, fmt.Errorf("%s.net: not a valid network", npath)
		}
		if len(n.Except) > MaxNetworks {
			return c, fmt.Errorf("%s.except: %d networks is more than the limit of %d", npath, len(n.Except), MaxNetworks)
		}
		net := n.Net.Masked()
		except := make([]netip.Prefix, len(n.Except))
		for j, e := range n.Except {
			epath := fmt.Sprintf("%s.except[%d]", npath, j)
			if !e.IsValid() {
				return c, fmt.Errorf("%s: not a valid network", epath)
			}
			e = e.Masked()
			if e.Addr().Is4() != net.Addr().Is4() || e.Bits() < net.Bits() || !net.Contains(e.Addr()) {
				return c, fmt.Errorf("%s: %s is not inside %s", epath, e, net)
			}
			if e.Bits() == net.Bits() {
				return c, fmt.Errorf("%s: %s excludes all of %s", epath, e, net)
			}
			except[j] = e
		}
		c.nets[i] = Network{Net: net, Except: except}
	}
	m := a.Authentication.MeshTLS
	if m == nil {
		return c, nil
	}
	apath := path + ".authentication.meshTLS"
	c.meshTLS = true
	if m.Unauthenticated {
		c.anyTLS = true
		return c, nil
	}
	if len(m.Identities) == 0 && len(m.Suffixes) == 0 {
		return c, fmt.Errorf("%s: admits no client: set unauthenticated, identities or suffixes", apath)
	}
	if len(m.Identities)+len(m.Suffixes) > MaxIdentities {
		return c, fmt.Errorf("%s: %d identities and suffixes is more than the limit of %d", apath, len(m.Identities)+len(m.Suffixes), MaxIdentities)
	}
	for i, id := range m.Identities {
		if id == "" {
			return c, fmt.Errorf("%s.identities[%d]: empty identity", apath, i)
		}
	}
	c.exact = m.Identities
	c.suffixes = make([]string, len(m.Suffixes))
	for i, parts := range m.Suffixes {
		for j, part := range parts {
			if part == "" || strings.Contains(part, ".") {
				return c, fmt.Errorf("%s.suffixes[%d][%d]: %q is not one DNS label", apath, i, j, part)
			}
		}
		if len(parts) > 0 {
			c.suffixes[i] = "." + strings.Join(parts, ".")
		}
	}
	return c, nil
}

// admits reports whether a client at ip with peer passes a.
func (a *compiledAuthz) admits(ip netip.Addr, peer identity.Peer) bool {
	inNet := false
	for i := range a.nets {
		if a.nets[i].Contains(ip) {
			inNet = true
			break
		}
	}
	if !inNet {
		return false
	}
	if !a.meshTLS {
		return true
	}
	if !peer.TLS {
		return false
	}
	if a.anyTLS {
		return true
	}
	id := peer.ID
	if id == "" {
		return false
	}
	for _, e := range a.exact {
		if e == id {
			return true
		}
	}
	if strings.IndexByte(id, ':') >= 0 {
		// A URI identity (SPIFFE, urn:, ...; a DNS-like identity has
		// no colon) matches exact names only.
		return false
	}
	for _, s := range a.suffixes {
		if strings.HasSuffix(id, s) {
			return true
		}
	}
	return false
}

// authorize returns the index in r.authzs of the first authorization that
// admits the client, or -1.
func (r *compiledRoute) authorize(ip netip.Addr, peer identity.Peer, noLocalhost bool) int {
	n := len(r.authzs)
	if noLocalhost && n > 0 && r.authzs[n-1].localhost {
		n-- // the localhost authorization is always the last
	}
	for i := range r.authzs[:n] {
		if r.authzs[i].admits(ip, peer) {
			return i
		}
	}
	return -1
}
