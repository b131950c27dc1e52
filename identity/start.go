package identity

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/internal/cpaddr"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// DefaultServiceName is the identity that Linkerd's identity service
// proves with its default control-plane namespace (linkerd) and trust
// domain (cluster.local); inmesh's embedded issuer proves the same.
const DefaultServiceName = "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"

// Config is what a workload needs to obtain its identity from an Identity
// service: who it is, whom it trusts, what proves it, and where to ask.
// [Env.Config] fills it from the variables Linkerd's proxy injector sets.
type Config struct {
	// Name is the workload's identity, such as
	// books.default.serviceaccount.identity.linkerd.cluster.local.
	Name string
	// TrustAnchors is the PEM bundle of the trust anchors; set it or
	// TrustAnchorsFile, not both.
	TrustAnchors []byte
	// TrustAnchorsFile is a file holding the PEM bundle of the trust
	// anchors (the embedded control plane's ca.crt, or Linkerd's
	// ca-bundle.crt).
	TrustAnchorsFile string
	// TokenFile holds the token that proves the identity (a service
	// account token); it is read anew for every certification, since
	// projected tokens rotate.
	TokenFile string
	// Addr is the Identity service's address, host:port, or the addresses
	// of several replicas, comma-separated ("10.0.0.1:8080,10.0.0.2:8080"):
	// certifications go to the first that accepts a connection and, once
	// its connection is lost, to the next live one in the order given.
	// (A host name with several addresses is tried address by address on
	// each connection attempt, as net.Dial does.)
	Addr string
	// ServerName is the identity the Identity service must prove (default
	// [DefaultServiceName]).
	ServerName string
	// DialOptions are added to those of the connection to the Identity
	// service (a custom dialer, for instance); its transport credentials
	// are the identity's own.
	DialOptions []grpc.DialOption
	// Keepalive is how long the connection to the Identity service may
	// stay silent before the session pings it (default
	// [DefaultKeepalive]; negative: never): a replica lost without closing
	// the connection (its host gone, a frozen process) is left, for the
	// next live one in Addr, within Keepalive and KeepaliveTimeout. gRPC
	// raises anything under 10 s to 10 s.
	// Ping more often than every five minutes only an Identity service
	// that allows it, such as inmesh's (controlplane.KeepaliveOptions): a
	// gRPC-Go server with default settings, as Linkerd's identity
	// controller, closes the connection of a client that pings more often.
	Keepalive time.Duration
	// KeepaliveTimeout is how long the answer to a ping may take before
	// the connection is dropped (default [DefaultKeepaliveTimeout]).
	KeepaliveTimeout time.Duration
}

// DefaultKeepalive is [Config.Keepalive]'s default: the most often a gRPC-Go
// server lets a client ping by default. DefaultKeepaliveTimeout is how long
// the answer to a ping may take before the connection is dropped.
const (
	DefaultKeepalive        = cpaddr.DefaultPing
	DefaultKeepaliveTimeout = cpaddr.DefaultPingTimeout
)

// Config returns the configuration Linkerd's proxy reads from e; pass
// [WithRefreshBounds](e.MinRefresh, e.MaxRefresh) to [Start] as well.
func (e Env) Config() Config {
	return Config{Name: e.LocalName, TrustAnchors: []byte(e.TrustAnchors), TokenFile: e.TokenFile,
		Addr: e.SvcAddr, ServerName: e.SvcName}
}

// Session is a workload identity kept certified by an Identity service,
// from [Start] or [NewSession] until [Session.Close]. Pass its
// [Session.Local] to mesh.WithIdentity and meshgrpc.WithIdentity.
type Session struct {
	local   *Local
	addr    string
	anchors string // where the trust anchors came from, for the logs
	conn    *grpc.ClientConn
	c       *Certifier

	mu      sync.Mutex
	lastErr error         // the last failed certification before the first success
	failed  chan struct{} // closed, and replaced, at each failure before the first success

	cancel    context.CancelFunc
	certified chan struct{} // closed once the first certification is installed and counted
	done      chan struct{} // closed when the certification goroutine returns
	close     sync.Once
}

