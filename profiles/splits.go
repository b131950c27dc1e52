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

// Cache is implemented by a [Source] that keeps the last update of each
// authority it watches (destination.Client does), so that a new watcher
// can start from it before Watch returns.
type Cache interface {
	// CachedProfile returns the last update the source has for
	// authority, and false when it has none (it watches no such
	// authority, or no answer came yet).
	CachedProfile(authority string) (Update, bool)
}

// WatchSplit watches the profile of authority and calls update with its
// dst overrides: nil while there is no profile or it has none. When the
// source is a [Cache] that already has the authority's profile, update is
// called with its overrides before WatchSplit returns, so that the very
// request that starts the watch (after a router waited for that profile)
// is split. It returns what [Source.Watch] returns.
func (w *SplitWatcher) WatchSplit(ctx context.Context, authority string, update func([]endpoint.WeightedDst)) (func(), error) {
	if c, ok := w.src.(Cache); ok {
		// Before Watch, whose first update is this one or a later one:
		// the order of updates holds.
		if u, ok := c.CachedProfile(authority); ok {
			update(overrides(u))
		}
	}
	return w.src.Watch(ctx, authority, func(u Update) { update(overrides(u)) })
}

// overrides returns the dst overrides of u's profile, nil without one.
func overrides(u Update) []endpoint.WeightedDst {
	if u.Profile != nil {
		return u.Profile.DstOverrides
	}
	return nil
}
