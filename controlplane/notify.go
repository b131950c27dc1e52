package controlplane

import (
	"crypto/sha256"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/inmesh/inmesh/destination"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/profiles"
)

// A Store wakes a stream only when something it watches changed, as
// go-control-plane's linear cache notifies only the watchers of the
// resource that changed: each stream registers a waiter under the keys of
// the resources its answer is computed from, and a change wakes the
// waiters of its keys alone. An endpoint change to one Service thus costs
// the streams of that Service, not every open stream.

// keyKind is the kind of resource a watchKey names.
type keyKind uint8

const (
	// keyEndpoints names the endpoint set of an authority (host:port,
	// lower case): the Destination API's Get.
	keyEndpoints keyKind = iota
	// keyService names a Service (ns/name): whether it exists, which
	// ports it defines and which are opaque, from its manifest or the
	// endpoint sets, and the identities that may register its endpoints.
	keyService
	// keyProfile names the ServiceProfile of a name (lower case).
	keyProfile
	// keyAddr names a workload's IP address: the profile of an IP
	// (GetProfile of a pod address), computed from the endpoint sets that
	// hold the address.
	keyAddr
	// keyInbound names a pod's port (ns/pod:port): its
	// InboundServerPolicies.
	keyInbound
	// keyPolicy names a Service port as clients of a namespace see it
	// (ns/name:port@source): its outbound policy.
	keyPolicy
)

// watchKey names one resource that streams watch.
type watchKey struct {
	kind keyKind
	name string
}

func endpointsKey(authority string) watchKey { return watchKey{keyEndpoints, authority} }
func serviceKey(ref serviceRef) watchKey     { return watchKey{keyService, ref.ns + "/" + ref.name} }
func profileKey(name string) watchKey        { return watchKey{keyProfile, name} }
func addrKey(ip netip.Addr) watchKey         { return watchKey{keyAddr, ip.Unmap().String()} }
func inboundKey(ns, pod string, port uint16) watchKey {
	return watchKey{keyInbound, ns + "/" + pod + ":" + strconv.FormatUint(uint64(port), 10)}
}
func policyKey(source, ns, name string, port uint16) watchKey {
	return watchKey{keyPolicy, ns + "/" + name + ":" + strconv.FormatUint(uint64(port), 10) + "@" + source}
}

// splitPolicyKey splits the name of a keyPolicy key.
func splitPolicyKey(k watchKey) (source, ns, name string, port uint16, ok bool) {
	rest, source, ok1 := strings.Cut(k.name, "@")
	ns, name, port, ok2 := splitKey(watchKey{k.kind, rest})
	return source, ns, name, port, ok1 && ok2
}

// splitKey splits the name of a keyInbound or keyPolicy key.
func splitKey(k watchKey) (ns, name string, port uint16, ok bool) {
	ns, rest, ok1 := strings.Cut(k.name, "/")
	name, sport, ok2 := strings.Cut(rest, ":")
	p, err := strconv.ParseUint(sport, 10, 16)
	return ns, name, uint16(p), ok1 && ok2 && err == nil
}

// waiter is one stream's wake-up: a change of any of its keys leaves a
// signal in c (one at most: changes that come while the stream is busy
// merge into one wake-up, after which the stream reads the current state).
type waiter struct {
	c    chan struct{}
	keys []watchKey
	// fire, when set, replaces c: it is called, under the store's lock,
	// for each change of the keys, and must not block nor take the
	// store's lock. The Watches service's streams use it to mark one
	// subscription of many dirty without a goroutine per subscription.
	fire func()
}

// subscribe registers a waiter for keys. Register before reading the
// state the keys name, so that a change in between is never missed.
func (s *Store) subscribe(keys ...watchKey) *waiter {
	return s.subscribeWaiter(&waiter{c: make(chan struct{}, 1), keys: keys})
}

// subscribeFunc registers a waiter for keys that calls fire on each change
// (see waiter.fire).
func (s *Store) subscribeFunc(fire func(), keys ...watchKey) *waiter {
	return s.subscribeWaiter(&waiter{keys: keys, fire: fire})
}

func (s *Store) subscribeWaiter(w *waiter) *waiter {
	keys := w.keys
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiters == nil {
		s.waiters = make(map[watchKey]map[*waiter]struct{})
	}
	for _, k := range keys {
		ws := s.waiters[k]
		if ws == nil {
			ws = make(map[*waiter]struct{}, 1)
			s.waiters[k] = ws
		}
		ws[w] = struct{}{}
	}
	return w
}

