package controlplane

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/proxyapi/identitypb"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The issuance defaults of an [Issuer] unless an option changes them:
// Linkerd's identity controller's chart values (issuanceLifetime and
// clockSkewAllowance).
const (
	DefaultIssuanceLifetime = 24 * time.Hour
	DefaultClockSkew        = 20 * time.Second
)

// Token errors a [TokenValidator] returns, which the Issuer answers with
// the gRPC codes Linkerd's identity controller uses.
var (
	// ErrInvalidToken: the token cannot be read (InvalidArgument).
	ErrInvalidToken = errors.New("invalid token")
	// ErrNotAuthenticated: the token is well formed but proves nothing
	// (FailedPrecondition).
	ErrNotAuthenticated = errors.New("token not authenticated")
)

// TokenValidator says which identity a token proves: the stand-in for
// Kubernetes' TokenReview. An error wrapping [ErrInvalidToken] or
// [ErrNotAuthenticated] is the caller's fault; any other is the Issuer's.
type TokenValidator interface {
	Validate(ctx context.Context, token []byte) (identity string, err error)
}

// IssuerOption configures an [Issuer].
type IssuerOption interface{ apply(*Issuer) }

type issuerOptionFunc func(*Issuer)

func (f issuerOptionFunc) apply(i *Issuer) { f(i) }

// WithIssuanceLifetime sets how long an issued certificate is valid
// (default [DefaultIssuanceLifetime]); d <= 0 changes nothing.
func WithIssuanceLifetime(d time.Duration) IssuerOption {
	return issuerOptionFunc(func(i *Issuer) {
		if d > 0 {
			i.lifetime = d
		}
	})
}

// WithClockSkew sets the allowance added before and after the lifetime
// (default [DefaultClockSkew]); d < 0 changes nothing.
func WithClockSkew(d time.Duration) IssuerOption {
	return issuerOptionFunc(func(i *Issuer) {
		if d >= 0 {
			i.skew = d
		}
	})
}

// WithIssuerLogger sets where refused requests are logged (default
// slog.Default()); nil changes nothing.
func WithIssuerLogger(l *slog.Logger) IssuerOption {
	return issuerOptionFunc(func(i *Issuer) {
		if l != nil {
			i.log = l
		}
	})
}

// WithIssuerMeterProvider sets where the Issuer's metrics go (default: the
// global provider): issuer_cert_ttl_seconds, the seconds left until the
// issuer's certificate chain expires (negative once it has), as Linkerd's
// identity controller reports it, and identity_issuer_invalid_total, the
// Certify requests refused because the issuer's chain did not verify at
// the time of the request (expired, not yet valid, or no longer leading
// to the trust anchors).
func WithIssuerMeterProvider(mp metric.MeterProvider) IssuerOption {
	return issuerOptionFunc(func(i *Issuer) { i.mp = mp })
}

// ScopeName is the instrumentation scope of the control plane's metrics.
const ScopeName = "github.com/inmesh/inmesh/controlplane"

// Issuer serves the Identity API's Certify: it signs a workload's
// certificate signing request with the issuer's key once the token proves
// the identity asked for, with the rules and gRPC codes of Linkerd's
// identity controller. It is safe for concurrent use.
type Issuer struct {
	identitypb.UnimplementedIdentityServer

	crt      *x509.Certificate
	key      crypto.Signer
	chain    [][]byte // the issuer's certificate, then any beyond it
	anchors  *x509.CertPool
	inter    *x509.CertPool // chain[1:]
	expiry   time.Time
	mp       metric.MeterProvider
	invalid  metric.Int64Counter // identity_issuer_invalid_total
	tokens   TokenValidator
	lifetime time.Duration
	skew     time.Duration
	log      *slog.Logger
	refused  *ratelog.Logger // refusals a caller can repeat at will
	now      func() time.Time
}

