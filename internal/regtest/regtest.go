// Package regtest starts an embedded control plane that serves the
// Registration API over mTLS (and every API in plaintext), with its own
// trust anchor and issuer, for the tests of registration and of the
// stacks that register. Tests only.
package regtest

import (
	"context"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	xcredentials "google.golang.org/grpc/experimental/credentials"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/proxyapi/identitypb"
	"github.com/inmesh/inmesh/registration"
)

// Identities of the workloads of [Manifests].
const (
	BooksID   = "books.default.serviceaccount.identity.linkerd.cluster.local"
	WebID     = "web.default.serviceaccount.identity.linkerd.cluster.local"
	ReviewsID = "reviews.default.serviceaccount.identity.linkerd.cluster.local"
)

// Manifests bind the Services to identities: books:7000 to the books
// service account through its selector and Pod; reviews:9000 to web's
// identity through its annotation alone.
const Manifests = `
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec: {selector: {app: books}, ports: [{name: http, port: 7000}]}
---
apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: default, labels: {app: books}}
spec: {serviceAccountName: books, containers: [{name: app}]}
---
apiVersion: v1
kind: Service
metadata:
  name: reviews
  namespace: default
  annotations: {inmesh.io/registration-identities: "web.default.serviceaccount.identity.linkerd.cluster.local"}
spec: {ports: [{name: http, port: 9000}]}
`

// ControlPlane is a running control plane.
type ControlPlane struct {
	Store  *controlplane.Store
	Server *controlplane.Server
	// Name is the control plane's identity, which registrants verify.
	Name    string
	Anchors *x509.CertPool
	issuer  *controlplane.Issuer
	// TLSAddr serves every API over TLS that verifies client
	// certificates against Anchors; Addr serves them in plaintext.
	TLSAddr, Addr string
}

// Start starts a control plane serving manifests (YAML) until the test
// ends.
func Start(t testing.TB, manifests string, opts ...controlplane.Option) *ControlPlane {
	t.Helper()
	return StartOn(t, "127.0.0.1:0", manifests, opts...)
}

// StartOn starts a control plane as [Start] does whose plaintext listener
// is addr.
func StartOn(t testing.TB, addr, manifests string, opts ...controlplane.Option) *ControlPlane {
	t.Helper()
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("issuer", time.Hour)
	require.NoError(t, err)
	c := &ControlPlane{Store: controlplane.NewStore(), Anchors: x509.NewCertPool(),
		Name: controlplane.IdentityServiceName("linkerd", "cluster.local")}
	c.Anchors.AddCert(root.Cert)
	c.issuer, err = controlplane.NewIssuer(c.Anchors, [][]byte{iss.DER}, iss.Key, anyToken{})
	require.NoError(t, err)
	if manifests != "" {
		r, err := manifest.LoadFiles(manifest.File{Name: "manifests.yaml", Data: []byte(manifests)})
		require.NoError(t, err)
		c.Store.SetManifests(r)
	}
	c.Server = controlplane.NewServer(c.Store, opts...)
	self := c.Certify(t, c.Name)
	// Served as the control-plane program serves them.
	keep := controlplane.KeepaliveOptions(time.Minute)
	tlsSrv := grpc.NewServer(append(keep, grpc.Creds(xcredentials.NewTLSWithALPNDisabled(self.ServerConfig())))...)
	plain := grpc.NewServer(keep...)
	c.TLSAddr = serve(t, tlsSrv, c.Server, "127.0.0.1:0")
	c.Addr = serve(t, plain, c.Server, addr)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Server.Shutdown(ctx)
		tlsSrv.Stop()
		plain.Stop()
	})
	return c
}

func serve(t testing.TB, srv *grpc.Server, s *controlplane.Server, addr string) string {
	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	s.Register(srv)
	go func() { _ = srv.Serve(s.Listener(lis)) }()
	return lis.Addr().String()
}

// anyToken proves the identity the token names.
type anyToken struct{}

func (anyToken) Validate(_ context.Context, token []byte) (string, error) { return string(token), nil }

// Certify returns a local identity name with a certificate of the control
// plane's issuer.
func (c *ControlPlane) Certify(t testing.TB, name string) *identity.Local {
	t.Helper()
	l, err := identity.NewLocal(name, c.Anchors)
	require.NoError(t, err)
	resp, err := c.issuer.Certify(context.Background(), &identitypb.CertifyRequest{
		Identity: name, Token: []byte(name), CertificateSigningRequest: l.CSR()})
	require.NoError(t, err)
	require.NoError(t, l.SetCertificate(resp.LeafCertificate, resp.IntermediateCertificates))
	return l
}

// Dial returns a connection to the Registration API: over mTLS as local,
// or in plaintext when local is nil. It is closed when the test ends.
func (c *ControlPlane) Dial(t testing.TB, local *identity.Local) *grpc.ClientConn {
	t.Helper()
	addr := c.TLSAddr
	if local == nil {
		addr = c.Addr
	}
	conn, err := registration.Dial(addr, local, c.Name)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}
