package backoff

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ms = time.Millisecond

func TestDelay(t *testing.T) {
	tests := []struct {
		name    string
		p       Policy
		attempt int
		u       float64
		want    time.Duration
	}{
		{"first attempt is min", Policy{Min: 100 * ms, Max: 5 * time.Second}, 0, 0, 100 * ms},
		{"doubles", Policy{Min: 100 * ms, Max: 5 * time.Second}, 3, 0, 800 * ms},
		{"capped at max", Policy{Min: 100 * ms, Max: 5 * time.Second}, 6, 0, 5 * time.Second},
		{"huge attempt saturates", Policy{Min: 100 * ms, Max: 5 * time.Second}, 1 << 30, 0, 5 * time.Second},
		{"attempt 62 saturates", Policy{Min: 1, Max: math.MaxInt64}, 62, 0, 1 << 62},
		{"negative attempt is first", Policy{Min: 100 * ms, Max: time.Second}, -4, 0, 100 * ms},
		{"jitter adds", Policy{Min: 100 * ms, Max: 5 * time.Second, Jitter: 0.5}, 0, 0.5, 125 * ms},
		{"jitter never passes max", Policy{Min: 4 * time.Second, Max: 5 * time.Second, Jitter: 100}, 0, 0.999, 5 * time.Second},
		{"jitter at max adds nothing", Policy{Min: 100 * ms, Max: time.Second, Jitter: 1}, 10, 0.9, time.Second},
		{"fixed", mustFixed(3 * time.Second), 7, 0.9, 3 * time.Second},
		{"zero policy is default", Policy{}, 0, 0, DefaultPolicy().Min},
		{"invalid min zero never spins", Policy{Min: 0, Max: time.Second}, 0, 0.5, DefaultPolicy().Min},
		{"invalid max zero never spins", Policy{Min: 0, Max: 0, Jitter: 0.1}, 0, 0, DefaultPolicy().Min},
		{"min above max clamps", Policy{Min: 2 * time.Second, Max: time.Second}, 0, 0, time.Second},
		{"NaN jitter adds nothing", Policy{Min: ms, Max: time.Second, Jitter: math.NaN()}, 0, 0.5, ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.p.delay(tt.attempt, tt.u))
		})
	}
}

func TestDelayBounds(t *testing.T) {
	p := Policy{Min: 10 * ms, Max: 700 * ms, Jitter: 0.3}
	for attempt := range 20 {
		base := min(10*ms<<attempt, 700*ms)
		for range 200 {
			d := p.Delay(attempt)
			require.GreaterOrEqual(t, d, base, "attempt %d", attempt)
			require.LessOrEqual(t, d, p.Max, "attempt %d", attempt)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		p       Policy
		wantErr string
	}{
		{"zero is default", Policy{}, ""},
		{"fixed", mustFixed(time.Second), ""},
		{"jitter 100", Policy{Min: 1, Max: 2, Jitter: 100}, ""},
		{"min above max", Policy{Min: 2 * time.Second, Max: time.Second}, "min 2s is greater than max 1s"},
		{"max zero", Policy{Min: 1, Max: 0, Jitter: 0.1}, "max 0s must be positive"},
		{"min zero", Policy{Min: 0, Max: time.Second}, "min 0s must be positive"},
		{"min zero with jitter only", Policy{Jitter: 0.1}, "min 0s must be positive"},
		{"negative min", Policy{Min: -1, Max: 1}, "min -1ns must be positive"},
		{"jitter too big", Policy{Min: 1, Max: 2, Jitter: 100.5}, "outside [0, 100]"},
		{"jitter negative", Policy{Min: 1, Max: 2, Jitter: -0.1}, "outside [0, 100]"},
		{"jitter inf", Policy{Min: 1, Max: 2, Jitter: math.Inf(1)}, "finite"},
		{"jitter nan", Policy{Min: 1, Max: 2, Jitter: math.NaN()}, "finite"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func mustFixed(d time.Duration) Policy {
	p, err := Fixed(d)
	if err != nil {
		panic(err)
	}
	return p
}

func TestFixed(t *testing.T) {
	p, err := Fixed(250 * ms)
	require.NoError(t, err)
	assert.Equal(t, Policy{Min: 250 * ms, Max: 250 * ms}, p)
	for _, d := range []time.Duration{0, -time.Second} {
		p, err := Fixed(d)
		assert.ErrorContains(t, err, "fixed delay "+d.String()+" must be positive")
		assert.Zero(t, p)
	}
}

func TestSequence(t *testing.T) {
	s := NewSequence(Policy{Min: 10 * ms, Max: time.Second})
	assert.Equal(t, []time.Duration{10 * ms, 20 * ms, 40 * ms}, []time.Duration{s.Next(), s.Next(), s.Next()})
	assert.Equal(t, 3, s.Attempt())
	s.Reset()
	assert.Equal(t, 10*ms, s.Next())
}

// flakyDial fails its first failures calls, then returns one end of a
// pipe whose other end sends a byte and closes; with silent, it closes
// without a byte, as a listener that accepts and closes at once.
type flakyDial struct {
	failures int
	silent   bool
	calls    atomic.Int32
	at       []time.Time
}

func (f *flakyDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n := int(f.calls.Add(1))
	f.at = append(f.at, time.Now())
	if n <= f.failures {
		return nil, errors.New("connection refused")
	}
	c1, c2 := net.Pipe()
	if f.silent {
		c2.Close()
	} else {
		go func() {
			_, _ = c2.Write([]byte{0})
			c2.Close()
		}()
	}
	return c1, nil
}

// readAll reads conn to its end.
func readAll(t *testing.T, conn net.Conn) {
	t.Helper()
	_, err := io.Copy(io.Discard, conn)
	require.NoError(t, err)
	conn.Close()
}

// The 2018 bug: after a failed dial the delay was set on a timer nobody
// waited on. A dial that fails twice and then succeeds must complete after
// exactly the two delays, with nothing else driving it.
func TestDialerFailsTwiceThenSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flakyDial{failures: 2}
		d := NewDialer(f.dial, Policy{Min: 5 * ms, Max: time.Second})
		start := time.Now()
		var conn net.Conn
		var err error
		for attempt := 0; attempt < 3; attempt++ {
			conn, err = d.DialContext(context.Background(), "tcp", "10.0.0.1:80")
			if err == nil {
				break
			}
		}
		require.NoError(t, err)
		assert.Equal(t, 2, d.Failures("tcp", "10.0.0.1:80"), "a connection the peer has not spoken on is no success yet")
		readAll(t, conn)
		assert.Equal(t, 15*ms, time.Since(start), "waited 5ms then 10ms")
		assert.Equal(t, int32(3), f.calls.Load())
		assert.Equal(t, []time.Time{start, start.Add(5 * ms), start.Add(15 * ms)}, f.at)
		assert.Equal(t, 0, d.Failures("tcp", "10.0.0.1:80"), "a success resets")
	})
}

func TestDialerNoTightLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flakyDial{failures: math.MaxInt}
		d := NewDialer(f.dial, Policy{Min: 100 * ms, Max: time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			_, _ = d.DialContext(ctx, "tcp", "10.0.0.1:80")
		}
		// Dials at 0, .1, .3, .7, 1.5, then every second: 2.5 ... 9.5.
		assert.Equal(t, int32(13), f.calls.Load())
	})
}

