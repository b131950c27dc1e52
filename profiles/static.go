package profiles

import (
	"context"
	"sync"

	"github.com/inmesh/inmesh/internal/mailbox"
)

// StaticSource is a [Source] of profiles set by hand: each Set reaches the
// watchers of its authority at once. Its zero value is empty and ready. A
// StaticSource is safe for concurrent use.
type StaticSource struct {
	mu       sync.Mutex
	profiles map[string]*Profile
	watchers map[string]map[*mailbox.Mailbox[Update]]struct{}
}

var _ Source = (*StaticSource)(nil)

// NewStaticSource returns a source serving the profiles of m (authority
// host:port to profile); m is copied.
func NewStaticSource(m map[string]*Profile) *StaticSource {
	s := &StaticSource{}
	for a, p := range m {
		s.Set(a, p)
	}
	return s
}

// Set makes p the profile of authority; nil removes it (the default route).
func (s *StaticSource) Set(authority string, p *Profile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.profiles == nil {
		s.profiles = make(map[string]*Profile)
		s.watchers = make(map[string]map[*mailbox.Mailbox[Update]]struct{})
	}
	if p == nil {
		delete(s.profiles, authority)
	} else {
		s.profiles[authority] = p
	}
	for m := range s.watchers[authority] {
		m.Offer(Update{Profile: p})
	}
}

// Watch implements [Source]. A watcher gets the current profile first (an
// update with a nil profile when there is none).
func (s *StaticSource) Watch(ctx context.Context, authority string, update func(Update)) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchers == nil {
		s.profiles = make(map[string]*Profile)
		s.watchers = make(map[string]map[*mailbox.Mailbox[Update]]struct{})
	}
	var m *mailbox.Mailbox[Update]
	m = mailbox.Start(context.Background(), ctx, nil, update, func() {
		s.mu.Lock()
		delete(s.watchers[authority], m)
		s.mu.Unlock()
	})
	if s.watchers[authority] == nil {
		s.watchers[authority] = make(map[*mailbox.Mailbox[Update]]struct{})
	}
	s.watchers[authority][m] = struct{}{}
	m.Offer(Update{Profile: s.profiles[authority]})
	return m.Stop, nil
}
