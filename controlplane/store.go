package controlplane

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/filestamp"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/profiles"
)

// Store is the state an embedded [Server] serves: ServiceProfiles by service
// name and endpoint sets by authority. A change reaches at once the open
// streams whose answer it may change, and only those: an endpoint change
// of one authority wakes the streams of that authority (and of its
// Service when the authority appears or goes away), a ServiceProfile the
// streams of its name; a reload of every endpoint set or every profile
// wakes only the streams whose sets or profiles differ. A reload of the
// policy manifests or the inbound options wakes only the streams whose
// answer it changes: each watched policy and inbound Server is computed
// under the new manifests and compared with what it was. A Store is safe for
// concurrent use; its zero value is empty and ready.
type Store struct {
	mu        sync.Mutex
	profiles  map[profileID]*profiles.ServiceProfile
	endpoints map[string][]endpoint.Endpoint // served: files' sets merged with registered ones (registered.go)
	files     map[string][]endpoint.Endpoint // the endpoint sets given by Set/Put/DeleteEndpoints
	// registered are the endpoints workloads registered, by registration
	// and authority (registered.go).
	registered map[string]map[string][]endpoint.Endpoint
	// registeredBy are the ids of the registrations that give each
	// authority, in order (registered.go).
	registeredBy map[string][]string
	// endpointServices counts the authorities of each Service the
	// endpoint sets name.
	endpointServices map[serviceRef]int
	// notified are the endpoint sets as the streams were last told of
	// them (see endpointsChangedLocked).
	notified map[string][]endpoint.Endpoint
	// versions number each notified endpoint set, by authority, from
	// setSeq (never reused, so that a set deleted and made again never
	// looks unchanged); diffs are the updates of the last change of
	// each, shared by its streams (endpointUpdates).
	versions  map[string]uint64
	setSeq    uint64
	diffs     map[string]*setDiff
	waiters   map[watchKey]map[*waiter]struct{} // the open streams, by what they watch
	manifests *manifest.Resources               // Services and routes of the OutboundPolicies API
	inbound   manifest.InboundOptions           // the cluster's settings of the InboundServerPolicies API
	// answers are the digests of the watched policy and inbound answers
	// under manifests and inbound, by key, as the last reload computed
	// them, so that the next reload computes each answer once, under its
	// new state (see manifestsChangedLocked).
	answers map[watchKey]answerDigest
	// byIP are the endpoints at each IP address (unmapped), and
	// clusterIPs the Services of the manifests by clusterIP, for the
	// lookups by address (ipindex.go).
	byIP       map[netip.Addr]*atIP
	clusterIPs map[netip.Addr][]serviceRef
}

// NewStore returns an empty Store.
func NewStore() *Store { return &Store{} }

func (s *Store) initLocked() {
	if s.profiles == nil {
		s.profiles = make(map[profileID]*profiles.ServiceProfile)
	}
	if s.endpoints == nil {
		s.endpoints = make(map[string][]endpoint.Endpoint)
	}
	if s.files == nil {
		s.files = make(map[string][]endpoint.Endpoint)
	}
}

// normalAuthority is the key of an authority in the endpoint sets.
func normalAuthority(a string) string { return strings.ToLower(a) }

// profileID is where a ServiceProfile applies, as Linkerd's controller
// keys profiles (controller/api/destination/server.go profileID): its
// namespace and the FQDN of its Service. A profile in the Service's own
// namespace serves every client; one in another namespace serves the
// clients of that namespace (by their context token) alone, ahead of the
// Service's own.
type profileID struct{ ns, name string }

// profileIDOf is the profileID of sp; a profile without a namespace is in
// the namespace its name gives (name.NAMESPACE.svc...).
func profileIDOf(sp *profiles.ServiceProfile) profileID {
	return profileID{sp.EffectiveNamespace(), strings.ToLower(strings.TrimSuffix(sp.Name, "."))}
}

