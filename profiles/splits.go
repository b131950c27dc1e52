package profiles

import (
	"context"

	"github.com/inmesh/inmesh/balancer/endpoint"
)

// SplitWatcher is the traffic split of the profiles of a [Source]: each
// authority's dst overrides. Its method set is balancer.SplitSource's, so
// that balancer.WithSplits(profiles.Splits(src)) splits traffic by the
// profiles of src without this package knowing the balancer.
type SplitWatcher struct{ src Source }

// Splits returns the traffic split of src's profiles; nil for a nil src.
func Splits(src Source) *SplitWatcher {
	if src == nil {
		return nil
	}
	return &SplitWatcher{src: src}
}

// WatchSplit watches the profile of authority and calls update with its
// dst overrides: nil while there is no profile or it has none. It returns
// what [Source.Watch] returns.
func (w *SplitWatcher) WatchSplit(ctx context.Context, authority string, update func([]endpoint.WeightedDst)) (func(), error) {
	return w.src.Watch(ctx, authority, func(u Update) {
		var dsts []endpoint.WeightedDst
		if u.Profile != nil {
			dsts = u.Profile.DstOverrides
		}
		update(dsts)
	})
}
