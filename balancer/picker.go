package balancer

import (
	"math/rand/v2"
	"sort"

	"github.com/inmesh/inmesh/classify"
)

// endpoint is one endpoint in a snapshot: its description, what a request
// needs from it, and its load, shared with the snapshots before and after
// for as long as the endpoint stays.
type endpoint struct {
	Endpoint
	addr   string
	labels *classify.Labels
	load   *load
}

// snapshot is everything a pick reads about one authority's endpoints. It
// is immutable once published.
type snapshot struct {
	// wait is non-nil until the first answer; it is closed when a snapshot
	// with an answer replaces this one.
	wait   chan struct{}
	err    error // no set: the source cannot resolve the authority
	exists bool
	eps    []*endpoint
	cum    []uint64 // cum[i]: the weights of eps[:i+1]
}

// newSnapshot builds the snapshot of u, keeping the loads of the endpoints
// of prev that stay.
func newSnapshot(u Update, prev *snapshot, defaultRTT float64, now int64) *snapshot {
	s := &snapshot{err: u.Err}
	if u.Set == nil {
		return s
	}
	s.exists = u.Set.Exists
	old := make(map[string]*load, len(prev.eps))
	for _, e := range prev.eps {
		old[e.addr] = e.load
	}
	var total uint64
	for _, e := range u.Set.Endpoints {
		ep := &endpoint{Endpoint: e, addr: e.Addr.String()}
		if ep.load = old[ep.addr]; ep.load == nil {
			ep.load = newLoad(defaultRTT, now)
		}
		if len(e.Labels) > 0 {
			ep.labels = classify.NewLabels("dst_", e.Labels)
		}
		total += uint64(max(e.Weight, 1))
		s.eps = append(s.eps, ep)
		s.cum = append(s.cum, total)
	}
	return s
}

// clearlyLower is how much lower the second draw's cost must be for it to
// win: between endpoints of about equal load, the first draw (by weight)
// wins, so that weights decide the share; a real difference in load
// (requests in flight, a slow or failing endpoint) decides otherwise.
const clearlyLower = 0.75

// pick draws two different endpoints at random by weight and returns the
// first unless the second's cost is clearly lower (power of two choices).
func (s *snapshot) pick(now int64, decay float64) *endpoint {
	switch len(s.eps) {
	case 0:
		return nil
	case 1:
		return s.eps[0]
	}
	total := s.cum[len(s.cum)-1]
	i := s.find(rand.Uint64N(total))
	// The second draw leaves the first endpoint's weight out.
	wi := uint64(max(s.eps[i].Weight, 1))
	n := rand.Uint64N(total - wi)
	if n >= s.cum[i]-wi {
		n += wi
	}
	a, b := s.eps[i], s.eps[s.find(n)]
	if b.load.cost(now, decay) < clearlyLower*a.load.cost(now, decay) {
		return b
	}
	return a
}

// find returns the endpoint whose weight interval holds n.
func (s *snapshot) find(n uint64) int {
	return sort.Search(len(s.cum), func(i int) bool { return s.cum[i] > n })
}
