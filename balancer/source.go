package balancer

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/inmesh/inmesh/balancer/endpoint"
	authpkg "github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/mailbox"
)

// Source streams the endpoint sets of authorities (host:port).
//
// WatchEndpoints starts watching authority and returns at once. The source
// calls update with each new state, in order, never concurrently for one
// watch and never from within WatchEndpoints; a state may be skipped when a
// newer one replaced it first. Transient failures are not reported: the
// last state stays in force. The watch ends when ctx is done or stop is
// called; stop waits until update has returned for the last time and is
// safe to call more than once. WatchEndpoints returns an error (such as
// the source's bound on watched authorities) when it cannot watch; stop is
// then nil.
//
// destination.Client is a Source. Implementations are safe for concurrent
// use.
type Source interface {
	WatchEndpoints(ctx context.Context, authority string, update func(endpoint.Update)) (stop func(), err error)
}

// StaticSource is a [Source] of endpoint sets given by hand: each Set
// reaches the watchers of its authority at once. An authority it has no set
// for does not exist (requests fall back to their own address). Its zero
// value is empty and ready; it is safe for concurrent use.
type StaticSource struct {
	mu       sync.Mutex
	sets     map[string]*endpoint.Set
	watchers map[string]map[*mailbox.Mailbox[endpoint.Update]]struct{}
}

var _ Source = (*StaticSource)(nil)

// NewStaticSource returns a source serving the endpoints of m (authority
// host:port to its endpoints; m is copied). It fails as [StaticSource.Set]
// does.
func NewStaticSource(m map[string][]endpoint.Endpoint) (*StaticSource, error) {
	s := &StaticSource{}
	for a, eps := range m {
		if err := s.Set(a, eps); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Set makes eps the endpoints of authority (an empty list: the service
// exists with no endpoints; requests wait in the queue for some, see
// [WithQueue]). A zero weight becomes
// [endpoint.DefaultWeight]. It fails on an authority that is not
// host:port, or an endpoint without an address and port; the last good set
// stays.
func (s *StaticSource) Set(authority string, eps []endpoint.Endpoint) error {
	a, err := authpkg.Normalize(authority)
	if err != nil {
		return fmt.Errorf("balancer: static endpoints: authority: %w", err)
	}
	set := &endpoint.Set{Exists: true, Endpoints: slices.Clone(eps)}
	for i := range set.Endpoints {
		if ap := set.Endpoints[i].Addr; !ap.IsValid() || ap.Port() == 0 {
			return fmt.Errorf("balancer: static endpoints: %s: endpoint %d: Addr %q is not an address and port", a, i, ap)
		}
		if set.Endpoints[i].Weight == 0 {
			set.Endpoints[i].Weight = endpoint.DefaultWeight
		}
	}
	slices.SortFunc(set.Endpoints, func(x, y endpoint.Endpoint) int { return x.Addr.Compare(y.Addr) })
	s.publish(a, set)
	return nil
}

// Delete forgets the endpoints of authority: the service no longer exists.
func (s *StaticSource) Delete(authority string) {
	if a, err := authpkg.Normalize(authority); err == nil {
		s.publish(a, nil)
	}
}

func (s *StaticSource) publish(a string, set *endpoint.Set) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	if set == nil {
		delete(s.sets, a)
	} else {
		s.sets[a] = set
	}
	for m := range s.watchers[a] {
		m.Offer(s.updateLocked(a))
	}
}

func (s *StaticSource) initLocked() {
	if s.sets == nil {
		s.sets = make(map[string]*endpoint.Set)
		s.watchers = make(map[string]map[*mailbox.Mailbox[endpoint.Update]]struct{})
	}
}

func (s *StaticSource) updateLocked(a string) endpoint.Update {
	if set := s.sets[a]; set != nil {
		return endpoint.Update{Set: set}
	}
	return endpoint.Update{Set: &endpoint.Set{Exists: false}}
}

// WatchEndpoints implements [Source]. A watcher gets the current state
// first.
func (s *StaticSource) WatchEndpoints(ctx context.Context, authority string, update func(endpoint.Update)) (func(), error) {
	a, err := authpkg.Normalize(authority)
	if err != nil {
		return nil, fmt.Errorf("balancer: static endpoints: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	var m *mailbox.Mailbox[endpoint.Update]
	m = mailbox.Start(context.Background(), ctx, nil, update, func() {
		s.mu.Lock()
		delete(s.watchers[a], m)
		if len(s.watchers[a]) == 0 {
			delete(s.watchers, a)
		}
		s.mu.Unlock()
	})
	if s.watchers[a] == nil {
		s.watchers[a] = make(map[*mailbox.Mailbox[endpoint.Update]]struct{})
	}
	s.watchers[a][m] = struct{}{}
	m.Offer(s.updateLocked(a))
	return m.Stop, nil
}
