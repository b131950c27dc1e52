package identityplane

import (
	"crypto/x509"
	"log/slog"
	"os"
	"testing"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	booksID = controlplane.ServiceAccountIdentity("books", "default", "linkerd", "cluster.local")
	webID   = controlplane.ServiceAccountIdentity("web", "default", "linkerd", "cluster.local")
)

// Each workload gets a certificate for its own name, chained to the
// plane's anchors; a token proves one service account only.
func TestCertify(t *testing.T) {
	p, err := Start(controlplane.StaticTokens{"books-token": booksID, "web-token": webID},
		WithNames("test root", "test issuer"), WithTokenDir("identityplane-test"),
		WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	tokens := p.tokens
	defer func() {
		p.Stop()
		_, err := os.Stat(tokens)
		assert.True(t, os.IsNotExist(err), "Stop removes the token files: %v", err)
	}()
	ctx := t.Context()

	for _, tc := range []struct{ name, token string }{{booksID, "books-token"}, {webID, "web-token"}} {
		local, err := p.Certify(ctx, tc.name, tc.token)
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.name, local.Name())
		cert := local.Certificate()
		require.NotNil(t, cert, tc.name)
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		require.NoError(t, err)
		assert.Equal(t, []string{tc.name}, leaf.DNSNames)
		inter := x509.NewCertPool()
		for _, der := range cert.Certificate[1:] {
			c, err := x509.ParseCertificate(der)
			require.NoError(t, err)
			inter.AddCert(c)
		}
		_, err = leaf.Verify(x509.VerifyOptions{Roots: p.Anchors(), Intermediates: inter,
			DNSName: tc.name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		assert.NoError(t, err, "%s verifies against the anchors", tc.name)
	}

	// books' token does not prove web's identity.
	_, err = p.Certify(ctx, webID, "books-token")
	require.Error(t, err)
	assert.Equal(t, codes.FailedPrecondition, status.Code(err), "refused by the issuer: %v", err)
	assert.Contains(t, err.Error(), "requested identity did not match provided token")
	assert.Contains(t, err.Error(), webID)
}