// NewIssuer returns an Issuer signing with the CA certificate issuer (DER
// chain, issuer first, up to but not including an anchor) and its key,
// after checking that the chain leads to anchors, and taking the
// identities tokens prove.
func NewIssuer(anchors *x509.CertPool, chain [][]byte, key crypto.Signer, tokens TokenValidator, opts ...IssuerOption) (*Issuer, error) {
	if len(chain) == 0 || key == nil || tokens == nil || anchors == nil {
		return nil, errors.New("controlplane: an issuer needs anchors, a certificate chain, a key and a token validator")
	}
	crts := make([]*x509.Certificate, len(chain))
	pool := x509.NewCertPool()
	for n, der := range chain {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("controlplane: issuer certificate %d: %w", n, err)
		}
		crts[n] = c
		if n > 0 {
			pool.AddCert(c)
		}
	}
	crt := crts[0]
	if !crt.IsCA {
		return nil, errors.New("controlplane: the issuer certificate is not a CA")
	}
	if _, err := crt.Verify(x509.VerifyOptions{Roots: anchors, Intermediates: pool,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("controlplane: the issuer certificate does not chain to the trust anchors: %w", err)
	}
	if pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(crt.PublicKey) {
		return nil, errors.New("controlplane: the issuer key does not match its certificate")
	}
	i := &Issuer{crt: crt, key: key, chain: chain, anchors: anchors, inter: pool, tokens: tokens,
		lifetime: DefaultIssuanceLifetime, skew: DefaultClockSkew, log: slog.Default(), now: time.Now}
	i.expiry = crt.NotAfter
	for _, c := range crts[1:] {
		if c.NotAfter.Before(i.expiry) {
			i.expiry = c.NotAfter
		}
	}
	for _, o := range opts {
		if o != nil {
			o.apply(i)
		}
	}
	i.refused = ratelog.New(i.log, 0)
	i.instruments()
	return i, nil
}

// instruments creates the Issuer's metrics; errors go to otel.Handle and
// leave the instrument a no-op.
func (i *Issuer) instruments() {
	meter := metrics.Meter(i.mp, ScopeName)
	var err error
	if i.invalid, err = meter.Int64Counter("identity_issuer_invalid_total",
		metric.WithDescription("Certify requests refused because the issuer's certificate chain does not verify now.")); err != nil {
		otel.Handle(err)
	}
	if _, err = meter.Float64ObservableGauge("issuer_cert_ttl_seconds",
		metric.WithDescription("The remaining seconds until the issuer certificate expires"),
		metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
			o.Observe(float64(i.expiry.Sub(i.now()).Truncate(time.Second)) / float64(time.Second))
			return nil
		})); err != nil {
		otel.Handle(err)
	}
}

// Register adds the Identity service to s.
func (i *Issuer) Register(s grpc.ServiceRegistrar) { identitypb.RegisterIdentityServer(s, i) }

