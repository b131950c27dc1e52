package identity

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors of a certificate that [Local.SetCertificate] refuses.
var (
	ErrNotReady     = errors.New("identity: no certificate yet")
	ErrWrongName    = errors.New("identity: certificate does not carry the identity")
	ErrWrongKey     = errors.New("identity: certificate is not for the local key")
	ErrExpired      = errors.New("identity: certificate is expired or not yet valid")
	ErrInvalidName  = errors.New("identity: invalid identity name")
	ErrNoAnchors    = errors.New("identity: no trust anchors")
	ErrUntrustedCrt = errors.New("identity: certificate does not chain to the trust anchors")
	ErrCAAsLeaf     = errors.New("identity: the peer's certificate is a CA's, not a workload's")
)

// Local is the identity of this process: its name, its private key, the
// certificate signing request for both, and the current certificate once
// one is installed. It is safe for concurrent use.
type Local struct {
	name    string
	anchors *x509.CertPool
	key     *ecdsa.PrivateKey
	csr     []byte
	now     func() time.Time

	cert      atomic.Pointer[current]
	readyOnce sync.Once
	ready     chan struct{}
}

// current is an installed certificate: the chain presented in handshakes
// and when it expires.
type current struct {
	tls      *tls.Certificate
	notAfter time.Time
	serial   string
}

// NewLocal returns the local identity name, trusting the certificates of
// anchors: a new ECDSA P-256 key and a signing request whose subject
// common name and one DNS SAN are name, as Linkerd's proxy requests them.
// name must be a DNS-like identity (lower-case labels, no trailing dot).
func NewLocal(name string, anchors *x509.CertPool) (*Local, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if anchors == nil {
		return nil, ErrNoAnchors
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generating a key: %w", err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: name},
		DNSNames: []string{name},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("identity: making the signing request: %w", err)
	}
	return &Local{name: name, anchors: anchors, key: key, csr: csr, now: time.Now, ready: make(chan struct{})}, nil
}

// CheckName returns an error unless name is a DNS-like identity as Linkerd
// names workloads: dot-separated labels of lower-case letters, digits and
// hyphens, neither starting nor ending with a hyphen, no trailing dot, at
// most 253 bytes.
func CheckName(name string) error {
	if name == "" || len(name) > 253 || strings.HasSuffix(name, ".") {
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("%w: %q", ErrInvalidName, name)
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
				return fmt.Errorf("%w: %q", ErrInvalidName, name)
			}
		}
	}
	return nil
}

// Name returns the identity's name.
func (l *Local) Name() string { return l.name }

// Anchors returns the trust anchors.
func (l *Local) Anchors() *x509.CertPool { return l.anchors }

// CSR returns the certificate signing request, DER. It is the same for
// every renewal.
func (l *Local) CSR() []byte { return l.csr }

// Ready is closed once the first certificate is installed.
func (l *Local) Ready() <-chan struct{} { return l.ready }

// Wait returns once the first certificate is installed, or with an error
// wrapping [ErrNotReady] and ctx's error when ctx ends first. The meshed
// clients wait for it before a handshake: a connection made without the
// certificate would stay anonymous for as long as it is pooled.
func (l *Local) Wait(ctx context.Context) error {
	select {
	case <-l.ready:
		return nil
	default:
	}
	select {
	case <-l.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w for %s: %w", ErrNotReady, l.name, context.Cause(ctx))
	}
}

// Certificate returns the chain presented in handshakes, nil before the
// first certificate is installed.
func (l *Local) Certificate() *tls.Certificate {
	if c := l.cert.Load(); c != nil {
		return c.tls
	}
	return nil
}

// Expiry returns when the current certificate expires, zero before the
// first one.
func (l *Local) Expiry() time.Time {
	if c := l.cert.Load(); c != nil {
		return c.notAfter
	}
	return time.Time{}
}

