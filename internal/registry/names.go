package registry

import "sync"

// Names is a bounded set of metric label values: the first max distinct
// names admitted stay admitted for the life of the set, later ones are
// refused. Metric series outlive the state that created them (an SDK with
// cumulative temporality keeps every series it has seen), so label values
// are bounded for the life of the process rather than released with their
// entries. It is safe for concurrent use; callers consult it when an entry
// is created, not per request.
type Names struct {
	mu    sync.Mutex
	max   int
	names map[string]struct{}
}

// NewNames returns a set admitting at most max names (max <= 0: none).
func NewNames(max int) *Names {
	return &Names{max: max, names: make(map[string]struct{})}
}

// Admit reports whether name is in the set, adding it while there is room.
func (n *Names) Admit(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.names[name]; ok {
		return true
	}
	if len(n.names) >= n.max {
		return false
	}
	n.names[name] = struct{}{}
	return true
}

// Len returns the number of names admitted.
func (n *Names) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.names)
}
