package identity_test

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
)

// A certificate that names the workload, certifies its key and chains to
// the anchors is still refused if peers would refuse it: a CA's, or one
// without server or client authentication. Linkerd's proxy checks a new
// certificate with its own clients' verifier before it serves it
// (linkerd/meshtls/src/creds/store.rs, Store::validate); installed, such a
// renewal would have every peer refuse the workload. The current
// certificate stays, and a peer's handshake still succeeds.
func TestSetCertificateRefusesALeafPeersRefuse(t *testing.T) {
	root, err := controlplane.NewRootCA("root.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("identity.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	issuer, err := controlplane.NewIssuer(anchors, [][]byte{iss.DER}, iss.Key, controlplane.StaticTokens{}, controlplane.WithIssuerLogger(quiet))
	require.NoError(t, err)
	server, err := identity.NewLocal(books, anchors)
	require.NoError(t, err)
	client, err := identity.NewLocal(authors, anchors)
	require.NoError(t, err)
	require.NoError(t, issuer.CertifyLocal(server))
	require.NoError(t, issuer.CertifyLocal(client))
	serial := server.Certificate().Leaf.SerialNumber.String()

	for _, tc := range []struct {
		name    string
		tamper  func(*x509.Certificate)
		wantErr error
	}{
		{"a CA's certificate", func(c *x509.Certificate) {
			c.BasicConstraintsValid, c.IsCA = true, true
			c.KeyUsage |= x509.KeyUsageCertSign
		}, identity.ErrCAAsLeaf},
		{"no server authentication", func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} }, identity.ErrUntrustedCrt},
		{"no client authentication", func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} }, identity.ErrUntrustedCrt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			tmpl := &x509.Certificate{
				SerialNumber: big.NewInt(now.UnixNano()),
				DNSNames:     []string{books},
				NotBefore:    now.Add(-time.Minute),
				NotAfter:     now.Add(30 * time.Minute),
				KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
				ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			}
			tc.tamper(tmpl)
			leaf, err := x509.CreateCertificate(rand.Reader, tmpl, iss.Cert, server.Certificate().Leaf.PublicKey, iss.Key)
			require.NoError(t, err)

			assert.ErrorIs(t, server.SetCertificate(leaf, [][]byte{iss.DER}), tc.wantErr)
			assert.Equal(t, serial, server.Certificate().Leaf.SerialNumber.String(), "the current certificate stays")

			sc, cc := net.Pipe()
			defer sc.Close()
			defer cc.Close()
			srv := tls.Server(sc, server.ServerConfig())
			go func() { _ = srv.Handshake() }()
			c := tls.Client(cc, client.ClientConfig(books))
			require.NoError(t, c.SetDeadline(time.Now().Add(timeout)))
			assert.NoError(t, c.Handshake(), "a peer still verifies the workload")
		})
	}
}