// SetCertificate installs leaf (DER) with the intermediates between it and
// the anchors (DER, issuer first) as the current certificate, once it is
// verified as the peers verify it: the leaf is a workload's (not a CA's),
// valid now, for server and client authentication, and chains to an
// anchor; it carries the identity's name as a DNS SAN and certifies the
// local key. A refused certificate leaves the current one in place.
func (l *Local) SetCertificate(leaf []byte, intermediates [][]byte) error {
	crt, err := x509.ParseCertificate(leaf)
	if err != nil {
		return fmt.Errorf("identity: parsing the leaf: %w", err)
	}
	pool := x509.NewCertPool()
	chain := [][]byte{leaf}
	certs := []*x509.Certificate{crt}
	for i, der := range intermediates {
		ic, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("identity: parsing intermediate %d: %w", i, err)
		}
		pool.AddCert(ic)
		chain = append(chain, der)
		certs = append(certs, ic)
	}
	// The chain must be one the peers accept, as Linkerd's proxy checks a
	// new certificate with its own clients' verifier before it serves it
	// (linkerd/meshtls/src/creds/store.rs, Store::validate): a
	// workload's leaf (no CA) within its validity, of this identity, up
	// to the anchors for server authentication; and, since this identity
	// is the workload's as a client too, for client authentication as a
	// peer's server verifies it. Anything else is refused and the current
	// certificate kept: installed, it would have every peer refuse this
	// workload.
	if err := l.verifyServer(tls.ConnectionState{PeerCertificates: certs}, l.name); err != nil {
		var ie *IdentityError
		if errors.As(err, &ie) {
			return ie.Err
		}
		return err
	}
	if _, err := crt.Verify(x509.VerifyOptions{
		Roots: l.anchors, Intermediates: pool, CurrentTime: l.now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return fmt.Errorf("%w: %v", ErrUntrustedCrt, err)
	}
	if pub, ok := crt.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(l.key.Public()) {
		return ErrWrongKey
	}
	l.cert.Store(&current{
		tls:      &tls.Certificate{Certificate: chain, PrivateKey: crypto.Signer(l.key), Leaf: crt},
		notAfter: crt.NotAfter,
		serial:   crt.SerialNumber.String(),
	})
	l.readyOnce.Do(func() { close(l.ready) })
	return nil
}

// verifyName returns ErrWrongName unless crt carries name: as a DNS SAN,
// or as a URI SAN when name is a URI identity rather than a DNS-like one
// (a SPIFFE identity, as Linkerd's destination controller gives an
// external workload, or any other URI, urn: included), as Linkerd's proxy
// parses the identity it expects (linkerd/identity/src/lib.rs,
// Id::from_str).
func verifyName(crt *x509.Certificate, name string) error {
	if isURI(name) {
		for _, u := range crt.URIs {
			if u.String() == name {
				return nil
			}
		}
		return fmt.Errorf("%w %q (its URIs: %q)", ErrWrongName, name, crt.URIs)
	}
	for _, n := range crt.DNSNames {
		if n == name {
			return nil
		}
	}
	return fmt.Errorf("%w %q (its DNS names: %q)", ErrWrongName, name, crt.DNSNames)
}

// ParseID parses s as an identity the way Linkerd's proxy parses one that
// an application names (linkerd/identity/src/lib.rs, Id::from_str, as
// linkerd/app/outbound/src/http/require_id_header.rs reads l5d-require-id):
// a DNS-like name valid as a peer certificate's DNS SAN is (see
// [PeerIdentity]), returned lowercased; otherwise a URI with a scheme,
// returned as it is. ok is false for anything else (an empty string, a
// name with a trailing dot, spaces).
func ParseID(s string) (id string, ok bool) {
	if id, ok := dnsIdentity(s); ok {
		return id, true
	}
	if uriIdentity(s) {
		return s, true
	}
	return "", false
}

