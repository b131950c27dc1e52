package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"google.golang.org/grpc"
	xcredentials "google.golang.org/grpc/experimental/credentials"
)

// The workloads' identities, as Linkerd names service accounts.
var (
	serverID = controlplane.ServiceAccountIdentity("interop", "default", "linkerd", "cluster.local")
	clientID = controlplane.ServiceAccountIdentity("web", "default", "linkerd", "cluster.local")
)

// identityName is the Identity API's own name, which its TLS certificate
// proves.
var identityName = controlplane.IdentityServiceName("linkerd", "cluster.local")

// identities is the example's identity plane: trust anchors and an issuer
// made in memory, Linkerd's Identity API served over TLS on loopback, and
// the workloads' certificates obtained over that API with a token each.
type identities struct {
	anchors *x509.CertPool
	addr    string
	tokens  string // the folder of the token files
	stop    func()
}

func startIdentities(log *slog.Logger) (*identities, error) {
	root, err := controlplane.NewRootCA("inmesh grpc example root", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	iss, err := root.NewIntermediate("inmesh grpc example issuer", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	// A service account's token proves its identity (the embedded stand-in
	// for Kubernetes' TokenReview).
	issuer, err := controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key,
		controlplane.StaticTokens{"interop-token": serverID, "web-token": clientID},
		controlplane.WithIssuerLogger(log))
	if err != nil {
		return nil, err
	}
	self, err := identity.NewLocal(identityName, anchors)
	if err != nil {
		return nil, err
	}
	if err := issuer.CertifyLocal(self); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "inmesh-grpc-tokens")
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	srv := grpc.NewServer(grpc.Creds(xcredentials.NewTLSWithALPNDisabled(self.ServerConfig())))
	issuer.Register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	return &identities{anchors: anchors, addr: lis.Addr().String(), tokens: dir,
		stop: func() { srv.Stop(); <-done; os.RemoveAll(dir) }}, nil
}

// certify obtains a certificate for name over the Identity API with token
// and keeps it renewed until ctx ends; wait waits for the renewal loop to
// end.
func (ids *identities) certify(ctx context.Context, name, token string) (local *identity.Local, wait func(), err error) {
	local, err = identity.NewLocal(name, ids.anchors)
	if err != nil {
		return nil, nil, err
	}
	file := filepath.Join(ids.tokens, token)
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		return nil, nil, err
	}
	conn, err := grpc.NewClient("passthrough:///"+ids.addr,
		grpc.WithTransportCredentials(local.TransportCredentials(identityName)))
	if err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = identity.NewCertifier(local, conn, file).Run(ctx)
		conn.Close()
	}()
	wait = func() { <-done }
	select {
	case <-local.Ready():
		return local, wait, nil
	case <-time.After(10 * time.Second):
		return nil, wait, fmt.Errorf("no certificate for %s from the Identity API on %s", name, ids.addr)
	}
}