// An address that accepts connections and closes them without a byte (a
// load balancer without a healthy backend, a server shutting down) is held
// back as one that refuses them: the same dials in 10 s as
// TestDialerNoTightLoop, not a dial each time the last one closed.
func TestDialerAcceptedThenClosedIsAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flakyDial{silent: true}
		d := NewDialer(f.dial, Policy{Min: 100 * ms, Max: time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// The bound ends a tight loop, in which no time passes.
		for i := 0; ctx.Err() == nil && i < 100; i++ {
			if conn, err := d.DialContext(ctx, "tcp", "10.0.0.1:80"); err == nil {
				readAll(t, conn)
			}
		}
		assert.Equal(t, int32(13), f.calls.Load())
		assert.Equal(t, 13, d.Failures("tcp", "10.0.0.1:80"))
	})
}

func TestDialerOtherAddressNotHeldBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flakyDial{failures: 1}
		d := NewDialer(f.dial, mustFixed(time.Hour))
		_, err := d.DialContext(context.Background(), "tcp", "10.0.0.1:80")
		require.Error(t, err)
		start := time.Now()
		conn, err := d.DialContext(context.Background(), "tcp", "10.0.0.2:80")
		require.NoError(t, err)
		conn.Close()
		assert.Zero(t, time.Since(start))
	})
}

func TestDialerCancelEndsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flakyDial{failures: 1}
		d := NewDialer(f.dial, mustFixed(time.Hour))
		_, err := d.DialContext(context.Background(), "tcp", "10.0.0.1:80")
		require.Error(t, err)

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := d.DialContext(ctx, "tcp", "10.0.0.1:80")
			done <- err
		}()
		synctest.Wait()
		cancel()
		err = <-done
		assert.ErrorIs(t, err, context.Canceled)
		assert.Zero(t, time.Since(start), "the wait ended at once")
		assert.Equal(t, int32(1), f.calls.Load(), "no dial after cancel")
	})
}

