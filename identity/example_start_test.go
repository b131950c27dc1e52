package identity_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"google.golang.org/grpc"
	xcredentials "google.golang.org/grpc/experimental/credentials"
)

// A workload joins the mesh's identity in one call. Here the Identity
// service is inmesh's embedded issuer on loopback; in a cluster it is
// Linkerd's identity controller, and [identity.FromEnv] gives the
// Config's values.
func ExampleStart() {
	booksID := controlplane.ServiceAccountIdentity("books", "default", "linkerd", "cluster.local")

	// The mesh's side: a trust anchor, an issuer under it, and the Identity
	// API over TLS with the service's own identity.
	root, _ := controlplane.NewRootCA("example root", time.Hour)
	inter, _ := root.NewIntermediate("example issuer", time.Hour)
	anchorsPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.DER})
	anchors, _ := identity.ParseAnchors(anchorsPEM)
	issuer, _ := controlplane.NewIssuer(anchors, [][]byte{inter.DER}, inter.Key,
		controlplane.StaticTokens{"books-token": booksID})
	svc, _ := identity.NewLocal(identity.DefaultServiceName, anchors)
	_ = issuer.CertifyLocal(svc)
	srv := grpc.NewServer(grpc.Creds(xcredentials.NewTLSWithALPNDisabled(svc.ServerConfig())))
	issuer.Register(srv)
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(lis)
	defer srv.Stop()
	dir, _ := os.MkdirTemp("", "identity-example")
	defer os.RemoveAll(dir)
	tokenFile := filepath.Join(dir, "books.token")
	_ = os.WriteFile(tokenFile, []byte("books-token"), 0o600)

	// The workload's side: one call, and the identity is certified and
	// kept renewed until Close.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := identity.Start(ctx, identity.Config{
		Name:         booksID,
		TrustAnchors: anchorsPEM,
		TokenFile:    tokenFile,
		Addr:         lis.Addr().String(),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer id.Close()
	// id.Local() goes to mesh.WithIdentity and meshgrpc.WithIdentity.
	leaf := id.Local().Certificate().Leaf
	fmt.Println("certified:", id.Local().Name())
	fmt.Println("certificate names:", leaf.DNSNames)
	fmt.Println("issued by:", leaf.Issuer.CommonName)
	// Output:
	// certified: books.default.serviceaccount.identity.linkerd.cluster.local
	// certificate names: [books.default.serviceaccount.identity.linkerd.cluster.local]
	// issued by: example issuer
}
