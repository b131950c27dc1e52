package policy

import (
	"context"
	"errors"
	"sync"

	"github.com/inmesh/inmesh/internal/mailbox"
)

// ErrTooManyWatches is returned by [Source.Watch] when the source already
// watches as many targets as it may.
var ErrTooManyWatches = errors.New("policy: too many watched targets")

// Update is one state of a policy watch.
type Update struct {
	// Policy is the policy now in force, or nil when none is known and
	// requests use the default route.
	Policy *Policy
	// Err, with a nil Policy, tells why there is none.
	Err error
}

// Source streams the outbound policies of authorities (host:port), with
// the contract of profiles.Source: Watch returns at once; update is called
// with each new state, in order, never concurrently for one watch and never
// from within Watch; a state may be skipped when a newer one replaced it;
// transient failures are not reported (the last state stays in force); the
// watch ends when ctx is done or stop is called, and stop waits until update
// has returned for the last time. Watch returns an error (such as
// [ErrTooManyWatches]) when it cannot watch; stop is then nil.
type Source interface {
	Watch(ctx context.Context, authority string, update func(Update)) (stop func(), err error)
}

// StaticSource is a [Source] of policies set by hand, for programs without
// a control plane: each Set reaches the watchers of its authority at once.
// Its zero value is empty and ready; it is safe for concurrent use.
type StaticSource struct {
	mu       sync.Mutex
	policies map[string]*Policy
	watchers map[string]map[*mailbox.Mailbox[Update]]struct{}
}

var _ Source = (*StaticSource)(nil)

// NewStaticSource returns a source serving the policies of m (authority
// host:port to policy); m is copied.
func NewStaticSource(m map[string]*Policy) *StaticSource {
	s := &StaticSource{}
	for a, p := range m {
		s.Set(a, p)
	}
	return s
}

func (s *StaticSource) initLocked() {
	if s.policies == nil {
		s.policies = make(map[string]*Policy)
		s.watchers = make(map[string]map[*mailbox.Mailbox[Update]]struct{})
	}
}

// Set makes p the policy of authority; nil removes it (the default route).
// p must not change afterwards.
func (s *StaticSource) Set(authority string, p *Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	if p == nil {
		delete(s.policies, authority)
	} else {
		s.policies[authority] = p
	}
	for m := range s.watchers[authority] {
		m.Offer(Update{Policy: p})
	}
}

// Watch implements [Source]. A watcher gets the current policy first (an
// update with a nil policy when there is none).
func (s *StaticSource) Watch(ctx context.Context, authority string, update func(Update)) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	var m *mailbox.Mailbox[Update]
	m = mailbox.Start(context.Background(), ctx, nil, update, func() {
		s.mu.Lock()
		delete(s.watchers[authority], m)
		if len(s.watchers[authority]) == 0 {
			delete(s.watchers, authority)
		}
		s.mu.Unlock()
	})
	if s.watchers[authority] == nil {
		s.watchers[authority] = make(map[*mailbox.Mailbox[Update]]struct{})
	}
	s.watchers[authority][m] = struct{}{}
	m.Offer(Update{Policy: s.policies[authority]})
	return m.Stop, nil
}
