package controlplane

import (
	"maps"
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
	m := make(map[string][]endpoint.Endpoint, len(sets))
	for a, eps := range sets {
		m[strings.ToLower(a)] = sortedEndpoints(eps)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	if s.registered == nil {
		s.registered = make(map[string]map[string][]endpoint.Endpoint)
	}
	changed := changedAuthorities(s.registered[id], m)
	if len(changed) == 0 {
		return
	}
	s.registered[id] = m
	s.mergeLocked()
	s.endpointsChangedLocked(changed...)
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
	s.mergeLocked()
	s.endpointsChangedLocked(slices.Collect(maps.Keys(old))...)
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

// mergeLocked recomputes the endpoint sets served: the files' sets, then
// the registered endpoints of the same authorities, an address given twice
// served as the files give it (else as the first registration by id).
func (s *Store) mergeLocked() {
	if len(s.registered) == 0 {
		s.endpoints = s.files
		return
	}
	m := maps.Clone(s.files)
	for _, id := range slices.Sorted(maps.Keys(s.registered)) {
		for a, eps := range s.registered[id] {
			m[a] = append(slices.Clip(m[a]), eps...)
		}
	}
	for a, eps := range m {
		if _, fromFiles := s.files[a]; fromFiles && len(eps) == len(s.files[a]) {
			continue
		}
		slices.SortStableFunc(eps, func(x, y endpoint.Endpoint) int { return x.Addr.Compare(y.Addr) })
		m[a] = slices.CompactFunc(eps, func(x, y endpoint.Endpoint) bool { return x.Addr == y.Addr })
	}
	s.endpoints = m
}