// Start gives the process its workload identity in one call: it makes the
// key and the signing request, connects to the Identity service over TLS
// (the service must prove cfg.ServerName), certifies the identity with the
// token, and returns once the first certificate is installed, with renewal
// running in the background until [Session.Close] (at 70% of the
// certificate's life, within the refresh bounds; see [Certifier]).
//
// A failed certification is logged and tried again with backoff, from
// 100ms up to the minimum refresh interval, until ctx ends: then Start
// returns an error that names the identity, the service and the last
// failure. A refusal by the service (a token that proves another identity,
// or none) is such an error at once. ctx bounds only that wait, not the
// renewals. A configuration that cannot work (an invalid name, no or
// unreadable trust anchors, no token file or address) is an error at
// once, naming the field.
//
// opts are the [Certifier]'s: [WithLogger], [WithMeterProvider] and
// [WithRefreshBounds].
func Start(ctx context.Context, cfg Config, opts ...Option) (*Session, error) {
	s, err := NewSession(cfg, opts...)
	if err != nil {
		return nil, err
	}
	if err := s.Wait(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// NewSession is [Start] without the wait: it returns at once, with the
// first certification under way in the background; [Session.Wait] or
// the Local's Ready channel tells when the identity is certified. A
// program that serves a readiness check before it is certified (as
// Linkerd's proxy does) uses it.
func NewSession(cfg Config, opts ...Option) (*Session, error) {
	if err := CheckName(cfg.Name); err != nil {
		return nil, fmt.Errorf("identity: Config.Name: %w", err)
	}
	anchors, err := cfg.anchors()
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.TokenFile == "":
		return nil, errors.New("identity: Config.TokenFile is empty: the file of the token that proves the identity is required")
	case cfg.Addr == "":
		return nil, errors.New("identity: Config.Addr is empty: the Identity service's host:port is required")
	}
	server := cfg.ServerName
	if server == "" {
		server = DefaultServiceName
	}
	if err := CheckName(server); err != nil {
		return nil, fmt.Errorf("identity: Config.ServerName: %w", err)
	}
	local, err := NewLocal(cfg.Name, anchors)
	if err != nil {
		return nil, err
	}
	// grpc-go's reconnect backoff reaches 120s by default: after an outage
	// of the Identity service the renewal would wait that long. Cap it at
	// the minimum refresh interval, how often a failed renewal is retried.
	minRefresh, _ := refreshBounds(opts)
	reconnect := grpcbackoff.DefaultConfig
	reconnect.MaxDelay = max(minRefresh, reconnect.BaseDelay)
	ping := cfg.Keepalive
	switch {
	case ping == 0:
		ping = DefaultKeepalive
	case ping < 0:
		ping = cpaddr.NoPing
	}
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(local.TransportCredentials(server)),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnect, MinConnectTimeout: 20 * time.Second}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: ping, Timeout: cmp.Or(max(cfg.KeepaliveTimeout, 0), DefaultKeepaliveTimeout)}),
	}, cfg.DialOptions...)
	target := "passthrough:///" + cfg.Addr
	if cpaddr.IsList(cfg.Addr) {
		var resolve grpc.DialOption
		if target, resolve, err = cpaddr.Target(cfg.Addr); err != nil {
			return nil, fmt.Errorf("identity: Config.Addr: %w", err)
		}
		dial = append(dial, resolve)
	}
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("identity: Config.Addr %q: %w", cfg.Addr, err)
	}
	anchorsFrom := "Config.TrustAnchors"
	if cfg.TrustAnchorsFile != "" {
		anchorsFrom = cfg.TrustAnchorsFile
	}
	// The anchors' source names them in the Certifier's messages too (an
	// Identity service they do not trust); a WithAnchorsName in opts wins.
	opts = append([]Option{WithAnchorsName(anchorsFrom)}, opts...)
	c := NewCertifier(local, conn, cfg.TokenFile, opts...)
	s := &Session{local: local, addr: cfg.Addr, anchors: c.anchorsName, conn: conn, c: c,
		failed: make(chan struct{}), certified: make(chan struct{}), done: make(chan struct{})}
	var ctx context.Context
	ctx, s.cancel = context.WithCancel(context.Background())
	go s.run(ctx)
	return s, nil
}