// SetServiceProfiles replaces every ServiceProfile with sps.
func (s *Store) SetServiceProfiles(sps []*profiles.ServiceProfile) {
	m := make(map[profileID]*profiles.ServiceProfile, len(sps))
	for _, sp := range sps {
		m[profileIDOf(sp)] = sp
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	prev := s.profiles
	s.profiles = m
	s.profilesChangedLocked(prev)
}

// PutServiceProfile adds or replaces the ServiceProfile named sp.Name in
// its namespace (sp.Namespace, else the namespace its name gives).
func (s *Store) PutServiceProfile(sp *profiles.ServiceProfile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	id := profileIDOf(sp)
	s.profiles[id] = sp
	s.wakeLocked(profileKey(id.name))
}

// DeleteServiceProfile removes the ServiceProfiles of a service name, in
// every namespace; its authorities get the default profile again.
func (s *Store) DeleteServiceProfile(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	for id := range s.profiles {
		if id.name == name {
			delete(s.profiles, id)
		}
	}
	s.wakeLocked(profileKey(name))
}

// SetEndpoints replaces every endpoint set. An authority names a Service
// port (name.ns.svc.cluster.local:port): the Service then exists, and the
// port is one it defines, even with no endpoints; the Destination API
// answers Get of a Service that neither a set nor a Service manifest names
// NotFound, as Linkerd's controller answers a Service that is not in the
// cluster.
func (s *Store) SetEndpoints(sets map[string][]endpoint.Endpoint) {
	m := make(map[string][]endpoint.Endpoint, len(sets))
	for a, eps := range sets {
		m[normalAuthority(a)] = sortedEndpoints(eps)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	prev := s.endpoints
	s.indexFilesLocked(s.files, m)
	s.files = m
	s.mergeAllLocked()
	changed := make([]string, 0, len(s.endpoints))
	for a := range s.endpoints {
		changed = append(changed, a)
	}
	for a := range prev {
		if _, ok := s.endpoints[a]; !ok {
			changed = append(changed, a)
		}
	}
	s.endpointsChangedLocked(changed...)
}

// PutEndpoints sets the endpoints of authority (host:port).
func (s *Store) PutEndpoints(authority string, eps []endpoint.Endpoint) {
	eps = sortedEndpoints(eps)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	authority = normalAuthority(authority)
	s.indexClaimsLocked(authority, true, s.files[authority], eps)
	s.files[authority] = eps
	s.mergeLocked(authority)
	s.endpointsChangedLocked(authority)
}

// UpdateEndpoints sets the endpoints of each authority of sets and deletes
// each authority of deleted, in one change: a stream sees all of it or
// none. Only the streams of the authorities whose sets differ are woken,
// and the work is that of the authorities given, not of every set
// ([Store.SetEndpoints] replaces all of them).
func (s *Store) UpdateEndpoints(sets map[string][]endpoint.Endpoint, deleted []string) {
	m := make(map[string][]endpoint.Endpoint, len(sets))
	for a, eps := range sets {
		m[normalAuthority(a)] = sortedEndpoints(eps)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	changed := make([]string, 0, len(m)+len(deleted))
	for _, a := range deleted {
		a = normalAuthority(a)
		if _, ok := m[a]; ok {
			continue
		}
		s.indexClaimsLocked(a, true, s.files[a], nil)
		delete(s.files, a)
		s.mergeLocked(a)
		changed = append(changed, a)
	}
	for a, eps := range m {
		s.indexClaimsLocked(a, true, s.files[a], eps)
		s.files[a] = eps
		s.mergeLocked(a)
		changed = append(changed, a)
	}
	s.endpointsChangedLocked(changed...)
}

// DeleteEndpoints makes authority unknown: it no longer exists.
func (s *Store) DeleteEndpoints(authority string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	authority = normalAuthority(authority)
	s.indexClaimsLocked(authority, true, s.files[authority], nil)
	delete(s.files, authority)
	s.mergeLocked(authority)
	s.endpointsChangedLocked(authority)
}

// LoadServiceProfiles reads the ServiceProfiles of the YAML files and, when
// all of them are good, replaces the store's profiles with theirs. The
// files may hold the other manifests the control plane knows (Services,
// HTTPRoutes, GRPCRoutes) beside the profiles, as users keep a service's
// resources; those are skipped here. On error (a bad or unknown document,
// an empty file, a profile defined twice) the store is unchanged and the
// error names the file, the document and the field.
func (s *Store) LoadServiceProfiles(paths ...string) error {
	r, err := manifest.Load(paths...)
	if err != nil {
		return err
	}
	s.SetServiceProfiles(r.ServiceProfiles)
	return nil
}

// ProfileNameProblems returns the problem of each ServiceProfile whose name
// can never be a request's authority ([profiles.ServiceProfile.NameProblem]).
func (s *Store) ProfileNameProblems() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, sp := range s.profiles {
		if err := sp.NameProblem(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// LoadEndpoints reads an endpoints file (see [manifest.ParseEndpoints]) and, when it
// is good, replaces the store's endpoint sets with its. On error the store is
// unchanged; a file that changed while it was read is an error wrapping
// filestamp's ErrChanged, to be read again later.
func (s *Store) LoadEndpoints(path string) error {
	data, err := filestamp.Read(path)
	if err != nil {
		return err
	}
	sets, err := manifest.ParseEndpoints(data)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	s.SetEndpoints(sets)
	return nil
}

// endpointSet returns the endpoints of authority and whether it exists.
// A stream watches it under endpointsKey(authority).
func (s *Store) endpointSet(authority string) ([]endpoint.Endpoint, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	eps, ok := s.endpoints[authority]
	return eps, ok
}

// setDiff is the change of an endpoint set from one version to another.
type setDiff struct {
	from, to uint64
	msgs     []message
}

// endpointUpdates returns the updates that take a Get stream from
// version from of authority's endpoint set, prev, to the current one (see
// endpointDiff; the set-level labels are those of the authority's name),
// with the current version and set. Every stream of the
// authority makes the same change when the set changes: the first
// computes its updates, and the others share them and their encoding. A
// stream watches it under endpointsKey(authority).
func (s *Store) endpointUpdates(authority string, from uint64, prev []endpoint.Endpoint) ([]message, uint64, []endpoint.Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, to := s.endpoints[authority], s.versions[authority]
	if to == from {
		return nil, from, prev
	}
	if d := s.diffs[authority]; d != nil && d.from == from && d.to == to {
		return d.msgs, to, cur
	}
	var setLabels map[string]string
	if host, _, err := net.SplitHostPort(authority); err == nil {
		setLabels = endpointSetLabels(host)
	}
	var msgs []message
	for _, u := range endpointDiff(prev, cur, setLabels) {
		msgs = append(msgs, message{Message: u, enc: &sharedEncoding{}})
	}
	if to != 0 {
		if s.diffs == nil {
			s.diffs = make(map[string]*setDiff)
		}
		s.diffs[authority] = &setDiff{from: from, to: to, msgs: msgs}
	}
	return msgs, to, cur
}

func sortedEndpoints(eps []endpoint.Endpoint) []endpoint.Endpoint {
	eps = slices.Clone(eps)
	for i := range eps {
		if eps[i].Weight == 0 {
			eps[i].Weight = endpoint.DefaultWeight
		}
	}
	slices.SortFunc(eps, func(a, b endpoint.Endpoint) int { return a.Addr.Compare(b.Addr) })
	return slices.CompactFunc(eps, func(a, b endpoint.Endpoint) bool { return a.Addr == b.Addr })
}

// ManifestProblems returns the mistakes of the loaded policy manifests
// that load but cannot work as written ([manifest.Resources.Problems]),
// each naming the file, the document and the field.
func (s *Store) ManifestProblems() []error {
	s.mu.Lock()
	r := s.manifests
	s.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.Problems()
}
