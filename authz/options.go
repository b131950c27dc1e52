package authz

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// Option configures a [Handler].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	source   Source
	def      *Server
	mp       metric.MeterProvider
	logger   *slog.Logger
	now      func() time.Time
	maxPorts int
}

// WithSource sets where the Servers of the ports come from; nil (the
// default) means none: every port keeps the default Server.
func WithSource(s Source) Option {
	return optionFunc(func(c *config) {
		if s != nil {
			c.source = s
		}
	})
}

// WithDefault sets the Server of a port before its Source delivers one;
// nil (the default) means [DefaultServer] of [AllUnauthenticated], as
// Linkerd's default.
func WithDefault(s *Server) Option {
	return optionFunc(func(c *config) {
		if s != nil {
			c.def = s
		}
	})
}

// WithMeterProvider sets the meter provider of the metrics; nil (the
// default) means the global one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithLogger sets the logger of denials, audited requests and refused
// updates, written at most once per reason per interval; nil (the default)
// means slog.Default().
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}