func TestRetry(t *testing.T) {
	t.Run("waits between failures and resets after progress", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := Policy{Min: 10 * ms, Max: time.Second}
			var at []time.Duration
			start := time.Now()
			errs := []error{
				errors.New("a"), errors.New("b"), // waits 10, 20
				fmt.Errorf("%w: stream broke", ErrResetBackoff), // waits 10
				errors.New("c"), // waits 20
				nil,
			}
			err := Retry(context.Background(), p, func(context.Context) error {
				at = append(at, time.Since(start))
				e := errs[0]
				errs = errs[1:]
				return e
			}, nil)
			require.NoError(t, err)
			assert.Equal(t, []time.Duration{0, 10 * ms, 30 * ms, 40 * ms, 60 * ms}, at)
		})
	})
	t.Run("permanent stops", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			stop := errors.New("rejected")
			calls := 0
			err := Retry(context.Background(), mustFixed(ms), func(context.Context) error {
				calls++
				if calls == 3 {
					return Permanent(stop)
				}
				return errors.New("again")
			}, nil)
			assert.Same(t, stop, err)
			assert.Equal(t, 3, calls)
		})
	})
	t.Run("cancel ends the wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			var retries atomic.Int32
			go func() {
				done <- Retry(ctx, mustFixed(time.Hour), func(context.Context) error { return errors.New("down") },
					func(error, time.Duration) { retries.Add(1) })
			}()
			synctest.Wait()
			cancel()
			assert.ErrorIs(t, <-done, context.Canceled)
			assert.Equal(t, int32(1), retries.Load())
		})
	})
}

func TestFromEnv(t *testing.T) {
	const p = "INMESH_TEST"
	def := Policy{Min: time.Second, Max: 2 * time.Second}
	tests := []struct {
		name    string
		env     map[string]string
		want    Policy
		wantErr string
	}{
		{"none is default", nil, def, ""},
		{"fixed", map[string]string{p + "_BACKOFF_DELAY": "100ms"}, mustFixed(100 * ms), ""},
		{"all three", map[string]string{p + "_EXP_BACKOFF_MIN": "10ms", p + "_EXP_BACKOFF_MAX": "1s", p + "_EXP_BACKOFF_JITTER": "0.2"}, Policy{10 * ms, time.Second, 0.2}, ""},
		{"min and max", map[string]string{p + "_EXP_BACKOFF_MIN": "10ms", p + "_EXP_BACKOFF_MAX": "1s"}, Policy{10 * ms, time.Second, 0}, ""},
		{"only min", map[string]string{p + "_EXP_BACKOFF_MIN": "10ms"}, Policy{}, p + "_EXP_BACKOFF_MAX is required"},
		{"only jitter", map[string]string{p + "_EXP_BACKOFF_JITTER": "0.1"}, Policy{}, p + "_EXP_BACKOFF_MIN is required"},
		{"max and jitter", map[string]string{p + "_EXP_BACKOFF_MAX": "1s", p + "_EXP_BACKOFF_JITTER": "0.1"}, Policy{}, p + "_EXP_BACKOFF_MIN is required"},
		{"bad duration", map[string]string{p + "_BACKOFF_DELAY": "5"}, Policy{}, p + `_BACKOFF_DELAY="5" is not a duration`},
		{"zero fixed", map[string]string{p + "_BACKOFF_DELAY": "0s"}, Policy{}, p + "_BACKOFF_DELAY must be positive"},
		{"negative", map[string]string{p + "_EXP_BACKOFF_MIN": "-1s", p + "_EXP_BACKOFF_MAX": "1s"}, Policy{}, p + `_EXP_BACKOFF_MIN="-1s" is negative`},
		{"zero max", map[string]string{p + "_EXP_BACKOFF_MIN": "1s", p + "_EXP_BACKOFF_MAX": "0s"}, Policy{}, p + "_EXP_BACKOFF_MAX must be positive"},
		{"zero min", map[string]string{p + "_EXP_BACKOFF_MIN": "0s", p + "_EXP_BACKOFF_MAX": "1s"}, Policy{}, p + "_EXP_BACKOFF_MIN must be positive"},
		{"zero min and max", map[string]string{p + "_EXP_BACKOFF_MIN": "0s", p + "_EXP_BACKOFF_MAX": "0s", p + "_EXP_BACKOFF_JITTER": "0.1"}, Policy{}, p + "_EXP_BACKOFF_MIN must be positive"},
		{"min above max", map[string]string{p + "_EXP_BACKOFF_MIN": "2s", p + "_EXP_BACKOFF_MAX": "1s"}, Policy{}, p + "_EXP_BACKOFF_MIN (2s) is greater than " + p + "_EXP_BACKOFF_MAX (1s)"},
		{"bad jitter", map[string]string{p + "_EXP_BACKOFF_MIN": "1s", p + "_EXP_BACKOFF_MAX": "2s", p + "_EXP_BACKOFF_JITTER": "lots"}, Policy{}, p + `_EXP_BACKOFF_JITTER="lots" is not a number`},
		{"jitter out of range", map[string]string{p + "_EXP_BACKOFF_MIN": "1s", p + "_EXP_BACKOFF_MAX": "2s", p + "_EXP_BACKOFF_JITTER": "101"}, Policy{}, p + "_EXP_BACKOFF_JITTER: backoff: jitter 101 is outside"},
		{"fixed and exp", map[string]string{p + "_BACKOFF_DELAY": "1s", p + "_EXP_BACKOFF_MIN": "1s"}, Policy{}, p + "_BACKOFF_DELAY cannot be combined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			got, err := FromEnv(p, def)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
