package identity

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/proxyapi/identitypb"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	xcredentials "google.golang.org/grpc/experimental/credentials"
)

// The refresh bounds of a [Certifier] unless an option changes them:
// Linkerd's proxy's defaults (LINKERD2_PROXY_IDENTITY_MIN_REFRESH and
// _MAX_REFRESH).
const (
	DefaultMinRefresh = 10 * time.Second
	DefaultMaxRefresh = 24 * time.Hour
)

// Option configures a [Certifier].
type Option interface{ apply(*Certifier) }

type optionFunc func(*Certifier)

func (f optionFunc) apply(c *Certifier) { f(c) }

// WithRefreshBounds bounds the wait between two certifications (defaults
// [DefaultMinRefresh] and [DefaultMaxRefresh]); a value <= 0 keeps its
// default.
func WithRefreshBounds(min, max time.Duration) Option {
	return optionFunc(func(c *Certifier) {
		if min > 0 {
			c.min = min
		}
		if max > 0 {
			c.max = max
		}
	})
}

// WithLogger sets where the Certifier logs its failures (default
// slog.Default()); nil changes nothing.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *Certifier) {
		if l != nil {
			c.log = l
		}
	})
}

// WithAnchorsName names where the trust anchors came from (a file, an
// environment variable) in the Certifier's messages, such as the one
// saying that the Identity service's certificate does not chain to them.
func WithAnchorsName(name string) Option {
	return optionFunc(func(c *Certifier) { c.anchorsName = name })
}

// WithMeterProvider sets where the Certifier's metrics go (default: the
// global provider): control_identity_cert_expiration_timestamp_seconds,
// control_identity_cert_refresh_timestamp_seconds and
// control_identity_cert_refreshes_total{result="ok"|"error"}, the names
// and labels of Linkerd's proxy.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *Certifier) { c.mp = mp })
}

// ScopeName is the instrumentation scope of the identity metrics.
const ScopeName = "github.com/inmesh/inmesh/identity"

// Certifier keeps a [Local] identity certified by an Identity service.
type Certifier struct {
	local     *Local
	client    identitypb.IdentityClient
	tokenFile string
	min, max  time.Duration
	log       *slog.Logger
	mp        metric.MeterProvider
	// anchorsName names the trust anchors' source in messages.
	anchorsName string

	meter       metric.Meter
	refreshes   metric.Int64Counter
	ok, failed  metric.AddOption
	lastRefresh atomic.Int64 // unix nanoseconds of the last certificate installed
}

// NewCertifier returns a Certifier of local that calls the Identity
// service on conn with the token in tokenFile, read anew for every call.
// conn is typically dialled with [Local.TransportCredentials] of the
// service's own identity.
func NewCertifier(local *Local, conn grpc.ClientConnInterface, tokenFile string, opts ...Option) *Certifier {
	c := &Certifier{local: local, client: identitypb.NewIdentityClient(conn), tokenFile: tokenFile,
		min: DefaultMinRefresh, max: DefaultMaxRefresh, log: slog.Default()}
	for _, o := range opts {
		if o != nil {
			o.apply(c)
		}
	}
	if c.max < c.min {
		c.max = c.min
	}
	c.meter = metrics.Meter(c.mp, ScopeName)
	var err error
	if c.refreshes, err = c.meter.Int64Counter("control_identity_cert_refreshes_total",
		metric.WithDescription("The total number of times the identity certificate was refreshed, by result.")); err != nil {
		otel.Handle(err)
	}
	c.ok = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "ok")))
	c.failed = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "error")))
	return c
}

