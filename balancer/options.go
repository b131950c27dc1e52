package balancer

import (
	"log/slog"
	"net/netip"
	"time"

	"github.com/inmesh/inmesh/internal/registry"

	"go.opentelemetry.io/otel/metric"
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
	DefaultMaxAuthorities = registry.DefaultMaxEntries
	// DefaultIdleTimeout is how long a Balancer keeps an authority no
	// request used before it releases it and stops its watches.
	DefaultIdleTimeout = registry.DefaultIdle
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
	idleTimeout    time.Duration
	splits         SplitSource
	logger         *slog.Logger
	accrual        *accrual
	outlier        *outlier
	queueCap       int
	failfast       time.Duration
	penaltyEWMA    *PenaltyPeakEWMA
	meter          metric.MeterProvider
	meshTLS        bool
	zone           zoneConf
	removed        []func(netip.AddrPort)
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
		idleTimeout:    DefaultIdleTimeout,
		logger:         slog.Default(),
		queueCap:       DefaultQueueCapacity,
		failfast:       DefaultFailfastTimeout,
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
// true). Without fallback it fails with 503. A watch the source refuses
// (its bound on watched authorities) never falls back: 503.
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
// (default [DefaultErrorPenalty]); d <= 0 changes nothing. A request its
// caller gives up before its response head is a sample of the time it
// waited, not a penalty.
func WithErrorPenalty(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.penalty = d
		}
	})
}

// WithMaxAuthorities bounds the authorities the Balancer keeps state and
// watches for (default [DefaultMaxAuthorities]). Past it, the least
// recently used authority is released (its watches stop) to make room for
// the new one. It also bounds, for the life of the Balancer, the distinct
// Services its metric families label; later ones are counted under
// parent_name "other" (no namespace). n <= 0 changes nothing.
func WithMaxAuthorities(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxAuthorities = n
		}
	})
}

// WithIdleTimeout sets how long the Balancer keeps an authority no request
// used (default [DefaultIdleTimeout]): then its endpoint and traffic-split
// watches stop, freeing the source's watch bound, and the next request
// for it watches anew. An authority with a request in flight (a long
// stream, its response body not yet ended) is in use, not idle. d <= 0
// changes nothing.
func WithIdleTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.idleTimeout = d
		}
	})
}

