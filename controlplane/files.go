package controlplane

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/filestamp"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/manifest"
)

// The files of an identity directory ([LoadIdentityDir]).
const (
	TrustAnchorsFile = "ca.crt"     // the trust anchors, PEM
	IssuerCertFile   = "issuer.crt" // the issuer's certificate (and any beyond it toward the anchors), PEM
	IssuerKeyFile    = "issuer.key" // the issuer's private key, PEM (PKCS#8, SEC 1 or PKCS#1)
)

// IdentityDir is what an identity directory holds.
type IdentityDir struct {
	Anchors    *x509.CertPool
	AnchorsPEM []byte
	Chain      [][]byte // the issuer's certificate first, DER
	Key        crypto.Signer
}

// LoadIdentityDir reads the trust anchors, the issuer certificate and its
// key from dir. When dir holds none of the three files, a new trust anchor
// and an issuer under it are generated and written there first (created is
// then true), so that a demo needs no openssl; when it holds only some,
// that is an error naming the missing ones.
func LoadIdentityDir(dir string) (d *IdentityDir, created bool, err error) {
	names := []string{TrustAnchorsFile, IssuerCertFile, IssuerKeyFile}
	var missing []string
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n)); errors.Is(err, fs.ErrNotExist) {
			missing = append(missing, n)
		} else if err != nil {
			return nil, false, err
		}
	}
	switch len(missing) {
	case 0:
	case len(names):
		if created, err = generateIdentityDir(dir); err != nil {
			return nil, false, err
		}
		if !created {
			// Another process made it at the same moment: its files
			// follow its trust anchors at once.
			if err := waitForFiles(dir, names, 10*time.Second); err != nil {
				return nil, false, err
			}
		}
	default:
		// Another process may be linking them in right now (its files
		// aside are there meanwhile), or may just have finished.
		if making, _ := filepath.Glob(filepath.Join(dir, ".new-*")); len(making) > 0 {
			if err := waitForFiles(dir, names, 10*time.Second); err != nil {
				return nil, false, err
			}
		} else if waitForFiles(dir, names, 0) != nil {
			return nil, false, fmt.Errorf("controlplane: %s lacks %v (keep all three files, or none to have them made)", dir, missing)
		}
	}
	d = &IdentityDir{}
	if d.AnchorsPEM, err = os.ReadFile(filepath.Join(dir, TrustAnchorsFile)); err != nil {
		return nil, false, err
	}
	if d.Anchors, err = identity.ParseAnchors(d.AnchorsPEM); err != nil {
		return nil, false, fmt.Errorf("%s: %w", TrustAnchorsFile, err)
	}
	crtPEM, err := os.ReadFile(filepath.Join(dir, IssuerCertFile))
	if err != nil {
		return nil, false, err
	}
	for rest := crtPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			d.Chain = append(d.Chain, b.Bytes)
		}
	}
	if len(d.Chain) == 0 {
		return nil, false, fmt.Errorf("%s: no certificate", IssuerCertFile)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, IssuerKeyFile))
	if err != nil {
		return nil, false, err
	}
	if d.Key, err = parseKey(keyPEM); err != nil {
		return nil, false, fmt.Errorf("%s: %w", IssuerKeyFile, err)
	}
	return d, created, nil
}

func parseKey(data []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, errors.New("no PEM block")
	}
	var k any
	var err error
	switch b.Type {
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	default:
		k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	}
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("a %T key cannot sign", k)
	}
	return s, nil
}

