// Package etcdtest starts a real etcd member, from etcd's embed package,
// for the tests of the control plane on etcd: its client URL is a port of
// 127.0.0.1 that the kernel picked, its data in the test's temporary
// directory. [StartCluster] and [NewCluster] start a cluster of several
// members (three for the failure tests, the fleet demo and the bench),
// one of which [Cluster.Kill] crashes.
package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Member is a running single-member etcd cluster.
type Member struct {
	Etcd *embed.Etcd
	// Endpoint is the client URL, such as "http://127.0.0.1:41234".
	Endpoint string
	// With StartTLS: the PEM files of the CA that signed the server's
	// certificate and of a client certificate and key it accepts.
	CAFile, CertFile, KeyFile string
}

// Start starts a single-member etcd cluster on ports of 127.0.0.1 that the
// kernel picks, stopped when the test ends.
func Start(t testing.TB) *Member { return start(t, false) }

// StartTLS starts a member as [Start] does whose client URL is https and
// requires a client certificate signed by the same CA.
func StartTLS(t testing.TB) *Member { return start(t, true) }

func start(t testing.TB, useTLS bool) *Member {
	t.Helper()
	cfg := embed.NewConfig()
	m := &Member{}
	scheme := "http"
	if useTLS {
		scheme = "https"
		dir := t.TempDir()
		serverCert, serverKey := writePKI(t, dir, m)
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: serverCert, KeyFile: serverKey, TrustedCAFile: m.CAFile, ClientCertAuth: true}
	}
	cfg.Dir = t.TempDir()
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	local := func(scheme string) []url.URL { return []url.URL{{Scheme: scheme, Host: "127.0.0.1:0"}} }
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = local(scheme), local(scheme)
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = local("http"), local("http")
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("etcdtest: starting etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcdtest: etcd not ready within 30s")
	}
	m.Etcd, m.Endpoint = e, scheme+"://"+e.Clients[0].Addr().String()
	return m
}

// writePKI writes a CA, a server certificate for 127.0.0.1 and a client
// certificate under it to dir, and returns the server's files.
func writePKI(t testing.TB, dir string, m *Member) (serverCert, serverKey string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	m.CAFile = writePEM(t, dir, "ca.crt", "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return writePEM(t, dir, name+".crt", "CERTIFICATE", der), writePEM(t, dir, name+".key", "PRIVATE KEY", keyDER)
	}
	serverCert, serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	m.CertFile, m.KeyFile = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return serverCert, serverKey
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
