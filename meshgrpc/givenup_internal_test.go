package meshgrpc

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"

	"github.com/inmesh/inmesh/internal/testutil"
)

// dueCtx is a context whose deadline has passed while its timer has not
// fired yet: no error, Done open. A call is in that state when the
// server's DEADLINE_EXCEEDED, the answer to the grpc-timeout it was sent,
// comes before the client's own timer fires, a race no real server can be
// made to win on demand.
type dueCtx struct {
	context.Context
	d time.Time
}

func (c dueCtx) Deadline() (time.Time, bool) { return c.d, true }
func (c dueCtx) Done() <-chan struct{}       { return nil }

// givenUp tells whose deadline ended a call whose DEADLINE_EXCEEDED came
// at or past its deadline before the context's timer fired, without
// waiting for that timer: the route's request or retry timeout is a
// failure of the endpoint (not given up), any other deadline (the
// caller's, a ServiceProfile route's) is given up. Before, givenUp waited
// for the context to end, which here never happens.
func TestGivenUpDecidesDueDeadlineWithoutWaiting(t *testing.T) {
	past := time.Now().Add(-time.Millisecond)
	for _, tc := range []struct {
		name          string
		route         bool // the context is a routed call's
		routeDeadline time.Time
		tryDeadline   time.Time
		deadline      time.Time // the context's earliest deadline
		code          codes.Code
		want          bool
	}{
		{name: "no route, deadline passed", deadline: past, code: codes.DeadlineExceeded, want: true},
		{name: "route without timeouts, the caller's deadline", route: true, deadline: past, code: codes.DeadlineExceeded, want: true},
		{name: "the route's request timeout", route: true, routeDeadline: past, deadline: past, code: codes.DeadlineExceeded},
		{name: "the route's retry timeout", route: true, tryDeadline: past, deadline: past, code: codes.DeadlineExceeded},
		{name: "the caller's deadline before the route's", route: true, routeDeadline: past.Add(time.Millisecond / 2), deadline: past, code: codes.DeadlineExceeded, want: true},
		{name: "deadline not passed", route: true, routeDeadline: past.Add(time.Hour), deadline: past.Add(time.Hour), code: codes.DeadlineExceeded},
		{name: "another code", deadline: past, code: codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ctx context.Context = dueCtx{Context: context.Background(), d: tc.deadline}
			if tc.route {
				c := &call{Context: ctx, routeDeadline: tc.routeDeadline}
				if !tc.tryDeadline.IsZero() {
					c.tryDeadline.Store(tc.tryDeadline.UnixNano())
				}
				ctx = c
			}
			// The context the balancer sees is grpc-go's attempt's, below
			// the call's.
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			got := make(chan bool, 1)
			go func() { got <- givenUp(ctx, tc.code) }()
			select {
			case g := <-got:
				assert.Equal(t, tc.want, g)
			case <-time.After(testutil.Timeout):
				t.Fatal("givenUp waited for a timer that had not fired")
			}
		})
	}
}