// Certify implements the Identity service, checking in Linkerd's order:
// a missing identity, token or request, or a request that does not parse,
// is InvalidArgument, and so is one whose signature does not verify with
// the key it carries (RFC 2986, 3: the requester must hold that key); an
// issuer whose own chain does not verify now (expired) refuses every
// request with Unknown, as Linkerd's controller answers it, logs it at
// error level and counts it; a request whose names break the rules (exactly one
// DNS SAN, equal to the identity; a common name empty or equal; no other
// SAN kinds) is FailedPrecondition; an unreadable token InvalidArgument,
// an unauthenticated one FailedPrecondition, one for another identity
// FailedPrecondition; a failure to sign Internal.
func (i *Issuer) Certify(ctx context.Context, req *identitypb.CertifyRequest) (*identitypb.CertifyResponse, error) {
	id, tok, der := req.GetIdentity(), req.GetToken(), req.GetCertificateSigningRequest()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "missing identity")
	case len(tok) == 0:
		return nil, status.Error(codes.InvalidArgument, "missing token")
	case len(der) == 0:
		return nil, status.Error(codes.InvalidArgument, "missing certificate signing request")
	case len(id) > maxIdentityLen:
		// Before any line names it: an unauthenticated caller's identity
		// would otherwise be kept as a log key and printed whole.
		return nil, status.Errorf(codes.InvalidArgument, "identity longer than %d bytes, the longest DNS name", maxIdentityLen)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := csr.CheckSignature(); err != nil {
		i.refused.WarnErr("signature:"+id, "identity: refused a signing request whose signature does not verify", err, "identity", id)
		return nil, status.Error(codes.InvalidArgument, "CSR signature does not verify with its public key: "+err.Error())
	}
	if err := i.ensureStillValid(); err != nil {
		i.refused.Error("issuer", "identity: the issuer's certificate does not verify; no certificate is issued until it is replaced",
			"error", err, "identity", id, "issuer_not_after", i.crt.NotAfter)
		if i.invalid != nil {
			i.invalid.Add(ctx, 1)
		}
		// Linkerd's controller returns the verification error as it is,
		// which gRPC answers as Unknown.
		return nil, status.Error(codes.Unknown, err.Error())
	}
	if err := checkCSR(csr, id); err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	proven, err := i.tokens.Validate(ctx, tok)
	switch {
	case errors.Is(err, ErrInvalidToken):
		i.refused.WarnErr("token:"+id, "identity: refused a token", err, "identity", id)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrNotAuthenticated):
		i.refused.WarnErr("token:"+id, "identity: refused a token", err, "identity", id)
		// Linkerd's controller answers every unauthenticated token so.
		return nil, status.Error(codes.FailedPrecondition, "authentication token could not be authenticated")
	case err != nil:
		return nil, status.Error(codes.Internal, err.Error())
	}
	if proven != id {
		i.refused.WarnErr("other:"+id, "identity: a token for another identity", errors.New("the token proves "+proven), "requested", id)
		return nil, status.Error(codes.FailedPrecondition,
			fmt.Sprintf("requested identity did not match provided token: requested=%s; found=%s", id, proven))
	}
	leaf, notAfter, err := i.issue(csr)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &identitypb.CertifyResponse{
		LeafCertificate:          leaf,
		IntermediateCertificates: i.chain,
		ValidUntil:               timestamppb.New(notAfter),
	}, nil
}

// maxIdentityLen is the longest identity Certify reads: an identity is a
// DNS name (the certificate's one DNS SAN), at most 253 bytes.
const maxIdentityLen = 253

// ensureStillValid verifies the issuer's chain to the anchors at the
// time of the request, as Linkerd's controller does before each
// certificate (linkerd2 pkg/identity/service.go ensureIssuerStillValid),
// with its message for an expiry.
func (i *Issuer) ensureStillValid() error {
	now := i.now()
	_, err := i.crt.Verify(x509.VerifyOptions{Roots: i.anchors, Intermediates: i.inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	var invalid x509.CertificateInvalidError
	if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
		return fmt.Errorf("%w - Current Time : %s - Invalid before %s - Invalid After %s", err, now, i.crt.NotBefore, i.crt.NotAfter)
	}
	return err
}

// checkCSR applies the naming rules of Linkerd's identity controller
// (linkerd2 pkg/identity/service.go checkCSR), with its messages.
func checkCSR(csr *x509.CertificateRequest, id string) error {
	if len(csr.DNSNames) != 1 {
		return errors.New("CSR must have exactly one DNSName")
	}
	if csr.DNSNames[0] != id {
		return fmt.Errorf("CSR name does not match requested identity: csr=%s; req=%s", csr.DNSNames[0], id)
	}
	if cn := csr.Subject.CommonName; cn != "" && cn != id {
		return fmt.Errorf("invalid CommonName: %s", cn)
	}
	if len(csr.EmailAddresses) > 0 {
		return errors.New("cannot validate email addresses")
	}
	if len(csr.IPAddresses) > 0 {
		return errors.New("cannot validate IP addresses")
	}
	if len(csr.URIs) > 0 {
		return errors.New("cannot validate URIs")
	}
	return nil
}

// issue signs the leaf of csr: valid from now less the skew allowance to
// now plus the lifetime and the allowance, never past the issuer chain's
// own expiry.
// serialLimit bounds the issued serials: 128 random bits.
var serialLimit = new(big.Int).Lsh(big.NewInt(1), 128)

func (i *Issuer) issue(csr *x509.CertificateRequest) ([]byte, time.Time, error) {
	// Linkerd's controller signs any ECDSA key; its proxies only ever
	// send P-256 (linkerd2-proxy's meshtls), so no other curve is signed.
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return nil, time.Time{}, errors.New("CSR must contain an ECDSA public key")
	}
	if pub.Curve != elliptic.P256() {
		return nil, time.Time{}, fmt.Errorf("CSR must contain an ECDSA P-256 public key, not %s", pub.Curve.Params().Name)
	}
	// A certificate holds whole seconds: valid_until is its NotAfter, as
	// Linkerd's controller reads it back from the certificate it issued,
	// and a proxy times its renewal by it.
	now := i.now().Truncate(time.Second)
	notAfter := now.Add(i.lifetime + i.skew)
	if notAfter.After(i.expiry) {
		notAfter = i.expiry
	}
	// A random 128-bit serial, as the CAs of pki.go: a CA's serials must
	// be unique (RFC 5280, 4.1.2.2), and a counter kept in memory starts
	// over when the control plane restarts.
	serial, err := rand.Int(rand.Reader, serialLimit)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("a serial number: %w", err)
	}
	serial.Add(serial, big.NewInt(1))
	tmpl := &x509.Certificate{
		SerialNumber:       serial,
		Subject:            csr.Subject,
		DNSNames:           csr.DNSNames,
		NotBefore:          now.Add(-i.skew),
		NotAfter:           notAfter,
		SignatureAlgorithm: x509.ECDSAWithSHA256,
		KeyUsage:           x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:        []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, i.crt, csr.PublicKey, i.key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("signing the certificate: %w", err)
	}
	return der, notAfter, nil
}

