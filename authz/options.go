package authz

import (
	"github.com/inmesh/inmesh/classify"
	"log/slog"
	"net/http"
	"net/netip"
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
	target   netip.AddrPort
	// wait bounds how long a request waits for its port's first answer
	// (WithPolicyWait); 0 means not at all.
	wait time.Duration
	// ports are watched from New (WithPorts).
	ports []uint16
	// noLocalhost drops the localhost authorization.
	noLocalhost bool
	// metricLabels passes an allowed request's labels on (WithMetricLabels).
	metricLabels bool
	// meshTLS: a request without a peer came in plaintext (WithMeshTLS).
	meshTLS bool
	// nextFor makes the next handler of an allowed request's labels
	// (WithLabelledNext).
	nextFor func(*classify.Labels) http.Handler
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

// WithDefault sets the Server of a port whose Source has none for it, or
// has not answered within the wait ([WithPolicyWait]); nil (the default)
// means [DefaultServer] of [AllUnauthenticated], as Linkerd's default.
func WithDefault(s *Server) Option {
	return optionFunc(func(c *config) {
		if s != nil {
			c.def = s
		}
	})
}

// DefaultPolicyWait is how long a request to a port waits for the port's
// first answer from the [Source] unless [WithPolicyWait] says otherwise.
const DefaultPolicyWait = 5 * time.Second

// WithPolicyWait bounds how long a request to a port whose first answer
// is pending waits for it: the watch of a port starts when the Handler
// first learns of the port ([WithPorts], [Handler.WatchPorts], its
// target's port, or its first request), and until the Source answers, or
// d has passed since then, the port's requests wait, so that a fresh
// process never lets through what its policy refuses (fail closed at
// start). Only past d does the default Server ([WithDefault]) decide,
// with a line in the log (naming why, when the Source is a
// [PendingCause]) and each request so decided counted in
// inbound_http_policy_unavailable_total, until the answer arrives.
// 0 (the default) means [DefaultPolicyWait]; a negative d means no
// waiting: the default Server decides until the first answer, as
// Linkerd's proxy does behind Kubernetes' readiness gate. A request whose
// context ends while it waits is refused with 503 (gRPC UNAVAILABLE).
func WithPolicyWait(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d != 0 {
			c.wait = d
		}
	})
}

// WithPorts starts the watches of ports, those the server serves, when
// the Handler is made, so that their policies are on their way before
// the first requests arrive ([Handler.WatchPorts] does it later, for
// ports known once listening). With [WithTarget] only the target's port
// has a policy, and it is always watched from the start.
func WithPorts(ports ...uint16) Option {
	return optionFunc(func(c *config) { c.ports = append(c.ports, ports...) })
}

// WithTarget makes every request one to target, the application's
// address, as a sidecar in front of one application port sees it: its
// port picks the policy and target is what the target_* labels say.
// Without it (or with an invalid one), a request's own local address
// does.
func WithTarget(target netip.AddrPort) Option {
	return optionFunc(func(c *config) {
		if target.IsValid() {
			c.target = netip.AddrPortFrom(target.Addr().Unmap(), target.Port())
		}
	})
}

// WithoutLocalhost drops the authorization every Server otherwise ends
// with, which admits any request from the loopback addresses: Linkerd's
// proxy adds it because in a pod only the pod's own processes share its
// loopback, but a process that shares its machine with callers it must
// not trust (several services on one host, as in inmesh's examples) must
// not admit them for where they connect from.
func WithoutLocalhost() Option {
	return optionFunc(func(c *config) { c.noLocalhost = true })
}

// WithMeshTLS tells the Handler that the server terminates mesh TLS, so
// that a request without an identity.Peer in its context came in plaintext
// on a meshed port: tls="no_identity" with no_tls_reason
// "no_tls_from_remote" (or "loopback"), as Linkerd's proxy labels it, not
// tls="disabled".
func WithMeshTLS() Option {
	return optionFunc(func(c *config) { c.meshTLS = true })
}

// WithMetricLabels makes the Handler pass an allowed request on with its
// target, srv_*, route_*, authz_* and tls labels in the context
// (classify.WithLabels), so that the inbound request_total, response_total
// and response_latency_ms a classify.Handler after it records carry them, as
// Linkerd's proxy labels them and `linkerd viz stat-inbound` groups them.
// The labels replace any the context had. It costs the allowed request a
// new context and request (two allocations).
func WithMetricLabels() Option {
	return optionFunc(func(c *config) { c.metricLabels = true })
}

// WithLabelledNext is [WithMetricLabels] without the new context: an
// allowed request goes to nextFor(labels) in place of the Handler's next,
// a handler made once per series of the policy (such as one of
// classify.HandlerWithLabels in front of the same application), so that
// its target, srv_*, route_*, authz_* and tls labels reach the inbound
// request and response metrics without an allocation. Unlike
// WithMetricLabels, it leaves the request's context as it is: a handler of
// classify.HandlerWithLabels lets labels already in the context win. Past
// the series the Handler keeps (4096 per port's policy), a request gets its
// handler made anew.
func WithLabelledNext(nextFor func(*classify.Labels) http.Handler) Option {
	return optionFunc(func(c *config) { c.nextFor = nextFor })
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
