package destination

import (
	"log/slog"
	"net/netip"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/internal/cpaddr"
	"github.com/inmesh/inmesh/internal/registry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Defaults of the [Client].
const (
	DefaultMaxWatches          = registry.DefaultMaxEntries
	DefaultIdleTimeout         = 30 * time.Second
	DefaultFirstMessageTimeout = 5 * time.Second
	// DefaultKeepalive is how long a connection to the control plane
	// may stay silent before the client pings it, and
	// DefaultKeepaliveTimeout how long it then waits for the answer
	// before it drops the connection and moves to another replica. Five
	// minutes is the most often a gRPC-Go server (Linkerd's Destination
	// and Identity controllers) lets a client ping by default; more often
	// and it closes the connection. inmesh's control plane
	// ([controlplane.KeepaliveOptions]) lets clients ping every 10 s.
	DefaultKeepalive        = cpaddr.DefaultPing
	DefaultKeepaliveTimeout = cpaddr.DefaultPingTimeout
)

// Option configures a [Client]. Options given nil values change nothing.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	scheme, contextToken string
	workload             string
	policy               backoff.Policy
	maxWatches           int
	idleTimeout          time.Duration
	firstMessageTimeout  time.Duration
	logger               *slog.Logger
	logInterval          time.Duration
	dial                 backoff.DialFunc
	dialOptions          []grpc.DialOption
	suffixes             []string
	networks             []netip.Prefix
	linkerdStreams       bool
	keepalive            keepalive.ClientParameters
	// reach is where Dial's dialer records its failures, for the Client
	// it makes.
	reach *reach
}

// watchCap is the number of watches of one kind the client holds at most:
// the authority bound and its headroom (see [WithMaxWatches]).
func (c *config) watchCap() int { return c.maxWatches + c.maxWatches/16 }

func newConfig(opts []Option) config {
	c := config{
		maxWatches:          DefaultMaxWatches,
		idleTimeout:         DefaultIdleTimeout,
		firstMessageTimeout: DefaultFirstMessageTimeout,
		logger:              slog.Default(),
		keepalive:           keepalive.ClientParameters{Time: DefaultKeepalive, Timeout: DefaultKeepaliveTimeout},
	}
	WithSearchSuffixes(DefaultSearchSuffixes()...).apply(&c)
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// WithScheme sets GetDestination.scheme on every lookup (empty by default,
// as modern Linkerd proxies send; 2018 proxies sent "k8s").
func WithScheme(scheme string) Option { return optionFunc(func(c *config) { c.scheme = scheme }) }

// WithContextToken sets GetDestination.context_token, the opaque token that
// tells a Linkerd control plane who is asking (its proxy injector sets
// LINKERD2_PROXY_DESTINATION_CONTEXT to it).
func WithContextToken(token string) Option {
	return optionFunc(func(c *config) { c.contextToken = token })
}

// WithBackoff sets the delays between attempts to re-establish a stream (and,
// with [Dial], between failed connection attempts). The zero Policy is
// [backoff.DefaultPolicy]. [Dial] refuses a policy that does not validate; a
// [Client] made with [NewClient] clamps it (see [backoff.Policy.Delay]).
func WithBackoff(p backoff.Policy) Option { return optionFunc(func(c *config) { c.policy = p }) }

// WithMaxWatches bounds the number of authorities watched at once, for
// each kind of watch (profiles, endpoints, policies; default
// [DefaultMaxWatches]): n, the authority bound of the stacks it serves,
// plus n/16 of headroom. The layers of one stack (the router and the
// balancer) each keep up to n authorities in tables of their own and
// replace them at slightly different moments; without the headroom, a
// churn of new names past a full table found the bound taken by the name
// one layer was replacing while another still held it. The headroom
// covers about n/16 new names in flight at once (none below n = 16); a
// churn with more can still be refused a few watches. Past n + n/16 (an
// idle watch is dropped first to make room) a watch fails with
// [profiles.ErrTooManyWatches]. n <= 0 changes nothing.
func WithMaxWatches(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxWatches = n
		}
	})
}

