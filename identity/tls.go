package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// ErrNoPeerCertificate is the error of a handshake in which the server
// presented no certificate.
var ErrNoPeerCertificate = errors.New("identity: the peer presented no certificate")

// ClientConfig returns the TLS configuration of a connection to the meshed
// server whose identity is server: SNI is server, the handshake succeeds
// only when the server's chain leads to the anchors and its leaf, valid
// now and not a CA's, carries server (as a DNS SAN, or as a URI SAN when
// server is a URI), and the local certificate is presented
// when the server asks for one (none before the first is installed).
// TLS 1.3 only, no ALPN, no session resumption: what Linkerd's proxy sends
// and accepts. Each handshake takes the certificate current at that moment.
//
// A local certificate that has expired is presented to no one: the
// handshake fails with [ErrExpired], naming the expiry, where Linkerd's
// proxy presents its expired certificate and the server refuses it. Either
// way a workload whose certificate expired makes no meshed connection, as
// it accepts none (its server side presents the expired certificate,
// which clients refuse), rather than going on as a client without an
// identity.
func (l *Local) ClientConfig(server string) *tls.Config {
	return l.clientConfig(server, l.clientCertificate)
}

// ClientConfigFor is [Local.ClientConfig] for a server whose TLS server
// name differs from its identity (discovery's server_name, a DNS name for
// a URI identity): SNI is serverName, and the server must prove server.
// An empty serverName is server.
func (l *Local) ClientConfigFor(server, serverName string) *tls.Config {
	cfg := l.clientConfig(server, l.clientCertificate)
	if serverName != "" {
		cfg.ServerName = serverName
	}
	return cfg
}

func (l *Local) clientConfig(server string, cert func(*tls.CertificateRequestInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		ServerName:             server,
		InsecureSkipVerify:     true, // VerifyConnection checks chain and identity
		VerifyConnection:       func(cs tls.ConnectionState) error { return l.verifyServer(cs, server) },
		GetClientCertificate:   cert,
		SessionTicketsDisabled: true,
	}
}

// ServerConfig returns the TLS configuration of the local identity's
// server side: it presents the current certificate (a handshake before the
// first is installed fails), asks for a client certificate and verifies one
// against the anchors when given (a CA's is refused), and admits clients
// without one (port
// policy decides later what they may do). TLS 1.3 only, no ALPN.
func (l *Local) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		GetCertificate:         l.serverCertificate,
		ClientAuth:             tls.VerifyClientCertIfGiven,
		ClientCAs:              l.anchors,
		VerifyConnection:       verifyClient,
		SessionTicketsDisabled: true,
	}
}

// verifyClient refuses a client whose certificate, verified against the
// anchors, is a CA's: it proves no workload identity.
func verifyClient(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) > 0 && cs.PeerCertificates[0].IsCA {
		return ErrCAAsLeaf
	}
	return nil
}

func (l *Local) serverCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := l.Certificate(); c != nil {
		return c, nil
	}
	return nil, ErrNotReady
}

// clientCertificate presents the current certificate, none before the
// first; an expired one fails the handshake (see ClientConfig).
func (l *Local) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	c := l.cert.Load()
	if c == nil {
		return &tls.Certificate{}, nil // no certificate to send
	}
	if l.now().After(c.notAfter) {
		return nil, fmt.Errorf("%w: the local certificate expired at %s and has not been renewed",
			ErrExpired, c.notAfter.UTC().Format(time.RFC3339))
	}
	return c.tls, nil
}

// controlCertificate presents the current certificate while it is valid,
// and none once it has expired: the connections to the control plane
// (the Identity service's among them) go on without one, so that an
// identity whose certificate expired can still be renewed.
func (l *Local) controlCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if c := l.cert.Load(); c != nil && !l.now().After(c.notAfter) {
		return c.tls, nil
	}
	return &tls.Certificate{}, nil // no certificate to send
}

// IdentityError is the error of a handshake that did not prove the server
// to be the identity expected: its chain does not lead to the anchors, its
// leaf does not carry the identity, or the handshake failed before that
// could be checked (a server refuses a ClientHello for a name it is not).
type IdentityError struct {
	// Expected is the server identity the client required.
	Expected string
	// Presented is the identity of the certificate the server presented
	// ([PeerIdentity]), verified or not; empty when the handshake failed
	// before it showed one.
	Presented string
	Err       error
}

func (e *IdentityError) Error() string {
	if e.Presented != "" {
		return fmt.Sprintf("identity: cannot verify the server as %s: it presented %s: %v", e.Expected, e.Presented, e.Err)
	}
	if errors.Is(e.Err, ErrExpired) {
		return fmt.Sprintf("identity: no meshed connection to %s: %v", e.Expected, e.Err)
	}
	return fmt.Sprintf("identity: cannot verify the server as %s: %v", e.Expected, e.Err)
}

func (e *IdentityError) Unwrap() error { return e.Err }

func (l *Local) verifyServer(cs tls.ConnectionState, server string) error {
	if len(cs.PeerCertificates) == 0 {
		return &IdentityError{Expected: server, Err: ErrNoPeerCertificate}
	}
	leaf := cs.PeerCertificates[0]
	presented := PeerIdentity(leaf)
	if presented == "" && len(leaf.DNSNames) > 0 {
		presented = fmt.Sprintf("%q", leaf.DNSNames)
	}
	if leaf.IsCA {
		return &IdentityError{Expected: server, Presented: presented, Err: ErrCAAsLeaf}
	}
	if now := l.now(); now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return &IdentityError{Expected: server, Presented: presented, Err: fmt.Errorf("%w (valid %s to %s)", ErrExpired,
			leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))}
	}
	pool := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		pool.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: l.anchors, Intermediates: pool, CurrentTime: l.now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return &IdentityError{Expected: server, Presented: presented, Err: fmt.Errorf("%w: %v", ErrUntrustedCrt, err)}
	}
	if err := verifyName(leaf, server); err != nil {
		return &IdentityError{Expected: server, Presented: presented, Err: err}
	}
	return nil
}

// Peer is what a connection's TLS says of the other side.
type Peer struct {
	// TLS is true when the connection is meshed TLS terminated here.
	TLS bool
	// ID is the peer's verified identity; empty when it presented no
	// certificate (or the connection is not TLS).
	ID string
}

// PeerFromState returns the peer of a TLS connection whose handshake
// verified the peer's certificate chain (VerifiedChains set).
func PeerFromState(cs *tls.ConnectionState) Peer {
	if cs == nil || !cs.HandshakeComplete {
		return Peer{}
	}
	p := Peer{TLS: true}
	if len(cs.VerifiedChains) > 0 && len(cs.PeerCertificates) > 0 {
		p.ID = PeerIdentity(cs.PeerCertificates[0])
	}
	return p
}

type peerKey struct{}

// WithPeer returns a context carrying p, for the handlers of a request.
func WithPeer(ctx context.Context, p Peer) context.Context {
	return context.WithValue(ctx, peerKey{}, p)
}

// PeerFromContext returns the peer that [WithPeer] put in ctx, and whether
// there was one.
func PeerFromContext(ctx context.Context) (Peer, bool) {
	p, ok := ctx.Value(peerKey{}).(Peer)
	return p, ok
}
