package origproto

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/proxyapi/identitypb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// needTool skips a test whose real client is missing, and fails it in CI,
// where .ci/run installs it.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed", name)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}

// curl and openssl s_client, as meshed clients with a certificate of the
// mesh, reach the inbound port's mTLS: the server's certificate chains to
// the anchors and carries its identity as a DNS SAN (openssl verifies the
// name), and the application sees curl's identity in l5d-client-id.
func TestMeshTLSWithRealClients(t *testing.T) {
	server, _, _, issuer, root := certifiedPairWithIssuer(t)
	addr := meshTLSServer(t, server)
	_, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()

	// A client certificate for authors, with a key curl can read.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{authorsID}}, key)
	require.NoError(t, err)
	resp, err := issuer.Certify(context.Background(), &identitypb.CertifyRequest{Identity: authorsID, Token: []byte("a"), CertificateSigningRequest: csr})
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	write := func(name string, blocks ...*pem.Block) string {
		var b []byte
		for _, blk := range blocks {
			b = append(b, pem.EncodeToMemory(blk)...)
		}
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	ca := write("ca.pem", &pem.Block{Type: "CERTIFICATE", Bytes: root.DER})
	crt := write("client.pem", &pem.Block{Type: "CERTIFICATE", Bytes: resp.LeafCertificate},
		&pem.Block{Type: "CERTIFICATE", Bytes: resp.IntermediateCertificates[0]})
	keyFile := write("client.key", &pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	issuerPEM := write("issuer.pem", &pem.Block{Type: "CERTIFICATE", Bytes: resp.IntermediateCertificates[0]})

	t.Run("curl", func(t *testing.T) {
		curl := needTool(t, "curl")
		out, err := exec.Command(curl, "-sS", "--max-time", "10", "-D", "-", "-o", "/dev/null",
			"--cacert", ca, "--cert", crt, "--key", keyFile,
			"--resolve", booksID+":"+port+":127.0.0.1", "https://"+booksID+":"+port+"/").CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Contains(t, strings.ToLower(string(out)), "x-seen: http/1.1|"+authorsID+"|tls")
	})
	t.Run("openssl", func(t *testing.T) {
		openssl := needTool(t, "openssl")
		cmd := exec.Command(openssl, "s_client", "-connect", addr, "-servername", booksID, "-tls1_3",
			"-CAfile", ca, "-verify_return_error", "-verify_hostname", booksID, "-cert", crt, "-cert_chain", issuerPEM, "-key", keyFile, "-quiet")
		cmd.Stdin = strings.NewReader("GET / HTTP/1.1\r\nHost: books\r\nConnection: close\r\n\r\n")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Contains(t, string(out), "verify return:1")
		assert.Contains(t, string(out), "X-Seen: HTTP/1.1|"+authorsID+"|tls")
	})
}
