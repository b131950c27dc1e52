// Package identityplane is the examples' identity plane: trust anchors and
// an issuer made in memory, Linkerd's Identity API served over TLS on a
// loopback listener, and workloads certified over that API with a token
// each, as a proxy in a pod obtains its own certificate.
package identityplane

import (
	"context"
	"crypto/x509"
	"fmt"
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
	anchors *x509.CertPool
	addr    string
	tokens  string // the folder of the token files
	srv     *grpc.Server
	served  chan struct{}

	ctx     context.Context // ends at Stop: the renewals' lifetime
	cancel  context.CancelFunc
	renewal sync.WaitGroup
	stop    sync.Once
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
	p := &Plane{anchors: anchors, addr: lis.Addr().String(), tokens: dir,
		srv:    grpc.NewServer(grpc.Creds(xcredentials.NewTLSWithALPNDisabled(self.ServerConfig()))),
		served: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	issuer.Register(p.srv)
	go func() { defer close(p.served); _ = p.srv.Serve(lis) }()
	return p, nil
}

// Addr returns the Identity API's address.
func (p *Plane) Addr() string { return p.addr }

// Anchors returns the trust anchors every certificate verifies against.
func (p *Plane) Anchors() *x509.CertPool { return p.anchors }

// Certify obtains a certificate for the identity name over the Identity
// API, with token written to a token file, and keeps it renewed until ctx
// ends or the plane stops. A refused token, or no certificate within 10
// seconds, is an error.
func (p *Plane) Certify(ctx context.Context, name, token string) (*identity.Local, error) {
	local, err := identity.NewLocal(name, p.anchors)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(p.tokens, token)
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("passthrough:///"+p.addr,
		grpc.WithTransportCredentials(local.TransportCredentials(ServiceName)))
	if err != nil {
		return nil, err
	}
	c := identity.NewCertifier(local, conn, file)
	first, cancel := context.WithTimeout(ctx, certifyTimeout)
	err = c.Certify(first)
	cancel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("no certificate for %s from the Identity API on %s: %w", name, p.addr, err)
	}
	renew, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(p.ctx, cancel)
	p.renewal.Add(1)
	go func() {
		defer p.renewal.Done()
		defer stop()
		defer cancel()
		defer conn.Close()
		t := time.NewTimer(identity.RefreshIn(time.Now(), local.Expiry(),
			identity.DefaultMinRefresh, identity.DefaultMaxRefresh))
		defer t.Stop()
		select {
		case <-renew.Done():
			return
		case <-t.C:
		}
		_ = c.Run(renew)
	}()
	return local, nil
}

// Stop ends the renewals, stops serving the Identity API and removes the
// token files.
func (p *Plane) Stop() {
	p.stop.Do(func() {
		p.cancel()
		p.renewal.Wait()
		p.srv.Stop()
		<-p.served
		os.RemoveAll(p.tokens)
	})
}