// generateIdentityDir writes a new trust anchor (ten years) and an issuer
// under it (one year) to dir.
// generateIdentityDir makes a trust anchor and an issuer and puts their
// files in dir, unless another process does so at the same moment: the
// files are written aside and linked in, the trust anchors first, and only
// the process whose link of the trust anchors succeeds links the rest, so
// that replicas started together on one empty directory share one trust
// root. It reports whether this call made the files.
func generateIdentityDir(dir string) (bool, error) {
	root, err := NewRootCA("root.linkerd.cluster.local", 10*365*24*time.Hour)
	if err != nil {
		return false, err
	}
	iss, err := root.NewIntermediate("identity.linkerd.cluster.local", 365*24*time.Hour)
	if err != nil {
		return false, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(iss.Key)
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	aside, err := os.MkdirTemp(dir, ".new-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(aside)
	files := []struct {
		name, typ string
		der       []byte
		mode      os.FileMode
	}{
		{TrustAnchorsFile, "CERTIFICATE", root.DER, 0o644},
		{IssuerCertFile, "CERTIFICATE", iss.DER, 0o644},
		{IssuerKeyFile, "PRIVATE KEY", keyDER, 0o600},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(aside, f.name), pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), f.mode); err != nil {
			return false, err
		}
	}
	for i, f := range files {
		err := os.Link(filepath.Join(aside, f.name), filepath.Join(dir, f.name))
		if i == 0 && errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

// waitForFiles waits up to d for every one of names to be in dir.
func waitForFiles(dir string, names []string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		var missing []string
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("controlplane: %s lacks %v: another process began to make them and did not finish", dir, missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// IdentityServiceName is the identity of the Identity service itself, as
// Linkerd names it: linkerd-identity.NS.serviceaccount.identity.NS.TRUSTDOMAIN.
func IdentityServiceName(controlNamespace, trustDomain string) string {
	return ServiceAccountIdentity("linkerd-identity", controlNamespace, controlNamespace, trustDomain)
}

// CertifyLocal issues l's certificate directly, without a token: for the
// control plane's own identities (the Identity service's TLS).
func (i *Issuer) CertifyLocal(l *identity.Local) error {
	csr, err := x509.ParseCertificateRequest(l.CSR())
	if err != nil {
		return err
	}
	leaf, _, err := i.issue(csr)
	if err != nil {
		return err
	}
	return l.SetCertificate(leaf, i.chain)
}

// KeepCertified renews l's certificate from the issuer on Linkerd's
// schedule ([identity.RefreshIn]) until ctx is done.
func (i *Issuer) KeepCertified(ctx context.Context, l *identity.Local) {
	for {
		if err := i.CertifyLocal(l); err != nil {
			i.log.Error("identity: cannot certify the control plane's own identity", "identity", l.Name(), "error", err)
		}
		t := time.NewTimer(identity.RefreshIn(i.now(), l.Expiry(), identity.DefaultMinRefresh, identity.DefaultMaxRefresh))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// WatchTokens loads the tokens file at path into tokens, then checks it
// every interval and loads it again once a change has settled for one
// interval, until ctx is done. A file that fails to parse is logged (once
// per distinct error and interval, and always after a load) with its file
// and field, and the last good tokens stay in force; every load is logged.
// The error of the first load is returned,
// without watching.
func WatchTokens(ctx context.Context, tokens *Tokens, path string, interval time.Duration, log *slog.Logger) error {
	if interval <= 0 {
		interval = time.Second
	}
	load := func() error {
		data, err := filestamp.Read(path)
		if err != nil {
			return err
		}
		entries, err := manifest.ParseTokens(data)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		tokens.Set(entries)
		return nil
	}
	if err := load(); err != nil {
		return err
	}
	var settle filestamp.Settle
	if stamp, err := filestamp.File(path); err == nil {
		settle.Loaded(stamp)
	}
	rl := ratelog.New(log, 0)
	rejected := false
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			stamp, err := filestamp.File(path)
			if err != nil || !settle.Ready(stamp) {
				continue
			}
			if err := load(); errors.Is(err, filestamp.ErrChanged) {
				continue
			} else if err != nil {
				if !rejected {
					rl.Forget("tokens") // a change of state: never suppressed
				}
				rejected = true
				rl.WarnErr("tokens", "rejected the tokens file; the last good tokens stay in force", err)
			} else {
				rejected = false
				log.Info("loaded tokens", "file", path)
			}
			settle.Loaded(stamp)
		}
	}()
	return nil
}
