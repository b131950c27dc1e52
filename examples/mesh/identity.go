package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"google.golang.org/grpc"
	xcredentials "google.golang.org/grpc/experimental/credentials"
)

// The peers' identities, as Linkerd names service accounts' workloads.
var (
	booksID   = controlplane.ServiceAccountIdentity("books", "default", "linkerd", "cluster.local")
	webID     = controlplane.ServiceAccountIdentity("web", "default", "linkerd", "cluster.local")
	reviewsID = controlplane.ServiceAccountIdentity("reviews", "default", "linkerd", "cluster.local")
)

// identities is the demo's identity plane: trust anchors and an issuer
// made in memory, Linkerd's Identity API served over TLS on loopback, and
// one certified identity per peer, each obtained over that API with a
// token, as a proxy in a pod obtains its own.
type identities struct {
	anchors *x509.CertPool
	addr    string
	stop    func()
	tokens  string // the folder of the peers' token files
}

func startIdentities(ctx context.Context) (*identities, error) {
	root, err := controlplane.NewRootCA("inmesh demo root", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	iss, err := root.NewIntermediate("inmesh demo issuer", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	// The token of each service account proves its identity (the embedded
	// stand-in for Kubernetes' TokenReview).
	issuer, err := controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key,
		controlplane.StaticTokens{"books-token": booksID, "web-token": webID, "reviews-token": reviewsID})
	if err != nil {
		return nil, err
	}
	self, err := identity.NewLocal(controlplane.IdentityServiceName("linkerd", "cluster.local"), anchors)
	if err != nil {
		return nil, err
	}
	if err := issuer.CertifyLocal(self); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.Creds(xcredentials.NewTLSWithALPNDisabled(self.ServerConfig())))
	issuer.Register(srv)
	go srv.Serve(lis)
	dir, err := os.MkdirTemp("", "inmesh-demo-tokens")
	if err != nil {
		srv.Stop()
		return nil, err
	}
	return &identities{anchors: anchors, addr: lis.Addr().String(), tokens: dir,
		stop: func() { srv.Stop(); os.RemoveAll(dir) }}, nil
}

// certify obtains the identity name over the Identity API with token, and
// keeps it renewed until ctx ends.
func (ids *identities) certify(ctx context.Context, name, token string) (*identity.Local, error) {
	local, err := identity.NewLocal(name, ids.anchors)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(ids.tokens, token)
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("passthrough:///"+ids.addr,
		grpc.WithTransportCredentials(local.TransportCredentials(controlplane.IdentityServiceName("linkerd", "cluster.local"))))
	if err != nil {
		return nil, err
	}
	c := identity.NewCertifier(local, conn, file)
	go func() {
		_ = c.Run(ctx)
		conn.Close()
	}()
	select {
	case <-local.Ready():
		return local, nil
	case <-time.After(10 * time.Second):
		return nil, fmt.Errorf("no certificate for %s", name)
	}
}
