package router

import (
	"context"
	"github.com/inmesh/inmesh/internal/registry"
	"log/slog"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the outbound route metrics.
const ScopeName = "github.com/inmesh/inmesh/router"

// DefaultMaxAuthorities bounds the authorities whose policies a [Router]
// watches.
const DefaultMaxAuthorities = registry.DefaultMaxEntries

// Option configures a [Router].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	profiles       profiles.Source
	profileRouter  *profiles.Router
	profileOpts    []profiles.RouterOption
	policies       policy.Source
	mp             metric.MeterProvider
	logger         *slog.Logger
	maxAuthorities int
	idleTimeout    time.Duration
	defaultPort    string
	budget         *profiles.RetryBudget
	compile        policy.Options
	balancer       *balancer.Balancer
	discoveryWait  time.Duration
	// wait sleeps between retries; tests replace it.
	wait func(ctx context.Context, d time.Duration) bool
	// rand returns a number in [0, 1); tests replace it.
	rand func() float64
}

func newConfig(opts []Option) config {
	c := config{logger: slog.Default(), maxAuthorities: DefaultMaxAuthorities,
		idleTimeout: profiles.DefaultIdleTimeout, defaultPort: "80", wait: sleep}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// WithProfiles routes by the ServiceProfiles of src. A profile with routes
// or destination overrides takes precedence over the outbound policy of
// the same authority. The options configure the profile side (its route_*
// metrics take the router's meter provider unless they set another).
func WithProfiles(src profiles.Source, opts ...profiles.RouterOption) Option {
	return optionFunc(func(c *config) {
		if src != nil {
			c.profiles = src
			c.profileOpts = opts
		}
	})
}

// WithProfileRouter routes by the ServiceProfiles of an existing profile
// router (such as the one of a mesh client), which the Router then shares
// and does not close. It takes precedence over [WithProfiles].
func WithProfileRouter(pr *profiles.Router) Option {
	return optionFunc(func(c *config) {
		if pr != nil {
			c.profileRouter = pr
		}
	})
}

// WithPolicies routes by the outbound policies of src (the OutboundPolicies
// API, or [policy.NewStaticSource] without a control plane).
func WithPolicies(src policy.Source) Option {
	return optionFunc(func(c *config) {
		if src != nil {
			c.policies = src
		}
	})
}

// WithMeterProvider sets the meter provider of the route metrics; nil (the
// default) means the global one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.mp = mp
		}
	})
}

// WithLogger sets the logger for rejected policies (default
// slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithMaxAuthorities bounds the authorities whose policies are watched;
// past it, the least recently used one is released. n <= 0 changes
// nothing.
func WithMaxAuthorities(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxAuthorities = n
		}
	})
}

// WithIdleTimeout sets how long the router keeps the policy of an
// authority no request used (default profiles.DefaultIdleTimeout); then
// its watch stops, which frees room under the control-plane client's watch
// bound, and the next request watches it anew. d <= 0 changes nothing.
func WithIdleTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.idleTimeout = d
		}
	})
}

// WithDiscoveryWait lets a request wait up to d for its authority's first
// answers from the control plane (its ServiceProfile and its outbound
// policy, or the word that there is none) before it takes a route, so that
// the first request to an authority, and the first after it was released
// for idleness, is routed, timed out and retried by its route like any
// other. By default (d <= 0) discovery never blocks: such a request takes
// the default route at once. A request whose answers have not arrived
// within d takes the default route; one cancelled meanwhile returns its
// context's error. Answers already in cost nothing.
func WithDiscoveryWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.discoveryWait = d })
}

// WithRetryBudget adds a retry budget (ratio, minimum per second, TTL) to
// the counted retries of every policy route, beyond Linkerd (as Gateway
// API GEP-3388 proposes): a retry needs both the count and the budget. Each
// route has its own budget. A nil or invalid budget changes nothing.
func WithRetryBudget(b *profiles.RetryBudget) Option {
	return optionFunc(func(c *config) {
		if b != nil && b.Validate() == nil {
			cp := *b
			c.budget = &cp
		}
	})
}

// WithBalancer names the balancer under the router's transport (the one
// that resolves its balancer backends), so that a first-available
// distribution sends its requests to the first backend that is ready,
// passing over one whose endpoints are all out of rotation or failing fast
// ([balancer.Balancer.Ready]), and [Router.Explain] shows each backend's
// endpoints and their state. Without it, a first-available distribution
// always takes its first backend (a fail-fast answer is then retried when
// the route retries).
func WithBalancer(b *balancer.Balancer) Option {
	return optionFunc(func(c *config) { c.balancer = b })
}

// WithCompileOptions sets the limits policies are compiled under.
func WithCompileOptions(o policy.Options) Option {
	return optionFunc(func(c *config) { c.compile = o })
}
