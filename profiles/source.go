package profiles

import (
	"context"
	"errors"
)

// ErrNoProfile is wrapped by [Update.Err] when the source has no profile for
// an authority and will not look again on this watch (Linkerd's control plane
// answered InvalidArgument or FailedPrecondition). Requests then use the
// default route.
var ErrNoProfile = errors.New("profiles: no profile for this authority")

// ErrTooManyWatches is returned by [Source.Watch] when the source already
// watches as many authorities as it may.
var ErrTooManyWatches = errors.New("profiles: too many watched authorities")

// Update is one state of a profile watch.
type Update struct {
	// Profile is the profile now in force, or nil when none is known and
	// requests use the default route.
	Profile *Profile
	// Err, with a nil Profile, tells why there is none (it wraps
	// [ErrNoProfile] when the source gave up on the authority).
	Err error
}

// Source streams the profiles of authorities (host:port).
//
// Watch starts watching authority and returns at once. The source calls
// update with each new state, in order, never concurrently for one watch and
// never from within Watch; a state may be skipped when a newer one replaced
// it before update was called. Transient failures are not reported: the last
// state stays in force while the source reconnects. The watch ends when ctx
// is done or stop is called; stop waits until update has returned for the
// last time and is safe to call more than once. Watch returns an error
// (such as [ErrTooManyWatches]) when it cannot watch; stop is then nil.
//
// Implementations are safe for concurrent use.
type Source interface {
	Watch(ctx context.Context, authority string, update func(Update)) (stop func(), err error)
}