// WithIdleTimeout sets how long a stream is kept after its last watcher
// stopped, so that a watcher coming back soon finds its state (default
// [DefaultIdleTimeout]; 0 closes it at once). d < 0 changes nothing.
func WithIdleTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d >= 0 {
			c.idleTimeout = d
		}
	})
}

// WithFirstMessageTimeout sets how long a new stream may stay silent before
// its silence means something (default [DefaultFirstMessageTimeout]): a
// silent GetProfile or OutboundPolicies stream counts as failed and is
// re-established, the last profile or policy in force meanwhile; a silent
// Get stream is kept open and, for an authority never answered before,
// means "exists, no endpoints yet" (after a reconnect the last endpoints
// stay in force). d <= 0 changes nothing.
func WithFirstMessageTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.firstMessageTimeout = d
		}
	})
}

// WithKeepalive sets how long a connection [Dial] made may stay silent
// before the client pings the control plane (default [DefaultKeepalive];
// gRPC raises anything under 10 s to 10 s), and how long it waits for the
// answer (default [DefaultKeepaliveTimeout]). A replica that went away
// without closing the connection (its host lost, a partition, a frozen
// process) is left within about d+timeout, for the next live one; until
// then what the watches last received stays in force. Ping more often than
// every five minutes only a control plane that allows it, such as inmesh's
// ([controlplane.KeepaliveOptions]): a gRPC-Go server with default settings
// closes the connection of a client that pings more often. d <= 0 turns
// the pings off; timeout <= 0 keeps the default.
func WithKeepalive(d, timeout time.Duration) Option {
	return optionFunc(func(c *config) {
		c.keepalive.Time = d
		if d <= 0 {
			c.keepalive.Time = cpaddr.NoPing
		}
		if timeout > 0 {
			c.keepalive.Timeout = timeout
		}
	})
}

// WithLogger sets the logger of a [Client] (default slog.Default()), for
// stream failures and rejected updates, each kind of line at most once per
// [WithLogInterval].
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithLogInterval sets how often each kind of line that a stream or an
// update can trigger is written at most, with the number of lines suppressed
// meanwhile attached to the next (default 10s). d <= 0
// changes nothing.
func WithLogInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.logInterval = d
		}
	})
}

// WithDialFunc sets how [Dial] makes TCP connections, before the backoff
// between failed attempts is applied (default: a net.Dialer).
func WithDialFunc(dial backoff.DialFunc) Option {
	return optionFunc(func(c *config) {
		if dial != nil {
			c.dial = dial
		}
	})
}

// WithDialOptions adds gRPC dial options for [Dial], such as transport
// credentials (the default is plaintext).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return optionFunc(func(c *config) { c.dialOptions = append(c.dialOptions, opts...) })
}

// WithWorkload names the workload this client asks for: the pod whose
// ports' Servers the InboundServerPolicies watches return
// (PortSpec.workload), and the source of every OutboundPolicies watch
// (TrafficSpec.source_workload). It takes either form Linkerd's proxy
// sends, which Linkerd's policy controller and inmesh's embedded control
// plane accept, and sends it as given:
//
//   - "NS:POD", such as "default:books-0";
//   - JSON naming the namespace and a pod or an external workload, such as
//     {"ns":"default","pod":"books-0"} ([PolicyWorkload] makes it) or
//     {"ns":"default","external_workload":"vm-0"}.
//
// [Dial] refuses anything else (no colon, an empty side, other JSON keys)
// with an error that shows the expected form ([ParseWorkload]), rather
// than watches the control plane would refuse. An empty workload means the
// default: $LINKERD2_PROXY_POLICY_WORKLOAD (the proxy injector sets it, in
// the JSON form), else the pod named by the host name in the namespace
// "default".
func WithWorkload(workload string) Option {
	return optionFunc(func(c *config) { c.workload = workload })
}

// WithLinkerdStreams makes the client watch each target with Linkerd's
// per-name streams (Destination.GetProfile, Destination.Get,
// OutboundPolicies.Watch) even when the control plane serves inmesh's
// Watches service, which otherwise carries every profile, endpoint and
// policy watch of the client over one stream (see [Client]).
func WithLinkerdStreams() Option {
	return optionFunc(func(c *config) { c.linkerdStreams = true })
}
