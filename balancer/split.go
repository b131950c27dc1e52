package balancer

import (
	"math/rand/v2"
	"sort"

	authpkg "github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/profiles"
)

// Split is the traffic split of an authority: the dst overrides of its
// profile, each chosen in proportion to its weight. It is immutable and
// safe for concurrent use. A nil *Split sends every request to the
// authority itself.
type Split struct {
	backends []string // normalized host:port
	cum      []uint64 // cum[i]: the weights of backends[:i+1]
}

// NewSplit returns the split over dsts. Overrides of weight 0 and
// authorities that are not host:port are left out; when none remains (all
// weights zero, or no overrides) it returns nil: the authority itself.
func NewSplit(dsts []profiles.WeightedDst) *Split {
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