// uriIdentity reports whether s is a URI identity: a URI with a scheme
// (spiffe://..., urn:..., ...), as Linkerd's proxy parses one
// (linkerd/identity/src/lib.rs, Id::parse_uri).
func uriIdentity(s string) bool {
	u, err := url.Parse(s)
	return err == nil && u.Scheme != "" && strings.TrimSpace(s) == s
}

// isURI reports whether an identity is a URI rather than a DNS-like name:
// Linkerd's proxy reads a name as a DNS name first, then as a URI.
func isURI(name string) bool {
	if _, ok := dnsIdentity(name); ok {
		return false
	}
	return uriIdentity(name)
}

// oidSubjectAltName is the object identifier of the subject alternative
// name extension (RFC 5280, 4.2.1.6).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// PeerIdentity returns the identity a verified peer certificate carries:
// its first subject alternative name, in the certificate's order, that is
// a DNS name Linkerd's proxy parses as an identity, in lower case, or a
// URI with a scheme (a SPIFFE identity, a urn:, ...); empty when there is
// none. As Linkerd's proxy
// reads a client's identity (linkerd2-proxy
// linkerd/meshtls/verifier/src/lib.rs, client_identity), a DNS name may
// have letters of either case and underscores, and one with a trailing
// dot, an empty or over-long label, a label starting or ending with a
// hyphen, or an all-digit last label is skipped.
//
// Only an all-ASCII name is lowercased, and DNS names do not differ by
// the case of their ASCII letters: the identity is the name the issuer
// signed. A server proves the identity a client expects only with exactly
// that name ([Local.ClientConfig]).
func PeerIdentity(crt *x509.Certificate) string {
	for _, ext := range crt.Extensions {
		if !ext.Id.Equal(oidSubjectAltName) {
			continue
		}
		var names asn1.RawValue
		if rest, err := asn1.Unmarshal(ext.Value, &names); err != nil || len(rest) > 0 || names.Tag != asn1.TagSequence {
			return ""
		}
		for rest := names.Bytes; len(rest) > 0; {
			var n asn1.RawValue
			var err error
			if rest, err = asn1.Unmarshal(rest, &n); err != nil {
				return ""
			}
			if n.Class != asn1.ClassContextSpecific {
				continue
			}
			switch name := string(n.Bytes); n.Tag {
			case 2: // dNSName
				if id, ok := dnsIdentity(name); ok {
					return id
				}
			case 6: // uniformResourceIdentifier; x509 parsed it already
				if uriIdentity(name) {
					return name
				}
			}
		}
	}
	return ""
}

// dnsIdentity returns the identity a DNS SAN names, as Linkerd's proxy
// parses one (linkerd2-proxy linkerd/identity/src/lib.rs,
// Id::parse_dns_name, over linkerd/dns/name/src/name.rs): at most 253
// bytes of dot-separated labels of 1 to 63 ASCII letters, digits, hyphens
// and underscores, none starting or ending with a hyphen, the last not all
// digits, and no trailing dot; lowercased. ok is false for anything else.
func dnsIdentity(name string) (id string, ok bool) {
	if name == "" || len(name) > 253 || name[len(name)-1] == '.' {
		return "", false
	}
	label := 0                      // length of the current label
	numeric, hyphen := false, false // the label is all digits; it ends with a hyphen
	upper := false
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '.':
			if label == 0 || hyphen {
				return "", false
			}
			label = 0
			continue
		case c == '-':
			if label == 0 {
				return "", false
			}
			numeric, hyphen = false, true
		case '0' <= c && c <= '9':
			if label == 0 {
				numeric = true
			}
			hyphen = false
		case 'A' <= c && c <= 'Z':
			upper = true
			numeric, hyphen = false, false
		case 'a' <= c && c <= 'z', c == '_':
			numeric, hyphen = false, false
		default:
			return "", false
		}
		if label++; label > 63 {
			return "", false
		}
	}
	if hyphen || numeric {
		return "", false
	}
	if !upper {
		return name, true
	}
	b := []byte(name)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b), true
}
