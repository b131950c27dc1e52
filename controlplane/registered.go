package controlplane

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/inmesh/inmesh/balancer/endpoint"
)

// PutRegistered sets the endpoints that the registration id holds, by
// authority (name.ns.svc.cluster.local:port), in place of what it held:
// they are served beside the endpoint sets of the files (SetEndpoints), an
// address given by both served as the file gives it. The registration
// server calls it with one id per stream; etcdstore's watch with one id
// for every registration that etcd holds.
func (s *Store) PutRegistered(id string, sets map[string][]endpoint.Endpoint) {
	m := registeredSets(sets)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initRegisteredLocked()
	old := s.registered[id]
	changed := changedAuthorities(old, m)
	if len(changed) == 0 {
		return
	}
	s.registered[id] = m
	for _, a := range changed {
		_, had := old[a]
		_, has := m[a]
		s.holdsLocked(id, a, had, has)
		s.mergeLocked(a)
	}
	s.endpointsChangedLocked(changed...)
	s.registeredAddrsChangedLocked(old, m, changed)
}

// UpdateRegistered sets, for the registration id, the endpoints of each
// authority of sets and removes those of each authority of deleted, in
// one change, leaving its other authorities as they are: a stream sees all
// of it or none, and the work is that of the authorities given, not of
// every authority of the registration ([Store.PutRegistered] replaces
// them all).
func (s *Store) UpdateRegistered(id string, sets map[string][]endpoint.Endpoint, deleted []string) {
	m := registeredSets(sets)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initRegisteredLocked()
	cur := s.registered[id]
	if cur == nil {
		cur = make(map[string][]endpoint.Endpoint)
		s.registered[id] = cur
	}
	old := make(map[string][]endpoint.Endpoint)
	var changed []string
	for _, a := range deleted {
		a = strings.ToLower(a)
		if _, ok := m[a]; ok {
			continue
		}
		if eps, ok := cur[a]; ok {
			old[a] = eps
			delete(cur, a)
			changed = append(changed, a)
		}
	}
	for a, eps := range m {
		prev, had := cur[a]
		if had && slices.EqualFunc(prev, eps, sameEndpoint) {
			continue
		}
		if had {
			old[a] = prev
		}
		cur[a] = eps
		changed = append(changed, a)
	}
	for _, a := range changed {
		_, had := old[a]
		_, has := cur[a]
		s.holdsLocked(id, a, had, has)
		s.mergeLocked(a)
	}
	s.endpointsChangedLocked(changed...)
	s.registeredAddrsChangedLocked(old, cur, changed)
}

// DeleteRegistered removes the endpoints of the registration id.
func (s *Store) DeleteRegistered(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	old, ok := s.registered[id]
	if !ok {
		return
	}
	delete(s.registered, id)
	changed := slices.Collect(maps.Keys(old))
	for _, a := range changed {
		s.holdsLocked(id, a, true, false)
		s.mergeLocked(a)
	}
	s.endpointsChangedLocked(changed...)
	s.registeredAddrsChangedLocked(old, nil, changed)
}

// registeredAddrsChangedLocked indexes the claims of a registration's new
// sets in place of its old ones, and wakes the profile streams of the
// addresses whose registered endpoints differ between the two, in the
// authorities changed: an endpoint that the merge hides (the files give
// its address) still changes whether that address is in conflict (see
// addressClaimsLocked).
func (s *Store) registeredAddrsChangedLocked(old, cur map[string][]endpoint.Endpoint, changed []string) {
	for _, a := range changed {
		s.indexClaimsLocked(a, false, old[a], cur[a])
		s.wakeAddrsLocked(old[a], cur[a])
	}
}

// claim is an endpoint that the store holds at an address: the identity
// it carries, the authority it serves and whether the endpoint sets
// (files, etcd's endpoints keys) give it, else a registration.
type claim struct {
	identity  string
	authority string
	file      bool
}

func (c claim) String() string {
	from := "registered for"
	if c.file {
		from = "the endpoints file's"
	}
	id := "no identity"
	if c.identity != "" {
		id = fmt.Sprintf("identity %q", c.identity)
	}
	return fmt.Sprintf("%s (%s %s)", id, from, c.authority)
}

// before orders claims for the choice of which to name: the endpoint
// sets' first, then by authority, then by identity: two registrations
// of one authority are named in one order, whichever the map gave first.
func (c claim) before(o claim) bool {
	if c.file != o.file {
		return c.file
	}
	if c.authority != o.authority {
		return c.authority < o.authority
	}
	return c.identity < o.identity
}

