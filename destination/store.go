package destination

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	authpkg "github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/filestamp"
	"github.com/inmesh/inmesh/internal/yamltree"
	"github.com/inmesh/inmesh/profiles"
)

// Store is the state an embedded [Server] serves: ServiceProfiles by service
// name and endpoint sets by authority. Every change reaches every open
// stream at once. A Store is safe for concurrent use; its zero value is
// empty and ready.
type Store struct {
	mu        sync.Mutex
	profiles  map[string]*profiles.ServiceProfile // by name, lower case
	endpoints map[string][]Endpoint               // by authority host:port, lower case
	changed   chan struct{}                       // closed and replaced on every change
}

// NewStore returns an empty Store.
func NewStore() *Store { return &Store{} }

func (s *Store) initLocked() {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	if s.profiles == nil {
		s.profiles = make(map[string]*profiles.ServiceProfile)
	}
	if s.endpoints == nil {
		s.endpoints = make(map[string][]Endpoint)
	}
}

func (s *Store) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// SetServiceProfiles replaces every ServiceProfile with sps.
func (s *Store) SetServiceProfiles(sps []*profiles.ServiceProfile) {
	m := make(map[string]*profiles.ServiceProfile, len(sps))
	for _, sp := range sps {
		m[strings.ToLower(sp.Name)] = sp
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.profiles = m
	s.notifyLocked()
}

// PutServiceProfile adds or replaces the ServiceProfile named sp.Name.
func (s *Store) PutServiceProfile(sp *profiles.ServiceProfile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.profiles[strings.ToLower(sp.Name)] = sp
	s.notifyLocked()
}

// DeleteServiceProfile removes the ServiceProfile of a service name; its
// authorities get the default profile again.
func (s *Store) DeleteServiceProfile(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	delete(s.profiles, strings.ToLower(strings.TrimSuffix(name, ".")))
	s.notifyLocked()
}

// SetEndpoints replaces every endpoint set. An authority present with no
// endpoints exists but is empty; an authority absent does not exist.
func (s *Store) SetEndpoints(sets map[string][]Endpoint) {
	m := make(map[string][]Endpoint, len(sets))
	for a, eps := range sets {
		m[strings.ToLower(a)] = sortedEndpoints(eps)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.endpoints = m
	s.notifyLocked()
}

// PutEndpoints sets the endpoints of authority (host:port).
func (s *Store) PutEndpoints(authority string, eps []Endpoint) {
	eps = sortedEndpoints(eps)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.endpoints[strings.ToLower(authority)] = eps
	s.notifyLocked()
}

// DeleteEndpoints makes authority unknown: it no longer exists.
func (s *Store) DeleteEndpoints(authority string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	delete(s.endpoints, strings.ToLower(authority))
	s.notifyLocked()
}

// LoadServiceProfiles reads the ServiceProfile YAML files and, when all of
// them are good, replaces the store's profiles with theirs. On error the
// store is unchanged and the error names the file, the document and the
// field.
func (s *Store) LoadServiceProfiles(paths ...string) error {
	sps, err := profiles.LoadServiceProfileFiles(paths...)
	if err != nil {
		return err
	}
	s.SetServiceProfiles(sps)
	return nil
}

// LoadEndpoints reads an endpoints file (see [ParseEndpoints]) and, when it
// is good, replaces the store's endpoint sets with its. On error the store is
// unchanged; a file that changed while it was read is an error wrapping
// filestamp's ErrChanged, to be read again later.
func (s *Store) LoadEndpoints(path string) error {
	data, err := filestamp.Read(path)
	if err != nil {
		return err
	}
	sets, err := ParseEndpoints(data)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	s.SetEndpoints(sets)
	return nil
}

// profile returns the profile served for host:port and a channel closed on
// the next change.
func (s *Store) profile(host string, port uint32) (*profiles.Profile, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	if sp := s.profiles[host]; sp != nil {
		return sp.ProfileFor(port), s.changed
	}
	budget := profiles.DefaultRetryBudget
	p := &profiles.Profile{RetryBudget: &budget}
	if _, err := netip.ParseAddr(host); err != nil {
		p.FullyQualifiedName = host
	}
	return p, s.changed
}

// endpointSet returns the endpoints of authority, whether it exists, and a
// channel closed on the next change.
func (s *Store) endpointSet(authority string) ([]Endpoint, bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	eps, ok := s.endpoints[authority]
	return eps, ok, s.changed
}

func sortedEndpoints(eps []Endpoint) []Endpoint {
	eps = slices.Clone(eps)
	for i := range eps {
		if eps[i].Weight == 0 {
			eps[i].Weight = DefaultWeight
		}
	}
	slices.SortFunc(eps, func(a, b Endpoint) int { return a.Addr.Compare(b.Addr) })
	return slices.CompactFunc(eps, func(a, b Endpoint) bool { return a.Addr == b.Addr })
}

// ParseEndpoints reads an endpoints file: a YAML list of authorities and
// their endpoints.
//
//   - authority: books.default.svc.cluster.local:7000
//     endpoints:
//   - addr: 127.0.0.1:4143       # ip:port
//     weight: 10000              # optional, default 10000
//     h2: true                   # protocol hint: a mesh peer (orig-proto)
//     opaqueTransportPort: 4143  # optional
//     identity: books.default.serviceaccount.identity.linkerd.cluster.local
//     authorityOverride: books.default.svc.cluster.local:7000  # optional
//     labels: {pod: books-0}     # optional metric labels
//
// An authority with an empty list exists with no endpoints. A state with no
// authorities at all is written as an explicit empty list, []: an empty file
// (or one of only spaces and comments, or null) is an error, because that is
// what a file truncated or caught half-way through a copy looks like. A key
// given twice is an error. Each endpoint has at most [MaxEndpointLabels]
// labels, keys of at most [MaxLabelKeyLen] bytes and values of at most
// [MaxLabelValueLen]. Errors name the field, as in
// "[0].endpoints[1].addr: ...".
func ParseEndpoints(data []byte) (map[string][]Endpoint, error) {
	out := make(map[string][]Endpoint)
	if yamltree.Blank(data) {
		return nil, errEmptyEndpoints
	}
	root, err := yamltree.Decode(data)
	if err != nil {
		return nil, err
	}
	if root.Value == nil {
		return nil, errEmptyEndpoints
	}
	entries, err := root.List()
	if err != nil {
		return nil, err
	}
	for _, entry := range entries {
		obj, err := entry.Object("authority", "endpoints")
		if err != nil {
			return nil, err
		}
		an, ok := obj["authority"]
		if !ok {
			return nil, yamltree.Node{Path: entry.Child("authority")}.Errorf("required")
		}
		authority, err := an.Str()
		if err != nil {
			return nil, err
		}
		if authority, err = authpkg.Normalize(authority); err != nil {
			return nil, an.Errorf("%v", err)
		}
		if _, dup := out[authority]; dup {
			return nil, an.Errorf("%s is listed twice", authority)
		}
		var eps []Endpoint
		if en, ok := obj["endpoints"]; ok && en.Value != nil {
			items, err := en.List()
			if err != nil {
				return nil, err
			}
			for _, item := range items {
				e, err := parseEndpoint(item)
				if err != nil {
					return nil, err
				}
				eps = append(eps, e)
			}
		}
		out[authority] = eps
	}
	return out, nil
}

// errEmptyEndpoints is why an empty endpoints file is refused.
var errEmptyEndpoints = errors.New("the endpoints file is empty (truncated, or still being written?); write [] for a state with no authorities")

func parseEndpoint(n yamltree.Node) (Endpoint, error) {
	obj, err := n.Object("addr", "weight", "h2", "opaqueTransportPort", "identity", "authorityOverride", "labels")
	if err != nil {
		return Endpoint{}, err
	}
	e := Endpoint{Weight: DefaultWeight}
	an, ok := obj["addr"]
	if !ok {
		return e, yamltree.Node{Path: n.Child("addr")}.Errorf("required")
	}
	addr, err := an.Str()
	if err != nil {
		return e, err
	}
	if e.Addr, err = netip.ParseAddrPort(addr); err != nil || e.Addr.Port() == 0 {
		return e, an.Errorf("%q is not an ip:port address", addr)
	}
	if wn, ok := obj["weight"]; ok {
		if e.Weight, err = wn.Uint32(); err != nil {
			return e, err
		}
	}
	if hn, ok := obj["h2"]; ok {
		if e.H2, err = hn.Bool(); err != nil {
			return e, err
		}
	}
	if pn, ok := obj["opaqueTransportPort"]; ok {
		if e.OpaqueTransportPort, err = pn.Uint32(); err != nil {
			return e, err
		}
		if e.OpaqueTransportPort == 0 || e.OpaqueTransportPort > 0xffff {
			return e, pn.Errorf("%d is not a port", e.OpaqueTransportPort)
		}
	}
	if in, ok := obj["identity"]; ok {
		if e.Identity, err = in.Str(); err != nil {
			return e, err
		}
	}
	if on, ok := obj["authorityOverride"]; ok {
		if e.AuthorityOverride, err = on.Str(); err != nil {
			return e, err
		}
	}
	if ln, ok := obj["labels"]; ok && ln.Value != nil {
		m, ok := ln.Value.(map[string]any)
		if !ok {
			return e, ln.Errorf("must be an object of strings")
		}
		e.Labels = make(map[string]string, len(m))
		for _, k := range yamltree.SortedKeys(m) {
			v, err := yamltree.Node{Path: ln.Child(k), Value: m[k]}.Scalar()
			if err != nil {
				return e, err
			}
			e.Labels[k] = v
		}
		if err := checkLabels(e.Labels); err != nil {
			return e, ln.Errorf("%v", err)
		}
	}
	return e, nil
}
