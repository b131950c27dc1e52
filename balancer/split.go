package balancer

import (
	"context"
	"math/rand/v2"
	"sort"

	"github.com/inmesh/inmesh/balancer/endpoint"
	authpkg "github.com/inmesh/inmesh/internal/authority"
)

// SplitSource streams the traffic split of authorities (host:port): the
// other authorities a request to one goes to instead, by weight, such as
// the dst overrides of a ServiceProfile (profiles.Splits adapts a source
// of profiles).
//
// WatchSplit starts watching authority and returns at once. The source
// calls update with each new split, in order, never concurrently for one
// watch and never from within WatchSplit; a state may be skipped when a
// newer one replaced it first. An empty split (nil) means no split: every
// request goes to the authority itself. Transient failures are not
// reported: the last split stays in force. The watch ends when ctx is done
// or stop is called; stop waits until update has returned for the last
// time and is safe to call more than once. WatchSplit returns an error
// (such as the source's bound on watched authorities) when it cannot
// watch; stop is then nil. Implementations are safe for concurrent use.
type SplitSource interface {
	WatchSplit(ctx context.Context, authority string, update func([]endpoint.WeightedDst)) (stop func(), err error)
}

// Split is the traffic split of an authority (from a [SplitSource]), each
// backend chosen in proportion to its weight. It is immutable and
// safe for concurrent use. A nil *Split sends every request to the
// authority itself.
type Split struct {
	backends []string // normalized host:port
	cum      []uint64 // cum[i]: the weights of backends[:i+1]
}

// NewSplit returns the split over dsts. Overrides of weight 0 and
// authorities that are not host:port are left out; when none remains (all
// weights zero, or no overrides) it returns nil: the authority itself.
func NewSplit(dsts []endpoint.WeightedDst) *Split {
	var s Split
	var total uint64
	for _, d := range dsts {
		a, err := authpkg.Normalize(d.Authority)
		if d.Weight == 0 || err != nil {
			continue
		}
		total += uint64(d.Weight)
		s.backends = append(s.backends, a)
		s.cum = append(s.cum, total)
	}
	if total == 0 {
		return nil
	}
	return &s
}

// Backends returns the authorities of the split, in the order given.
func (s *Split) Backends() []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s.backends...)
}

// Pick returns the authority one request goes to, at random by weight, or
// "" for a nil Split.
func (s *Split) Pick() string {
	if s == nil {
		return ""
	}
	n := rand.Uint64N(s.cum[len(s.cum)-1])
	return s.backends[sort.Search(len(s.cum), func(i int) bool { return s.cum[i] > n })]
}
