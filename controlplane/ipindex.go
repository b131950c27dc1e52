package controlplane

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/manifest"
)

// The lookups of an IP address (GetProfile of a workload's address or of
// a clusterIP, the outbound policy of an address, a registration's check
// that nobody else holds its address) read what the store has at that IP
// from an index, never every endpoint set or Service: with thousands of
// Services, a stream that opens or wakes costs what is at its address,
// under a lock that every other stream needs too. The index follows each
// change where the store already walks it: the served sets in
// endpointsChangedLocked, the endpoint sets of the files and of each
// registration as they are replaced, the Services' clusterIPs as the
// manifests are.

// atIP is what the store holds at one IP address.
type atIP struct {
	// served are the endpoints of the served sets (Store.endpoints) at
	// the IP, by authority, then address.
	served []servedEndpoint
	// claims are the endpoints at the IP of the files' sets and of each
	// registration, one per endpoint of each, in no order (see
	// addressClaimsLocked).
	claims []addrClaim
}

// servedEndpoint is an endpoint of a served set and its authority.
type servedEndpoint struct {
	authority string
	e         endpoint.Endpoint
}

func compareServed(x servedEndpoint, authority string, addr netip.AddrPort) int {
	return cmp.Or(strings.Compare(x.authority, authority), x.e.Addr.Compare(addr))
}

// addrClaim is a claim on an address (ip:port).
type addrClaim struct {
	addr netip.AddrPort
	claim
}

// atIPLocked returns what the store holds at ip, nil when nothing; ip is
// unmapped, as the index keys are. The caller holds s.mu.
func (s *Store) atIPLocked(ip netip.Addr) *atIP { return s.byIP[ip] }

// indexEntryLocked returns the entry of ip, made when there is none.
func (s *Store) indexEntryLocked(ip netip.Addr) *atIP {
	x := s.byIP[ip]
	if x == nil {
		if s.byIP == nil {
			s.byIP = make(map[netip.Addr]*atIP)
		}
		x = &atIP{}
		s.byIP[ip] = x
	}
	return x
}

// dropIfEmptyLocked forgets ip once nothing is there.
func (s *Store) dropIfEmptyLocked(ip netip.Addr, x *atIP) {
	if len(x.served) == 0 && len(x.claims) == 0 {
		delete(s.byIP, ip)
	}
}

// indexServedLocked moves the index from prev to cur, the old and new
// served sets of authority (each ordered by address). The caller holds
// s.mu.
func (s *Store) indexServedLocked(authority string, prev, cur []endpoint.Endpoint) {
	changedEndpoints(prev, cur, sameEndpoint, func(e endpoint.Endpoint) {
		ip := e.Addr.Addr().Unmap()
		x := s.byIP[ip]
		if x == nil {
			return
		}
		if i, ok := slices.BinarySearchFunc(x.served, e.Addr, func(y servedEndpoint, a netip.AddrPort) int {
			return compareServed(y, authority, a)
		}); ok {
			x.served = slices.Delete(x.served, i, i+1)
		}
		s.dropIfEmptyLocked(ip, x)
	}, func(e endpoint.Endpoint) {
		x := s.indexEntryLocked(e.Addr.Addr().Unmap())
		i, ok := slices.BinarySearchFunc(x.served, e.Addr, func(y servedEndpoint, a netip.AddrPort) int {
			return compareServed(y, authority, a)
		})
		if ok {
			x.served[i].e = e
			return
		}
		x.served = slices.Insert(x.served, i, servedEndpoint{authority: authority, e: e})
	})
}

// indexClaimsLocked moves the index from prev to cur, the old and new
// endpoints that the files (file) or one registration give authority
// (each ordered by address). The caller holds s.mu.
func (s *Store) indexClaimsLocked(authority string, file bool, prev, cur []endpoint.Endpoint) {
	changedEndpoints(prev, cur, sameClaim, func(e endpoint.Endpoint) {
		ip := e.Addr.Addr().Unmap()
		x := s.byIP[ip]
		if x == nil {
			return
		}
		c := addrClaim{e.Addr, claim{identity: e.Identity, authority: authority, file: file}}
		if i := slices.Index(x.claims, c); i >= 0 {
			x.claims = slices.Delete(x.claims, i, i+1)
		}
		s.dropIfEmptyLocked(ip, x)
	}, func(e endpoint.Endpoint) {
		x := s.indexEntryLocked(e.Addr.Addr().Unmap())
		x.claims = append(x.claims, addrClaim{e.Addr, claim{identity: e.Identity, authority: authority, file: file}})
	})
}

// indexFilesLocked moves the index from the files' sets prev to cur.
// The caller holds s.mu.
func (s *Store) indexFilesLocked(prev, cur map[string][]endpoint.Endpoint) {
	for a, eps := range prev {
		s.indexClaimsLocked(a, true, eps, cur[a])
	}
	for a, eps := range cur {
		if _, ok := prev[a]; !ok {
			s.indexClaimsLocked(a, true, nil, eps)
		}
	}
}

// sameClaim reports whether two endpoints at one address claim it alike
// (see addressClaimsLocked).
func sameClaim(a, b endpoint.Endpoint) bool { return a.Identity == b.Identity }

// changedEndpoints calls gone for each endpoint of prev that cur does
// not hold the same (by same, for two endpoints at one address), then
// added for each endpoint of cur that prev did not hold the same; prev and
// cur are ordered by address, with one endpoint per address. An endpoint
// that changed is gone, then added.
func changedEndpoints(prev, cur []endpoint.Endpoint, same func(a, b endpoint.Endpoint) bool, gone, added func(endpoint.Endpoint)) {
	if len(prev) == len(cur) && (len(prev) == 0 || &prev[0] == &cur[0]) {
		return // the very same set
	}
	in := func(set []endpoint.Endpoint, e endpoint.Endpoint) bool {
		i, ok := slices.BinarySearchFunc(set, e.Addr, func(x endpoint.Endpoint, a netip.AddrPort) int { return x.Addr.Compare(a) })
		return ok && same(set[i], e)
	}
	for _, e := range prev {
		if !in(cur, e) {
			gone(e)
		}
	}
	for _, e := range cur {
		if !in(prev, e) {
			added(e)
		}
	}
}

// indexClusterIPsLocked indexes the Services of the manifests by their
// clusterIP, in the manifests' order. The caller holds s.mu.
func (s *Store) indexClusterIPsLocked(r *manifest.Resources) {
	s.clusterIPs = nil
	if r == nil {
		return
	}
	for _, svc := range r.Services {
		if !svc.ClusterIP.IsValid() {
			continue
		}
		if s.clusterIPs == nil {
			s.clusterIPs = make(map[netip.Addr][]serviceRef)
		}
		s.clusterIPs[svc.ClusterIP] = append(s.clusterIPs[svc.ClusterIP], serviceRef{ns: svc.Namespace, name: svc.Name})
	}
}
