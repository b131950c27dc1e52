// Package identityplane is the examples' identity plane: trust anchors and
// an issuer made in memory, Linkerd's Identity API served over TLS on a
// loopback listener, and workloads certified over that API with a token
// each, as a proxy in a pod obtains its own certificate.
package identityplane

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"google.golang.org/grpc"
	xcredentials "google.golang.org/grpc/experimental/credentials"
)

// ServiceName is the Identity API's own name, which its TLS certificate
// proves.
var ServiceName = controlplane.IdentityServiceName("linkerd", "cluster.local")

// certifyTimeout bounds the wait for a workload's first certificate.
const certifyTimeout = 10 * time.Second

// Option configures Start.
type Option func(*config)

type config struct {
	root, issuer string
	tokenDir     string
	log          *slog.Logger
}

// WithNames sets the common names of the root and intermediate
// certificates (default "inmesh example root" and "inmesh example issuer").
func WithNames(root, issuer string) Option {
	return func(c *config) { c.root, c.issuer = root, issuer }
}

// WithTokenDir sets the pattern of the temporary folder of the token files,
// as [os.MkdirTemp] takes it (default "inmesh-example-tokens").
func WithTokenDir(pattern string) Option {
	return func(c *config) { c.tokenDir = pattern }
}

// WithLogger sets the issuer's logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.log = l }
}

// Plane is a running identity plane. Stop it when done.
type Plane struct {
	anchors    *x509.CertPool
	anchorsPEM []byte
	addr       string
	tokens     string // the folder of the token files
	log        *slog.Logger
	srv        *grpc.Server
	served     chan struct{}

	mu       sync.Mutex
	sessions []*identity.Session // closed at Stop
	stop     sync.Once
}

// Start makes the trust anchors and the issuer, and serves the Identity API
// on 127.0.0.1. tokens maps each service account's token to the identity
// it proves (the embedded stand-in for Kubernetes' TokenReview).
func Start(tokens controlplane.StaticTokens, opts ...Option) (*Plane, error) {
	c := config{root: "inmesh example root", issuer: "inmesh example issuer", tokenDir: "inmesh-example-tokens"}
	for _, o := range opts {
		o(&c)
	}
	root, err := controlplane.NewRootCA(c.root, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	iss, err := root.NewIntermediate(c.issuer, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	issuer, err := controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key, tokens,
		controlplane.WithIssuerLogger(c.log))
	if err != nil {
		return nil, err
	}
	self, err := identity.NewLocal(ServiceName, anchors)
	if err != nil {
		return nil, err
	}
	if err := issuer.CertifyLocal(self); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", c.tokenDir)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := &Plane{anchors: anchors, anchorsPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.DER}),
		addr: lis.Addr().String(), tokens: dir, log: c.log,
		srv:    grpc.NewServer(grpc.Creds(xcredentials.NewTLSWithALPNDisabled(self.ServerConfig()))),
		served: make(chan struct{})}
	issuer.Register(p.srv)
	go func() { defer close(p.served); _ = p.srv.Serve(lis) }()
	return p, nil
}

// Addr returns the Identity API's address.
func (p *Plane) Addr() string { return p.addr }

// Anchors returns the trust anchors every certificate verifies against.
func (p *Plane) Anchors() *x509.CertPool { return p.anchors }

// Certify obtains a certificate for the identity name over the Identity
// API, as any workload does with [identity.Start], with token written to
// a token file, and keeps it renewed until ctx ends or the plane stops. A
// refused token, or no certificate within 10 seconds, is an error.
func (p *Plane) Certify(ctx context.Context, name, token string) (*identity.Local, error) {
	file := filepath.Join(p.tokens, token)
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		return nil, err
	}
	first, cancel := context.WithTimeout(ctx, certifyTimeout)
	defer cancel()
	s, err := identity.Start(first, identity.Config{Name: name, TrustAnchors: p.anchorsPEM, TokenFile: file,
		Addr: p.addr, ServerName: ServiceName}, identity.WithLogger(p.log))
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { s.Close() })
	p.mu.Lock()
	p.sessions = append(p.sessions, s)
	p.mu.Unlock()
	return s.Local(), nil
}

// Stop ends the renewals, stops serving the Identity API and removes the
// token files.
func (p *Plane) Stop() {
	p.stop.Do(func() {
		p.mu.Lock()
		sessions := p.sessions
		p.mu.Unlock()
		for _, s := range sessions {
			s.Close()
		}
		p.srv.Stop()
		<-p.served
		os.RemoveAll(p.tokens)
	})
}