// ServiceAccountIdentity returns the identity Linkerd gives a Kubernetes
// service account: sa.namespace.serviceaccount.identity.controlNamespace.trustDomain.
func ServiceAccountIdentity(sa, namespace, controlNamespace, trustDomain string) string {
	return sa + "." + namespace + ".serviceaccount.identity." + controlNamespace + "." + trustDomain
}

// StaticTokens is a [TokenValidator] over a fixed table of tokens and the
// identities they prove.
type StaticTokens map[string]string

// Validate implements TokenValidator.
func (t StaticTokens) Validate(_ context.Context, token []byte) (string, error) {
	if id, ok := t[string(token)]; ok {
		return id, nil
	}
	return "", fmt.Errorf("%w: unknown token", ErrNotAuthenticated)
}

// Tokens is a [TokenValidator] over the entries of a tokens file
// (manifest.ParseTokens), replaced whole by each Set, as the file changes:
// each token proves its service account's identity under the control
// plane's namespace and trust domain. It is safe for concurrent use; its
// zero value is not usable.
type Tokens struct {
	controlNamespace, trustDomain string
	m                             atomic.Pointer[map[string]string]
}

// NewTokens returns Tokens with no entries yet, for identities under
// controlNamespace (Linkerd's default: linkerd) and trustDomain (default:
// cluster.local).
func NewTokens(controlNamespace, trustDomain string) *Tokens {
	t := &Tokens{controlNamespace: controlNamespace, trustDomain: trustDomain}
	t.m.Store(&map[string]string{})
	return t
}

// Set replaces the entries.
func (t *Tokens) Set(entries []manifest.Token) {
	m := make(map[string]string, len(entries))
	for _, e := range entries {
		m[e.Token] = ServiceAccountIdentity(e.ServiceAccount, e.Namespace, t.controlNamespace, t.trustDomain)
	}
	t.m.Store(&m)
}

// Validate implements TokenValidator: a token not in the entries proves
// nothing (ErrNotAuthenticated).
func (t *Tokens) Validate(_ context.Context, token []byte) (string, error) {
	if id, ok := (*t.m.Load())[string(token)]; ok {
		return id, nil
	}
	return "", fmt.Errorf("%w: unknown token", ErrNotAuthenticated)
}