// addressClaimsLocked returns, for each address of addrs, the identities
// that the endpoints at that very address (ip:port) carry, each with its
// first claim, from the endpoint sets and every registration, not the
// merge that serves them (which keeps one endpoint of an address per
// authority). More than one identity at an address is a conflict: two
// workloads claim it. The caller holds s.mu.
func (s *Store) addressClaimsLocked(addrs map[netip.AddrPort]bool) map[netip.AddrPort]map[string]claim {
	out := make(map[netip.AddrPort]map[string]claim)
	for addr := range addrs {
		x := s.atIPLocked(addr.Addr().Unmap())
		if x == nil {
			continue
		}
		for _, c := range x.claims {
			if c.addr != addr {
				continue
			}
			ids := out[addr]
			if ids == nil {
				ids = make(map[string]claim, 1)
				out[addr] = ids
			}
			if prev, ok := ids[c.identity]; !ok || c.claim.before(prev) {
				ids[c.identity] = c.claim
			}
		}
	}
	return out
}

// changedAuthorities returns the authorities whose endpoints differ
// between a and b.
func changedAuthorities(a, b map[string][]endpoint.Endpoint) []string {
	var out []string
	for k, eps := range a {
		if other, ok := b[k]; !ok || !slices.EqualFunc(eps, other, sameEndpoint) {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// holdsLocked records that the registration id holds authority (has),
// where it did (had) or not. The caller holds s.mu.
func (s *Store) holdsLocked(id, authority string, had, has bool) {
	if had == has {
		return
	}
	ids := s.registeredBy[authority]
	i, found := slices.BinarySearch(ids, id)
	switch {
	case has && !found:
		if s.registeredBy == nil {
			s.registeredBy = make(map[string][]string)
		}
		s.registeredBy[authority] = slices.Insert(ids, i, id)
	case !has && found:
		if ids = slices.Delete(ids, i, i+1); len(ids) == 0 {
			delete(s.registeredBy, authority)
		} else {
			s.registeredBy[authority] = ids
		}
	}
}

// mergeLocked recomputes the endpoint set served for authority, after the
// files' set of it or a registration's changed: the files' set, then the
// registered endpoints of the authority by registration id, an address
// given twice served as the files give it (else as the first registration
// by id). The authority is served when the files or a registration give
// it, even with no endpoints. The other authorities' sets are left as
// they are: a change costs the authorities it touches. The caller holds
// s.mu.
func (s *Store) mergeLocked(authority string) {
	files, fromFiles := s.files[authority]
	ids := s.registeredBy[authority]
	if !fromFiles && len(ids) == 0 {
		delete(s.endpoints, authority)
		return
	}
	eps := slices.Clip(files) // appending never writes into the files' set
	for _, id := range ids {
		eps = append(eps, s.registered[id][authority]...)
	}
	if !fromFiles || len(eps) != len(files) {
		slices.SortStableFunc(eps, func(x, y endpoint.Endpoint) int { return x.Addr.Compare(y.Addr) })
		eps = slices.CompactFunc(eps, func(x, y endpoint.Endpoint) bool { return x.Addr == y.Addr })
	}
	s.endpoints[authority] = eps
}

// mergeAllLocked recomputes every served endpoint set, for a change of
// every set of the files (SetEndpoints). The caller holds s.mu.
func (s *Store) mergeAllLocked() {
	s.endpoints = make(map[string][]endpoint.Endpoint, len(s.files)+len(s.registeredBy))
	for a := range s.files {
		s.mergeLocked(a)
	}
	for a := range s.registeredBy {
		if _, ok := s.files[a]; !ok {
			s.mergeLocked(a)
		}
	}
}

// registeredSets is sets with lower-case authorities and sorted endpoints,
// as the store holds a registration's.
func registeredSets(sets map[string][]endpoint.Endpoint) map[string][]endpoint.Endpoint {
	m := make(map[string][]endpoint.Endpoint, len(sets))
	for a, eps := range sets {
		m[strings.ToLower(a)] = sortedEndpoints(eps)
	}
	return m
}

// initRegisteredLocked readies the store and its registrations' map.
func (s *Store) initRegisteredLocked() {
	s.initLocked()
	if s.registered == nil {
		s.registered = make(map[string]map[string][]endpoint.Endpoint)
	}
}
