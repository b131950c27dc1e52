package profileroute

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/internal/exchange"
	"github.com/inmesh/inmesh/internal/registry"
	"github.com/inmesh/inmesh/profiles"

	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the route metrics.
const ScopeName = "github.com/inmesh/inmesh/router"

// DefaultMaxAuthorities bounds the authorities a [Router] watches.
const DefaultMaxAuthorities = registry.DefaultMaxEntries

// DefaultIdleTimeout is how long a [Router] keeps an authority no request
// used: then its watch stops, freeing the control-plane client's cap.
const DefaultIdleTimeout = registry.DefaultIdle

// MaxRetryBodyBytes is the largest request body buffered for retries
// (64 KiB, as in Linkerd); a larger body is sent once.
const MaxRetryBodyBytes = exchange.MaxRetryBodyBytes

// RouterOption configures a [Router].
type RouterOption interface{ apply(*routerConfig) }

type routerOptionFunc func(*routerConfig)

func (f routerOptionFunc) apply(c *routerConfig) { f(c) }

type routerConfig struct {
	mp             metric.MeterProvider
	logger         *slog.Logger
	maxAuthorities int
	dstOverride    bool
	compile        profiles.Options
	defaultPort    string
	idleTimeout    time.Duration
	local          []string
	hedging        HedgerFunc
}

func newRouterConfig(opts []RouterOption) routerConfig {
	c := routerConfig{logger: slog.Default(), maxAuthorities: DefaultMaxAuthorities, defaultPort: "80",
		idleTimeout: DefaultIdleTimeout}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// WithMeterProvider sets the meter provider of the route metrics; nil (the
// default) means the global one, which records nothing until the
// application sets one.
func WithMeterProvider(mp metric.MeterProvider) RouterOption {
	return routerOptionFunc(func(c *routerConfig) {
		if mp != nil {
			c.mp = mp
		}
	})
}

// WithLogger sets the logger for rejected profiles (default slog.Default()).
func WithLogger(l *slog.Logger) RouterOption {
	return routerOptionFunc(func(c *routerConfig) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithMaxAuthorities bounds the authorities the router holds at once
// (default [DefaultMaxAuthorities]): past it, the least recently used is
// released and its watch stopped. It also bounds the dst label values over
// the router's life: further authorities without routes or traffic splits
// are labelled dst="other" ([OtherAuthority]). n <= 0 changes nothing.
func WithMaxAuthorities(n int) RouterOption {
	return routerOptionFunc(func(c *routerConfig) {
		if n > 0 {
			c.maxAuthorities = n
		}
	})
}

// WithDstOverrideHeader lets the l5d-dst-override request header name the
// authority to route by. Off by default: only trusted clients should be able
// to choose it.
func WithDstOverrideHeader(allow bool) RouterOption {
	return routerOptionFunc(func(c *routerConfig) { c.dstOverride = allow })
}

// WithCompileOptions sets the limits profiles are compiled under.
func WithCompileOptions(o profiles.Options) RouterOption {
	return routerOptionFunc(func(c *routerConfig) { c.compile = o })
}

// WithIdleTimeout sets how long an authority no request used is kept
// (default [DefaultIdleTimeout]); then it is released and its watch
// stopped. d <= 0 changes nothing.
func WithIdleTimeout(d time.Duration) RouterOption {
	return routerOptionFunc(func(c *routerConfig) {
		if d > 0 {
			c.idleTimeout = d
		}
	})
}

// WithLocalAuthorities names the server's own authorities (host:port, or a
// host on the default port), the only ones [Router.Handler] routes by
// profile; their profiles are watched from the start. Every other inbound
// request takes the default route with dst="other", and no client can make
// the router watch anything. Repeated options add up.
func WithLocalAuthorities(authorities ...string) RouterOption {
	return routerOptionFunc(func(c *routerConfig) { c.local = append(c.local, authorities...) })
}

// Hedger sends a request of a hedged route through base: the router's
// hedging, which profileroute does not implement itself.
type Hedger interface {
	RoundTrip(base http.RoundTripper, req *http.Request) (*http.Response, error)
}

// HedgerFunc returns the hedger of an outbound profile route hedged by p,
// whose route_* series have the labels opts and whose hedges the
// profile's retry budget bounds (nil: no budget).
type HedgerFunc func(p hedge.Policy, opts []metric.AddOption, budget *profiles.Budget) Hedger

// WithHedging lets the outbound profile routes that carry a hedge
// (profiles.Route.Hedge) hedge through the hedgers f returns; without it
// they do not hedge. A nil f changes nothing.
func WithHedging(f HedgerFunc) RouterOption {
	return routerOptionFunc(func(c *routerConfig) {
		if f != nil {
			c.hedging = f
		}
	})
}
