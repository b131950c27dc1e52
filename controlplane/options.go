package controlplane

import (
	"log/slog"
	"time"
)

// Option configures a [Server] ([NewServer]) and the file watchers that
// feed its [Store] ([WatchFiles], [WatchManifestFiles]). Options given nil
// or out-of-range values change nothing. The [Issuer] has its own
// [IssuerOption]s, and package destination's client its own options, so
// that an option passed to a constructor that does not take it fails to
// compile.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	logger      *slog.Logger
	logInterval time.Duration
	reg         registrationConfig // registration.go
	// maxSubscriptions bounds the subscriptions of a Watches stream
	// (watches.go).
	maxSubscriptions int
	// The bounds per peer (peers.go).
	maxStreamsPerPeer, maxWatchesPerPeer, maxSubscriptionsPerPeer int
	// noHealth: Register leaves gRPC's health service to the program
	// (WithoutHealthService).
	noHealth bool
}

func newConfig(opts []Option) config {
	c := config{logger: slog.Default(), maxSubscriptions: DefaultMaxSubscriptions,
		maxStreamsPerPeer: DefaultMaxStreamsPerPeer, maxWatchesPerPeer: DefaultMaxWatchesStreamsPerPeer,
		maxSubscriptionsPerPeer: DefaultMaxSubscriptionsPerPeer}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// WithLogger sets the logger (default slog.Default()) of a [Server] and of
// [WatchFiles] and [WatchManifestFiles], which log rejected and reloaded
// files.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithLogInterval sets how often the file watchers write each kind of line
// at most, with the number of lines suppressed meanwhile attached to the
// next (default 10s). d <= 0 changes nothing.
func WithLogInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.logInterval = d
		}
	})
}

// WithoutHealthService makes [Server.Register] leave out gRPC's health
// service (grpc.health.v1.Health), for a program that registers its own
// on the same gRPC server after Register (grpc-go ends the process, with
// a fatal log, on a service registered twice). The
// Server's [Health] then reaches clients and the other replicas only if
// that service answers "" and [CurrentHealthService] from
// [Server.HealthServer]. It concerns a [Server] only.
func WithoutHealthService() Option {
	return optionFunc(func(c *config) { c.noHealth = true })
}
