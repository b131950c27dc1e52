package router

import (
	"context"
	"log/slog"
	"time"

	"github.com/inmesh/inmesh/internal/registry"
	"github.com/inmesh/inmesh/router/internal/profileroute"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the route metrics.
const ScopeName = "github.com/inmesh/inmesh/router"

// DefaultMaxAuthorities bounds the authorities whose profiles and policies
// a [Router] watches.
const DefaultMaxAuthorities = registry.DefaultMaxEntries

// DefaultIdleTimeout is how long a [Router] keeps an authority no request
// used: then its watches stop, freeing the control-plane client's cap.
const DefaultIdleTimeout = profileroute.DefaultIdleTimeout

// MaxRetryBodyBytes is the largest request body a ServiceProfile route
// buffers for retries (64 KiB, as in Linkerd); a larger body is sent once.
const MaxRetryBodyBytes = profileroute.MaxRetryBodyBytes

// OtherAuthority is the dst label value of route_* metrics of requests
// whose authority has no label of its own: past the label bound, not a
// valid authority, or, on the inbound side, not one of the server's own
// authorities.
const OtherAuthority = profileroute.OtherAuthority

// Option configures a [Router].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	profiles       profiles.Source
	profileCompile profiles.Options
	dstOverride    bool
	local          []string
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
	hedge          *hedge.Policy // hedging of routes that set none
	mirror         MirrorLimits
	tp             trace.TracerProvider
	prop           propagation.TextMapPropagator
	// wait sleeps between retries; tests replace it.
	wait func(ctx context.Context, d time.Duration) bool
	// rand returns a number in [0, 1); tests replace it.
	rand func() float64
}

func newConfig(opts []Option) config {
	c := config{logger: slog.Default(), maxAuthorities: DefaultMaxAuthorities,
		idleTimeout: DefaultIdleTimeout, defaultPort: "80", wait: sleep}
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

// WithProfiles routes by the ServiceProfiles of src (the destination
// client, a [profiles.StaticSource], or a [manifest.ProfileSource] of
// ServiceProfile files). On the outbound side a profile with routes or
// destination overrides takes precedence over the outbound policy of the
// same authority; the inbound side ([Router.Handler]) routes by profile
// alone. Profile routes record the route_* metric families.
func WithProfiles(src profiles.Source) Option {
	return optionFunc(func(c *config) {
		if src != nil {
			c.profiles = src
		}
	})
}

// WithProfileCompileOptions sets the limits ServiceProfiles are compiled
// under (see [profiles.Options]).
func WithProfileCompileOptions(o profiles.Options) Option {
	return optionFunc(func(c *config) { c.profileCompile = o })
}

// WithDstOverrideHeader lets the l5d-dst-override request header name the
// authority whose ServiceProfile routes the request. Off by default: only
// trusted clients should be able to choose it. Outbound policies are
// looked up by the request's own authority either way.
func WithDstOverrideHeader(allow bool) Option {
	return optionFunc(func(c *config) { c.dstOverride = allow })
}

// WithLocalAuthorities names the server's own authorities (host:port, or a
// host on the default port), the only ones [Router.Handler] routes by
// profile; their profiles are watched from the start. Every other inbound
// request takes the default route with dst="other" ([OtherAuthority]), and
// no client can make the router watch anything. Repeated options add up.
func WithLocalAuthorities(authorities ...string) Option {
	return optionFunc(func(c *config) { c.local = append(c.local, authorities...) })
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

// WithMeterProvider sets the meter provider of the route metrics (route_*
// for profiles, outbound_{http,grpc}_route_* for policies); nil (the
// default) means the global one, which records nothing until the
// application sets one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.mp = mp
		}
	})
}

// WithLogger sets the logger for rejected profiles and policies (default
// slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithMaxAuthorities bounds the authorities whose profiles and policies
// the router holds at once (default [DefaultMaxAuthorities]); past it, the
// least recently used one is released and its watches stopped. It also
// bounds the dst label values of the route_* metrics over the router's
// life: further authorities without profile routes or traffic splits are
// labelled dst="other" ([OtherAuthority]). n <= 0 changes nothing.
func WithMaxAuthorities(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxAuthorities = n
		}
	})
}

// WithIdleTimeout sets how long the router keeps the profile and policy
// of an authority no request used (default [DefaultIdleTimeout]); then
// its watches stop, which frees room under the control-plane client's watch
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
// within d takes the default route, and so do the requests to its
// authority after it, without a wait, until the answers come: a source
// that does not answer costs d once per authority. A request cancelled
// meanwhile returns its context's error. Answers already in cost nothing;
// a source that says no answer can come (destination.Client: a control
// plane without the API, or one that cannot be reached) ends the wait at
// once.
func WithDiscoveryWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.discoveryWait = d })
}

// WithRetryBudget adds a retry budget (ratio, minimum per second, TTL) to
// the counted retries of every policy route, beyond Linkerd (as Gateway
// API GEP-3388 proposes): a retry needs both the count and the budget. Each
// route has its own budget, which its answers earn as a ServiceProfile's
// budget is earned: an answer not retried deposits, a failure the budget
// refuses or a request given up before its answer deposits nothing. A nil
// or invalid budget changes nothing.
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
