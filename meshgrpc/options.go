package meshgrpc

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/identity"
)

// An Option configures [DialOptions] or [ServerOptions]; each option applies
// to both, and an option that means nothing to one side is ignored there.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	identity *identity.Local
	mp       metric.MeterProvider
	logger   *slog.Logger
	inbound  []authz.Option
	balancer []balancer.Option
	// discoveryWait is WithDiscoveryWait's bound: 0 for the default,
	// negative for no wait.
	discoveryWait time.Duration
	tp            trace.TracerProvider
	prop          propagation.TextMapPropagator
}

func newConfig(opts []Option) *config {
	c := &config{}
	for _, o := range opts {
		o.apply(c)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return c
}

// WithIdentity sets the local identity: a client presents its certificate
// and verifies each endpoint's identity from discovery (a connection
// waits for the first certificate, within grpc-go's connect deadline); a
// server terminates mTLS with it. Without it, connections are plaintext.
func WithIdentity(local *identity.Local) Option {
	return optionFunc(func(c *config) { c.identity = local })
}

// WithMeterProvider sets where the metrics go (default: the global provider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// WithInboundPolicy makes a server enforce an inbound policy: the options
// of package authz, such as authz.WithSource (where the port's Server comes
// from) and authz.WithTarget (the port). A port's watch starts with the
// server's first connection on it (authz.WithPorts starts it with
// ServerOptions), and a call to a port whose first answer is pending
// waits for it, up to authz.WithPolicyWait's bound: a fresh server never
// lets through a call its policy refuses. A client ignores it.
func WithInboundPolicy(opts ...authz.Option) Option {
	return optionFunc(func(c *config) { c.inbound = append(c.inbound, opts...) })
}

// WithBalancerOptions sets the client's balancing defaults with the
// options of package balancer that apply to one endpoint set
// (balancer.WithPeakEWMA, WithErrorPenalty, WithFailureAccrual,
// WithPenaltyPeakEWMA); a policy backend's failure accrual and load
// penalties override them. A server ignores it.
func WithBalancerOptions(opts ...balancer.Option) Option {
	return optionFunc(func(c *config) { c.balancer = append(c.balancer, opts...) })
}

// DefaultDiscoveryWait is how long, by default, a call on a channel whose
// target has not answered yet waits for its first answers (see
// [WithDiscoveryWait]): the destination client's own first-message
// deadline, past which a silent stream means something.
const DefaultDiscoveryWait = destination.DefaultFirstMessageTimeout

// WithDiscoveryWait bounds how long a client's call waits for its target's
// first answers from the control plane, its outbound policy and its
// ServiceProfile (or the word that there is none), before it takes a
// route: the first call on a new channel, and the first after an idle
// channel started its watches again, is then routed (timeout, retries,
// route series) like every later one. The wait ends for every call of
// the target at the first answers, or once d has passed since the
// channel started its watches (a control plane the client cannot reach
// answers nothing: the target's endpoints come from it too, so a call
// waits for its route as for them); calls after that take the routes known,
// none meaning the target as it is. d == 0 means [DefaultDiscoveryWait];
// d < 0 never waits (a call that comes before the answers goes to the
// target as it is). Answers already in cost nothing. A target whose
// endpoints have not answered once d has passed ([DefaultDiscoveryWait]
// when d < 0), its control plane unreachable or silent, fails its
// fail-fast calls with UNAVAILABLE until they do; wait-for-ready calls
// wait on. A server ignores it.
func WithDiscoveryWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.discoveryWait = d })
}