// WithSplits sets where the traffic split of each authority comes from,
// such as profiles.Splits over a source of ServiceProfiles: the dst
// overrides of each authority's profile (default: none, no split). A nil
// src, or one holding a nil pointer, changes nothing.
func WithSplits(src SplitSource) Option {
	return optionFunc(func(c *config) {
		if !isNil(src) {
			c.splits = src
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

// WithFailureAccrual takes failing endpoints out of rotation as fa says
// (default: none; see [FailureAccrual]). fa is copied; nil changes
// nothing.
func WithFailureAccrual(fa *FailureAccrual) Option {
	return optionFunc(func(c *config) {
		if a := newAccrual(fa); a != nil {
			c.accrual = a
		}
	})
}

// WithQueue sets the queue of each authority, as an OutboundPolicy's Queue
// carries it: while none of its endpoints is ready (all tripped), up to
// capacity requests (default [DefaultQueueCapacity]) wait
// at most failfast (default [DefaultFailfastTimeout]) for one, then fail
// with 504 and [ErrFailFast]; a request past the capacity fails at once
// with 503 and [ErrLoadShed]. A value <= 0 keeps its default.
//
// Once a request has failed fast the queue is in failfast, as in
// linkerd2-proxy: the requests then waiting fail fast too, and later ones
// fail at once with [ErrLoadShed] until a request finds an endpoint in
// rotation again.
//
// An authority whose set is empty has no endpoint ready either: its
// requests wait in the queue for endpoints the same way, as do those of
// one the source says does not exist when [WithFallback] is off.
func WithQueue(capacity int, failfast time.Duration) Option {
	return optionFunc(func(c *config) {
		if capacity > 0 {
			c.queueCap = capacity
		}
		if failfast > 0 {
			c.failfast = failfast
		}
	})
}

// PenaltyPeakEWMA is the OutboundPolicy's penalty_peak_ewma load: peak
// EWMA (DefaultRTT, Decay, as [WithPeakEWMA]) where a response that signals
// overload counts as an RTT sample of Penalty (0: [DefaultLoadPenalty]),
// or of the endpoint's current estimate if that is higher, in place of the
// time it took, as Linkerd's load biaser records it: the penalty becomes
// the estimate's new peak, fades with Decay like any peak, and the
// endpoint's faster answers afterwards pull it down as they pull down any
// slow sample.
// The [Balancer] reads the response head, as Linkerd's load biaser does:
// an HTTP 429, 503 or other 5xx, or a gRPC answer (HTTP 200, content-type
// application/grpc...) whose head holds a grpc-status of
// RESOURCE_EXHAUSTED, UNAVAILABLE, UNKNOWN, DEADLINE_EXCEEDED, INTERNAL or
// DATA_LOSS (a Trailers-Only answer). A status in the trailers after a
// message, any other code, and a grpc-status on a response that is not
// gRPC's set none. A penalized response no longer counts as in flight once
// its head has come. A Retry-After (on 429 and 503, seconds or an
// HTTP-date) or the grpc-retry-pushback-ms of a RESOURCE_EXHAUSTED or
// UNAVAILABLE raises that penalty to the hint, at most MaxRetryAfter (0:
// [DefaultMaxRetryAfter]); a hint shorter than Penalty counts as Penalty,
// and the other failures take Penalty whatever their hints. As in
// linkerd2-proxy's load biaser, the hint does not
// bound the penalty and takes nobody out of rotation: the endpoint gets
// requests again once its decaying load is below its peers' (a 5 s penalty
// against a peer answering in a millisecond: about 85 s at a 10 s decay,
// sooner if it answers some requests fast meanwhile), and when every
// endpoint is penalized the least penalized one is picked. Penalties do
// not add up; a larger estimate in force is kept.
type PenaltyPeakEWMA struct {
	DefaultRTT    time.Duration
	Decay         time.Duration
	Penalty       time.Duration
	MaxRetryAfter time.Duration
	// PenaltyDecay is ignored: a penalty is part of the RTT estimate and
	// fades with Decay, as Linkerd's proxy ignores the policy's
	// penalty_decay (linkerd/proxy/balance/src/lib.rs,
	// penalty_biaser_config).
	//
	// Deprecated: it has no effect; a penalty decays with Decay.
	PenaltyDecay time.Duration
}

// WithPenaltyPeakEWMA sets peak EWMA with load penalties (default: plain
// peak EWMA, no penalties). p is copied; nil changes nothing.
func WithPenaltyPeakEWMA(p *PenaltyPeakEWMA) Option {
	return optionFunc(func(c *config) {
		if p == nil {
			return
		}
		q := *p
		if q.DefaultRTT > 0 {
			c.defaultRTT = q.DefaultRTT
		}
		if q.Decay > 0 {
			c.decay = q.Decay
		}
		if q.Penalty <= 0 {
			q.Penalty = DefaultLoadPenalty
		}
		if q.MaxRetryAfter <= 0 {
			q.MaxRetryAfter = DefaultMaxRetryAfter
		}
		c.penaltyEWMA = &q
	})
}

// WithMeshTLS says whether the stack has an identity of its own, so that
// an endpoint with an identity is reached over mTLS: it decides the tls
// metric labels of the requests (default false: tls="disabled").
func WithMeshTLS(on bool) Option { return optionFunc(func(c *config) { c.meshTLS = on }) }

// WithMeterProvider sets where the outbound_http_balancer_* families go
// (default: the global provider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.meter = mp
		}
	})
}

// WithEndpointRemoved calls f with the address of an endpoint the Balancer
// is done with: no endpoint set of its authorities holds it any more
// (several can share an address; a released authority holds none), and no
// request it sent there is in flight, response body included. The
// connections to it then carry nothing and can be closed, as the mesh
// package's client does. f runs one call at a time, under a lock that a
// request to a removed address takes: it must not block or call the
// Balancer. Each option adds a function; nil adds none.
func WithEndpointRemoved(f func(addr netip.AddrPort)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.removed = append(c.removed, f)
		}
	})
}