// observe reports the certificate's expiry and last refresh while Run
// runs; the returned function unregisters them.
func (c *Certifier) observe() func() {
	exp, err1 := c.meter.Float64ObservableGauge("control_identity_cert_expiration_timestamp_seconds",
		metric.WithDescription("Time when this proxy's current mTLS identity certificate will expire (in seconds since the UNIX epoch)."))
	ref, err2 := c.meter.Float64ObservableGauge("control_identity_cert_refresh_timestamp_seconds",
		metric.WithDescription("Time when this proxy's current mTLS identity certificate was last refreshed (in seconds since the UNIX epoch)."))
	if err := errors.Join(err1, err2); err != nil {
		otel.Handle(err)
		return func() {}
	}
	reg, err := c.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if e := c.local.Expiry(); !e.IsZero() {
			o.ObserveFloat64(exp, float64(e.UnixNano())/1e9)
		}
		if r := c.lastRefresh.Load(); r != 0 {
			o.ObserveFloat64(ref, float64(r)/1e9)
		}
		return nil
	}, exp, ref)
	if err != nil {
		otel.Handle(err)
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// Run certifies the identity, then again each time [RefreshIn] says, until
// ctx is done; it returns ctx's error. A failed call is logged, saying
// whether a valid certificate stays in use, and tried again after a
// backoff that starts at 100ms and doubles up to the minimum refresh
// interval, so that a first certification (or a renewal) that fails
// because the Identity service is not up yet succeeds as soon as it is.
func (c *Certifier) Run(ctx context.Context) error {
	defer c.observe()()
	retry := backoff.Policy{Min: min2(retryStart, c.min), Max: c.min, Jitter: 0.1}
	failures := 0
	for {
		var wait time.Duration
		if err := c.Certify(ctx); err != nil {
			wait = retry.Delay(failures)
			failures++
			if ctx.Err() == nil {
				c.logFailure(err, wait)
			}
		} else {
			failures = 0
			wait = RefreshIn(c.local.now(), c.local.Expiry(), c.min, c.max)
		}
		if err := backoff.Wait(ctx, wait); err != nil {
			return err
		}
	}
}

// retryStart is the first wait after a failed certification, where
// backoff.DefaultPolicy starts. Linkerd's proxy waits its minimum refresh
// interval (10 s) after a failure without a certificate, and 70% of the
// time left with one (linkerd2-proxy identity-client certify.rs); inmesh
// retries sooner so that a process started beside its control plane is
// ready as soon as the Identity service is.
const retryStart = 100 * time.Millisecond

// logFailure says what a failed certification leaves in place: no
// certificate yet, an expired one, or a valid one still in use; and, when
// the Identity service's certificate does not chain to the trust anchors,
// which anchors those are.
func (c *Certifier) logFailure(err error, retryIn time.Duration) {
	args := []any{"identity", c.local.Name(), "retry_in", retryIn.Round(time.Millisecond), "error", err}
	// The handshake's error reaches here as the text of a gRPC status
	// (Unavailable), which wraps nothing.
	if errors.Is(err, ErrUntrustedCrt) || strings.Contains(err.Error(), ErrUntrustedCrt.Error()) {
		anchors := c.anchorsName
		if anchors == "" {
			anchors = "the trust anchors given to identity.NewLocal"
		}
		c.log.Error("identity: the Identity service's certificate does not chain to the trust anchors; are they the mesh's?",
			append(args, "anchors", anchors)...)
	}
	switch exp := c.local.Expiry(); {
	case exp.IsZero():
		c.log.Warn("identity: certification failed; no certificate yet, the identity is not ready", args...)
	case !c.local.now().Before(exp):
		c.log.Warn("identity: certification failed; the certificate has expired, meshed connections fail until one is issued",
			append(args, "expired", exp)...)
	default:
		c.log.Warn("identity: certification failed; the current certificate stays in use until it expires",
			append(args, "expires", exp)...)
	}
}

// certifyTimeout bounds one Certify call; tests shorten it.
var certifyTimeout = 30 * time.Second

// Certify makes one Certify call and installs the certificate it returns.
func (c *Certifier) Certify(ctx context.Context) error {
	err := c.certify(ctx)
	if err == nil {
		// Before the count: a reader that sees the refresh counted sees
		// its time.
		c.lastRefresh.Store(c.local.now().UnixNano())
	}
	if c.refreshes != nil {
		result := c.ok
		if err != nil {
			result = c.failed
		}
		c.refreshes.Add(ctx, 1, result)
	}
	return err
}

func (c *Certifier) certify(ctx context.Context) error {
	token, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return fmt.Errorf("identity: reading the token: %w", err)
	}
	if token = bytes.TrimSpace(token); len(token) == 0 {
		return fmt.Errorf("identity: the token file %s is empty", c.tokenFile)
	}
	// A call to a replica that went silent fails at its deadline and is
	// tried again, rather than holding every renewal for ever.
	ctx, cancel := context.WithTimeout(ctx, certifyTimeout)
	defer cancel()
	resp, err := c.client.Certify(ctx, &identitypb.CertifyRequest{
		Identity: c.local.Name(), Token: token, CertificateSigningRequest: c.local.CSR(),
	})
	if err != nil {
		return fmt.Errorf("identity: certify: %w", err)
	}
	if resp.ValidUntil == nil || !resp.ValidUntil.AsTime().After(c.local.now()) {
		return errors.New("identity: certify: the response's valid_until is missing or past")
	}
	return c.local.SetCertificate(resp.LeafCertificate, resp.IntermediateCertificates)
}

// RefreshIn returns how long to wait before the next certification, as
// Linkerd's proxy schedules it: 70% of the time left until expiry, within
// [min, max]; min when there is no valid certificate (expiry zero or past).
func RefreshIn(now, expiry time.Time, min, max time.Duration) time.Duration {
	if expiry.IsZero() || !expiry.After(now) {
		return min
	}
	d := expiry.Sub(now) * 7 / 10
	return max2(min, min2(d, max))
}

func min2(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

func max2(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

// TransportCredentials returns gRPC transport credentials for a control-
// plane service (Identity, Destination, policy) whose identity is server,
// built on [Local.ClientConfig]: the service must prove that identity,
// and the local certificate is presented once there is one and while it
// is valid: an expired one is not sent, so that it can be renewed. The handshake
// negotiates no ALPN, since Linkerd's proxies in front of its controllers
// select none, which grpc-go's default TLS credentials would refuse.
func (l *Local) TransportCredentials(server string) credentials.TransportCredentials {
	return xcredentials.NewTLSWithALPNDisabled(l.clientConfig(server, l.controlCertificate))
}
