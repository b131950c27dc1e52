package controlplane

import (
	"net/netip"
	"reflect"
	"slices"

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
	// keyService names a Service (ns/name): whether it exists and which
	// ports it defines, from its manifest or the endpoint sets, and its
	// outbound policy. A reload of the manifests wakes every one.
	keyService
	// keyProfile names the ServiceProfile of a name (lower case).
	keyProfile
	// keyAddr names a workload's IP address: the profile of an IP
	// (GetProfile of a pod address), computed from the endpoint sets that
	// hold the address.
	keyAddr
	// keyInbound names a pod (ns/pod): its InboundServerPolicies. A
	// reload of the manifests or of the inbound options wakes every one.
	keyInbound
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
func inboundKey(ns, pod string) watchKey     { return watchKey{keyInbound, ns + "/" + pod} }

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
		if w.fire != nil {
			w.fire()
			continue
		}
		select {
		case w.c <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// wakeKindLocked wakes the waiters of every key of kind. The caller holds
// s.mu.
func (s *Store) wakeKindLocked(kind keyKind) {
	for k := range s.waiters {
		if k.kind == kind {
			s.wakeLocked(k)
		}
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
		} else {
			delete(s.notified, a)
		}
		s.wakeLocked(endpointsKey(a))
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
	in := func(set []endpoint.Endpoint, e endpoint.Endpoint) bool {
		i, ok := slices.BinarySearchFunc(set, e.Addr, func(x endpoint.Endpoint, a netip.AddrPort) int { return x.Addr.Compare(a) })
		return ok && sameEndpoint(set[i], e)
	}
	for _, e := range prev {
		if !in(cur, e) {
			s.wakeLocked(addrKey(e.Addr.Addr()))
		}
	}
	for _, e := range cur {
		if !in(prev, e) {
			s.wakeLocked(addrKey(e.Addr.Addr()))
		}
	}
}

// sameEndpoint reports whether two endpoints are equal in every field.
func sameEndpoint(a, b endpoint.Endpoint) bool { return reflect.DeepEqual(a, b) }

// profilesChangedLocked wakes the streams of the ServiceProfiles that
// differ between prev and the store's profiles. The caller holds s.mu.
func (s *Store) profilesChangedLocked(prev map[string]*profiles.ServiceProfile) {
	for name, sp := range prev {
		if k := profileKey(name); s.waiters[k] != nil && !reflect.DeepEqual(sp, s.profiles[name]) {
			s.wakeLocked(k)
		}
	}
	for name := range s.profiles {
		if _, ok := prev[name]; !ok {
			s.wakeLocked(profileKey(name))
		}
	}
}

// manifestsChangedLocked wakes the streams whose answer the policy
// manifests may change: every Service's (profiles and outbound policies,
// and the registrations whose binding to an identity a Pod or an
// annotation gives) and every pod's (inbound policies). Each sends only
// what changed for it. The caller holds s.mu.
func (s *Store) manifestsChangedLocked() {
	s.wakeKindLocked(keyService)
	s.wakeKindLocked(keyInbound)
}
