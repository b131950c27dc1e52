package identity

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The environment variables through which Linkerd's proxy injector gives a
// proxy its identity.
const (
	EnvDir          = "LINKERD2_PROXY_IDENTITY_DIR"
	EnvTokenFile    = "LINKERD2_PROXY_IDENTITY_TOKEN_FILE"
	EnvTrustAnchors = "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS"
	EnvLocalName    = "LINKERD2_PROXY_IDENTITY_LOCAL_NAME"
	EnvSvcAddr      = "LINKERD2_PROXY_IDENTITY_SVC_ADDR"
	EnvSvcName      = "LINKERD2_PROXY_IDENTITY_SVC_NAME"
	EnvMinRefresh   = "LINKERD2_PROXY_IDENTITY_MIN_REFRESH"
	EnvMaxRefresh   = "LINKERD2_PROXY_IDENTITY_MAX_REFRESH"
)

// Env is the identity configuration of a Linkerd pod, as its proxy reads
// it from the environment.
type Env struct {
	// Dir is the proxy's identity directory (LINKERD2_PROXY_IDENTITY_DIR);
	// inmesh keeps its key in memory and does not use it.
	Dir string
	// TokenFile holds the service account token (_TOKEN_FILE).
	TokenFile string
	// TrustAnchors is the PEM bundle of the trust anchors
	// (_TRUST_ANCHORS).
	TrustAnchors string
	// LocalName is the workload's identity (_LOCAL_NAME).
	LocalName string
	// SvcAddr and SvcName are the identity service's address and identity
	// (_SVC_ADDR, _SVC_NAME).
	SvcAddr, SvcName string
	// MinRefresh and MaxRefresh bound the wait between certifications
	// (_MIN_REFRESH, _MAX_REFRESH; zero: the defaults).
	MinRefresh, MaxRefresh time.Duration
}

// EnvFromLookup reads the identity configuration through lookup (such as
// os.LookupEnv). ok is false when no local name is set: the workload has
// no identity. A set but malformed variable is an error naming it.
func EnvFromLookup(lookup func(string) (string, bool)) (env Env, ok bool, err error) {
	get := func(name string) string { v, _ := lookup(name); return strings.TrimSpace(v) }
	env = Env{Dir: get(EnvDir), TokenFile: get(EnvTokenFile), TrustAnchors: get(EnvTrustAnchors),
		LocalName: get(EnvLocalName), SvcAddr: get(EnvSvcAddr), SvcName: get(EnvSvcName)}
	if env.LocalName == "" {
		return env, false, nil
	}
	if err := CheckName(env.LocalName); err != nil {
		return env, false, fmt.Errorf("%s: %w", EnvLocalName, err)
	}
	for _, v := range []struct {
		name string
		dst  *time.Duration
	}{{EnvMinRefresh, &env.MinRefresh}, {EnvMaxRefresh, &env.MaxRefresh}} {
		if s := get(v.name); s != "" {
			if *v.dst, err = parseEnvDuration(s); err != nil {
				return env, false, fmt.Errorf("%s=%q: %w", v.name, s, err)
			}
		}
	}
	for _, v := range []struct{ name, value string }{
		{EnvTokenFile, env.TokenFile}, {EnvTrustAnchors, env.TrustAnchors}, {EnvSvcAddr, env.SvcAddr}, {EnvSvcName, env.SvcName},
	} {
		if v.value == "" {
			return env, false, fmt.Errorf("%s is not set (required with %s)", v.name, EnvLocalName)
		}
	}
	return env, true, nil
}

// FromEnv is [EnvFromLookup] over the process's environment.
func FromEnv() (Env, bool, error) { return EnvFromLookup(os.LookupEnv) }

// parseEnvDuration reads a duration as Linkerd's proxy writes them: a
// number with a unit of ms, s, m, h or d, or a bare number of seconds.
func parseEnvDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseUint(d, 10, 16)
		if err != nil {
			return 0, errors.New("not a duration")
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errors.New("not a duration")
	}
	return d, nil
}

// ReadAnchors returns the pool of the PEM certificates in the file path,
// with an error naming the file when it cannot be read or holds no
// certificate.
func ReadAnchors(path string) (*x509.CertPool, error) {
	bundle, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("identity: trust anchors: %w", err)
	}
	pool, err := ParseAnchors(bundle)
	if err != nil {
		return nil, fmt.Errorf("%w (trust anchors file %s: PEM CERTIFICATE blocks expected)", err, path)
	}
	return pool, nil
}

// ParseAnchors returns the pool of the PEM certificates in bundle; a
// bundle with no certificate, or with a block that does not parse, is an
// error.
func ParseAnchors(bundle []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for {
		var b *pem.Block
		b, bundle = pem.Decode(bundle)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("identity: trust anchor %d: %w", n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%w in the bundle", ErrNoAnchors)
	}
	return pool, nil
}