// unsubscribe removes w; a key nobody watches any more is forgotten.
func (s *Store) unsubscribe(w *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range w.keys {
		ws := s.waiters[k]
		delete(ws, w)
		if len(ws) == 0 {
			delete(s.waiters, k)
		}
	}
}

// wakeLocked wakes the waiters of k. The caller holds s.mu.
func (s *Store) wakeLocked(k watchKey) {
	for w := range s.waiters[k] {
		w.wake()
	}
}

// wakeKeysLocked wakes the waiters of keys, each once however many of its
// keys are among them. The caller holds s.mu.
func (s *Store) wakeKeysLocked(keys []watchKey) {
	if len(keys) == 1 {
		s.wakeLocked(keys[0])
		return
	}
	woken := make(map[*waiter]bool)
	for _, k := range keys {
		for w := range s.waiters[k] {
			if !woken[w] {
				woken[w] = true
				w.wake()
			}
		}
	}
}

func (w *waiter) wake() {
	if w.fire != nil {
		w.fire()
		return
	}
	select {
	case w.c <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// notifyLocked wakes every open stream, for a change whose reach is not
// known; prefer the narrower wake-ups above. The caller holds s.mu.
//
//lint:ignore U1000 the one wake-up for a Store change that names no resource
func (s *Store) notifyLocked() {
	for k := range s.waiters {
		s.wakeLocked(k)
	}
}

// endpointsChangedLocked wakes the streams whose answer depends on the
// endpoint sets of authorities, after s.endpoints changed for them (set,
// replaced or deleted): the Get streams of each authority whose set
// differs from the one last notified, the profile streams of the IP
// addresses that entered or left a set or changed in it, and, when an
// authority appeared or went away (a Service's existence and ports), the
// streams of its Service. An authority whose set is equal to the last one
// notified wakes nobody. It keeps the index of the Services the endpoint
// sets name. The caller holds s.mu.
func (s *Store) endpointsChangedLocked(authorities ...string) {
	if s.notified == nil {
		s.notified = make(map[string][]endpoint.Endpoint)
	}
	if s.endpointServices == nil {
		s.endpointServices = make(map[serviceRef]int)
	}
	for _, a := range authorities {
		a = normalAuthority(a)
		prev, had := s.notified[a]
		cur, has := s.endpoints[a]
		if had == has && slices.EqualFunc(prev, cur, sameEndpoint) {
			continue
		}
		if has {
			s.notified[a] = cur
			if s.versions == nil {
				s.versions = make(map[string]uint64)
			}
			s.setSeq++
			s.versions[a] = s.setSeq
		} else {
			delete(s.notified, a)
			delete(s.versions, a)
			delete(s.diffs, a)
		}
		s.wakeLocked(endpointsKey(a))
		s.indexServedLocked(a, prev, cur)
		s.wakeAddrsLocked(prev, cur)
		if had == has {
			continue
		}
		ns, name, _, ok := manifest.ParseAuthority(a)
		if !ok {
			continue
		}
		ref := serviceRef{ns: ns, name: name}
		if has {
			s.endpointServices[ref]++
		} else if s.endpointServices[ref]--; s.endpointServices[ref] <= 0 {
			delete(s.endpointServices, ref)
		}
		s.wakeLocked(serviceKey(ref))
	}
}

// wakeAddrsLocked wakes the profile streams of the IP addresses of prev
// and cur, the old and new sets of one authority, whose endpoints
// differ between the two.
func (s *Store) wakeAddrsLocked(prev, cur []endpoint.Endpoint) {
	if len(s.waiters) == 0 {
		return
	}
	wake := func(e endpoint.Endpoint) { s.wakeLocked(addrKey(e.Addr.Addr())) }
	changedEndpoints(prev, cur, sameEndpoint, wake, wake)
}

// sameEndpoint reports whether two endpoints are equal in every field.
func sameEndpoint(a, b endpoint.Endpoint) bool { return reflect.DeepEqual(a, b) }

// profilesChangedLocked wakes the streams of the ServiceProfiles that
// differ between prev and the store's profiles. The caller holds s.mu.
func (s *Store) profilesChangedLocked(prev map[profileID]*profiles.ServiceProfile) {
	for id, sp := range prev {
		if k := profileKey(id.name); s.waiters[k] != nil && !reflect.DeepEqual(sp, s.profiles[id]) {
			s.wakeLocked(k)
		}
	}
	for id := range s.profiles {
		if _, ok := prev[id]; !ok {
			s.wakeLocked(profileKey(id.name))
		}
	}
}

// manifestsChangedLocked wakes the streams whose answer differs between
// the policy manifests and inbound options prev and prevOpts and the
// store's: for each key a stream watches that the manifests decide, its
// answer under the new state is compared with its answer under the old,
// and only the keys whose answer changed are woken. A reload that changes
// one Service thus wakes the streams of what depends on it (its own, and
// those of the Services whose routes have it as a backend), not every
// stream. The answers a reload computes are kept (as digests) for the
// next one, so that each is computed once per reload: only a key first
// watched since the last reload has its old answer computed too. The
// caller holds s.mu, and calls this after every change of s.manifests or
// s.inbound.
func (s *Store) manifestsChangedLocked(prev *manifest.Resources, prevOpts manifest.InboundOptions) {
	before, after := orNoResources(prev), orNoResources(s.manifests)
	var changed []watchKey
	answers := make(map[watchKey]answerDigest, len(s.answers))
	for k := range s.waiters {
		var same bool
		switch k.kind {
		case keyService:
			ns, name, _ := strings.Cut(k.name, "/")
			same = sameServiceAnswer(before, after, prevOpts, s.inbound, ns, name)
		case keyPolicy:
			source, ns, name, port, ok := splitPolicyKey(k)
			if !ok {
				continue
			}
			cur := digest(policyAnswer(after, source, ns, name, port))
			old, known := s.answers[k]
			if !known {
				old = digest(policyAnswer(before, source, ns, name, port))
			}
			answers[k], same = cur, cur == old
		case keyInbound:
			ns, pod, port, ok := splitKey(k)
			if !ok {
				continue
			}
			cur := digest(inboundAnswer(after, s.inbound, ns, pod, port))
			old, known := s.answers[k]
			if !known {
				old = digest(inboundAnswer(before, prevOpts, ns, pod, port))
			}
			answers[k], same = cur, cur == old
		default:
			continue
		}
		if !same {
			changed = append(changed, k)
		}
	}
	s.answers = answers
	// A stream that watches several changed keys (a policy stream, its
	// Service and its port) wakes once.
	s.wakeKeysLocked(changed)
}

// answerDigest is the SHA-256 of an encoded answer: two answers are the
// same when their digests are.
type answerDigest [sha256.Size]byte

func digest(b []byte) answerDigest { return sha256.Sum256(b) }

func orNoResources(r *manifest.Resources) *manifest.Resources {
	if r == nil {
		return &manifest.Resources{}
	}
	return r
}

// sameServiceAnswer reports whether what the streams of a Service's
// serviceKey read from the manifests is the same in a and b: its manifest
// (existence, ports, the annotations that make ports opaque), and the
// identities that may register its endpoints.
func sameServiceAnswer(a, b *manifest.Resources, aOpts, bOpts manifest.InboundOptions, ns, name string) bool {
	sa, sb := a.Service(ns, name), b.Service(ns, name)
	if (sa == nil) != (sb == nil) {
		return false
	}
	if sa != nil && (!reflect.DeepEqual(sa.Ports, sb.Ports) || !maps.Equal(sa.Annotations, sb.Annotations)) {
		return false
	}
	return slices.Equal(a.RegistrationIdentities(ns, name, aOpts), b.RegistrationIdentities(ns, name, bOpts))
}

// policyAnswer is the encoding of the outbound policy of a Service port
// under r, as a stream would be sent it.
func policyAnswer(r *manifest.Resources, source, ns, name string, port uint16) []byte {
	p := r.PolicyFrom(source, ns, name, port)
	if p == nil {
		return nil
	}
	b, err := deterministic.Marshal(destination.PolicyToProto(p))
	if err != nil {
		return nil
	}
	return b
}

// inboundAnswer is the encoding of the Server of a pod's port under r and
// opts, or of the error that refuses it.
func inboundAnswer(r *manifest.Resources, opts manifest.InboundOptions, ns, pod string, port uint16) []byte {
	srv, err := r.InboundServer(ns, pod, port, opts)
	if err != nil {
		return []byte("error: " + inboundError(err).Error())
	}
	b, err := deterministic.Marshal(destination.ServerToProto(srv))
	if err != nil {
		return nil
	}
	return b
}
