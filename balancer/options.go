package balancer

import (
	"log/slog"
	"time"

	"github.com/inmesh/inmesh/profiles"
)

// Defaults of the [Balancer].
const (
	// DefaultResolveTimeout bounds the wait for the first answer about an
	// authority.
	DefaultResolveTimeout = time.Second
	// DefaultRTT is the RTT estimate of a new endpoint (Linkerd's
	// default_rtt).
	DefaultRTT = 30 * time.Millisecond
	// DefaultDecay is the time constant of the RTT average (Linkerd's
	// decay).
	DefaultDecay = 10 * time.Second
	// DefaultErrorPenalty is the RTT sample a request that failed without a
	// response counts as.
	DefaultErrorPenalty = 5 * time.Second
	// DefaultMaxAuthorities bounds the authorities a Balancer keeps state
	// for.
	DefaultMaxAuthorities = 10000
)

// Option configures a [Balancer]. A nil Option changes nothing.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	resolveTimeout time.Duration
	fallback       bool
	defaultRTT     time.Duration
	decay          time.Duration
	penalty        time.Duration
	maxAuthorities int
	profiles       profiles.Source
	logger         *slog.Logger
	// now is the clock of the load estimates: a monotonic reading in
	// nanoseconds. Tests replace it.
	now func() int64
}

func newConfig(opts []Option) config {
	c := config{
		resolveTimeout: DefaultResolveTimeout,
		fallback:       true,
		defaultRTT:     DefaultRTT,
		decay:          DefaultDecay,
		penalty:        DefaultErrorPenalty,
		maxAuthorities: DefaultMaxAuthorities,
		logger:         slog.Default(),
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.now == nil {
		start := time.Now()
		c.now = func() int64 { return int64(time.Since(start)) + 1 }
	}
	return c
}

// WithResolveTimeout bounds how long a request waits for the first answer
// about its authority (default [DefaultResolveTimeout]) before it fails
// with 503; d <= 0 changes nothing.
func WithResolveTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.resolveTimeout = d
		}
	})
}

// WithFallback sets whether a request for a service the source says does
// not exist (or cannot resolve) goes to its own address, unchanged (default
// true). Without fallback it fails with 503.
func WithFallback(on bool) Option { return optionFunc(func(c *config) { c.fallback = on }) }

// WithPeakEWMA sets the RTT estimate of a new endpoint (default
// [DefaultRTT]) and the time constant of the average (default
// [DefaultDecay]), as an OutboundPolicy's PeakEwma carries them. A value
// <= 0 keeps its default.
func WithPeakEWMA(defaultRTT, decay time.Duration) Option {
	return optionFunc(func(c *config) {
		if defaultRTT > 0 {
			c.defaultRTT = defaultRTT
		}
		if decay > 0 {
			c.decay = decay
		}
	})
}

// WithErrorPenalty sets the RTT sample that a request failing without a
// response (connection refused, reset, a transport error) counts as
// (default [DefaultErrorPenalty]); d <= 0 changes nothing. A caller
// cancelling its own request is no sample at all.
func WithErrorPenalty(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.penalty = d
		}
	})
}

// WithMaxAuthorities bounds the authorities the Balancer keeps state and
// watches for (default [DefaultMaxAuthorities]). Past it, requests for new
// authorities are treated as unresolvable: they fall back to their own
// address, or fail with 503 without fallback. n <= 0 changes nothing.
func WithMaxAuthorities(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxAuthorities = n
		}
	})
}

// WithProfiles sets where the traffic split of each authority comes from:
// the dst overrides of its profile (default: none, no split).
func WithProfiles(src profiles.Source) Option {
	return optionFunc(func(c *config) {
		if src != nil {
			c.profiles = src
		}
	})
}

// WithLogger sets the logger (default slog.Default()). Lines that requests
// or updates trigger are rate-limited.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}
