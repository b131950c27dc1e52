package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"time"
)

// CA is a certificate authority of a mesh's trust chain: a trust anchor or
// an issuer under it, with an ECDSA P-256 key, as Linkerd makes them. It
// lets a demo or a test run the embedded issuer without openssl.
type CA struct {
	Cert *x509.Certificate
	DER  []byte
	Key  *ecdsa.PrivateKey
}

// NewRootCA returns a new self-signed trust anchor named name, valid for
// lifetime from now.
func NewRootCA(name string, lifetime time.Duration) (*CA, error) {
	return newCA(name, lifetime, nil)
}

// NewIntermediate returns a new issuer CA named name signed by ca, valid for
// lifetime from now (never past ca's own expiry).
func (ca *CA) NewIntermediate(name string, lifetime time.Duration) (*CA, error) {
	return newCA(name, lifetime, ca)
}

func newCA(name string, lifetime time.Duration, parent *CA) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	signer, signKey := tmpl, key
	if parent != nil {
		signer, signKey = parent.Cert, parent.Key
		if tmpl.NotAfter.After(parent.Cert.NotAfter) {
			tmpl.NotAfter = parent.Cert.NotAfter
		}
		tmpl.MaxPathLenZero = true
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signKey)
	if err != nil {
		return nil, fmt.Errorf("controlplane: making CA %s: %w", name, err)
	}
	crt, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: crt, DER: der, Key: key}, nil
}
