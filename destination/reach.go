package destination

import (
	"context"
	"errors"
	"net"
	"sync/atomic"

	"github.com/inmesh/inmesh/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// reach holds the last error met on the way to the control plane: a dial
// that failed, a stream that could not open or broke (Unavailable), or
// any end of an inbound policy stream. A message from the control plane
// clears it. It is one error, the latest, never a list.
type reach struct{ err atomic.Pointer[error] }

// set records err as the latest, unless it is the client's own doing (its
// Close, a watch it stopped).
func (r *reach) set(err error) {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrClosed) || status.Code(err) == codes.Canceled {
		return
	}
	r.err.Store(&err)
}

// clear forgets the last error: the control plane answered.
func (r *reach) clear() {
	if r.err.Load() != nil {
		r.err.Store(nil)
	}
}

// get returns the last error, or nil.
func (r *reach) get() error {
	if p := r.err.Load(); p != nil {
		return *p
	}
	return nil
}

// recordingDial dials with dial and records each failure in r, unless
// the dial's context ended first.
func recordingDial(dial backoff.DialFunc, r *reach) backoff.DialFunc {
	return func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		c, err = dial(ctx, network, addr)
		if err != nil && ctx.Err() == nil {
			r.set(err)
		}
		return c, err
	}
}