// anchors returns the trust anchors the configuration names.
func (cfg Config) anchors() (*x509.CertPool, error) {
	switch {
	case len(cfg.TrustAnchors) > 0 && cfg.TrustAnchorsFile != "":
		return nil, errors.New("identity: Config.TrustAnchors and Config.TrustAnchorsFile are both set: set one")
	case cfg.TrustAnchorsFile != "":
		pem, err := os.ReadFile(cfg.TrustAnchorsFile)
		if err != nil {
			return nil, fmt.Errorf("identity: Config.TrustAnchorsFile: %w", err)
		}
		pool, err := ParseAnchors(pem)
		if err != nil {
			return nil, fmt.Errorf("identity: Config.TrustAnchorsFile %s: %w", cfg.TrustAnchorsFile, err)
		}
		return pool, nil
	case len(cfg.TrustAnchors) > 0:
		pool, err := ParseAnchors(cfg.TrustAnchors)
		if err != nil {
			return nil, fmt.Errorf("identity: Config.TrustAnchors: %w", err)
		}
		return pool, nil
	default:
		return nil, fmt.Errorf("identity: Config.TrustAnchors or Config.TrustAnchorsFile is required: %w", ErrNoAnchors)
	}
}

// refreshBounds returns the refresh bounds that opts give a Certifier.
func refreshBounds(opts []Option) (min, max time.Duration) {
	c := &Certifier{min: DefaultMinRefresh, max: DefaultMaxRefresh}
	for _, o := range opts {
		if o != nil {
			o.apply(c)
		}
	}
	return c.min, c.max
}

// run certifies the identity, retrying with backoff until it succeeds,
// then leaves the renewals to the Certifier from the refresh time of the
// certificate obtained.
func (s *Session) run(ctx context.Context) {
	defer close(s.done)
	unobserve := s.c.observe() // the expiry gauge until Run reports it
	retry := backoff.Policy{Min: min(100*time.Millisecond, s.c.min), Max: s.c.min, Jitter: 0.1}
	err := backoff.Retry(ctx, retry, s.c.Certify, func(err error, delay time.Duration) {
		s.mu.Lock()
		s.lastErr = err
		close(s.failed)
		s.failed = make(chan struct{})
		s.mu.Unlock()
		s.c.log.Warn("identity: certification failed; no certificate yet, trying again",
			"identity", s.local.Name(), "addr", s.addr, "trust_anchors", s.anchors, "retry_in", delay.Round(time.Millisecond), "error", err)
	})
	if err == nil {
		close(s.certified)
		err = backoff.Wait(ctx, RefreshIn(s.local.now(), s.local.Expiry(), s.c.min, s.c.max))
	}
	unobserve()
	if err == nil {
		_ = s.c.Run(ctx)
	}
}

// Local returns the identity, for mesh.WithIdentity and
// meshgrpc.WithIdentity. It has no certificate until the first one is
// installed ([Local.Ready]).
func (s *Session) Local() *Local { return s.local }

// Wait returns nil once the identity has its first certificate. It
// returns an error naming the identity, the Identity service and the last
// failed certification when ctx ends first, when the session is closed,
// or as soon as the service refuses the request (InvalidArgument,
// FailedPrecondition, Unauthenticated, PermissionDenied: a token that
// proves another identity, or none). The session keeps trying meanwhile,
// as Linkerd's proxy does, so a later Wait can still succeed: the token
// or the service's configuration may be fixed.
func (s *Session) Wait(ctx context.Context) error {
	for {
		s.mu.Lock()
		last, failed := s.lastErr, s.failed
		s.mu.Unlock()
		var cause error
		select {
		case <-s.certified:
			return nil
		default:
		}
		if refused(last) {
			cause = errors.New("the Identity service refused the request")
		} else {
			select {
			case <-s.certified:
				return nil
			case <-failed:
				continue
			case <-ctx.Done():
				cause = ctx.Err()
			case <-s.done:
				cause = errors.New("the session is closed")
			}
		}
		select {
		case <-s.certified: // it came as the wait ended
			return nil
		default:
		}
		s.mu.Lock()
		last = s.lastErr
		s.mu.Unlock()
		if last == nil {
			return fmt.Errorf("identity: no certificate for %s from the Identity service at %s: %w", s.local.Name(), s.addr, cause)
		}
		return fmt.Errorf("identity: no certificate for %s from the Identity service at %s: %w (last failure: %w)", s.local.Name(), s.addr, cause, last)
	}
}

// refused reports whether err is the Identity service's refusal of a
// request, which trying again with the same token and name cannot change.
func refused(err error) bool {
	if err == nil {
		return false
	}
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.Unauthenticated, codes.PermissionDenied:
		return true
	}
	return false
}

// Close stops the renewals and closes the connection to the Identity
// service. The certificate stays in place, and valid until it expires.
// Close may be called more than once.
func (s *Session) Close() error {
	var err error
	s.close.Do(func() {
		s.cancel()
		<-s.done
		err = s.conn.Close()
	})
	return err
}
