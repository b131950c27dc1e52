package backoff

import (
	"context"
	"errors"
	"time"
)

// Wait blocks for d on a timer of its own, or until ctx is done, whichever
// comes first. It returns ctx.Err() when the context ended the wait.
func Wait(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrResetBackoff, wrapped into an error returned by the operation of
// [Retry], says that the operation made progress before it failed (a stream
// that delivered messages), so the next wait starts again from the policy's
// first delay.
var ErrResetBackoff = errors.New("backoff: progress made, reset")

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so that [Retry] stops instead of trying again.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked with [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// Retry calls op until it returns nil, returns an error marked [Permanent],
// or ctx is done. After every other error it waits out the policy's next
// delay before calling op again; an error wrapping [ErrResetBackoff] resets
// the attempt count first, so a long-lived stream that broke after working
// reconnects after the shortest delay, never at once.
//
// Retry returns nil after a success, the permanent error (unwrapped), or
// ctx.Err() after cancellation. onRetry, if not nil, is called with each
// error and the delay about to be waited.
func Retry(ctx context.Context, p Policy, op func(context.Context) error, onRetry func(err error, delay time.Duration)) error {
	seq := NewSequence(p)
	for {
		err := op(ctx)
		if err == nil {
			return nil
		}
		var perm *permanentError
		if errors.As(err, &perm) {
			return perm.err
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if errors.Is(err, ErrResetBackoff) {
			seq.Reset()
		}
		d := seq.Next()
		if onRetry != nil {
			onRetry(err, d)
		}
		if err := Wait(ctx, d); err != nil {
			return err
		}
	}
}
