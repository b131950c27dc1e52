package controlplane

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/proxyapi/identitypb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const (
	books     = "books.default.serviceaccount.identity.linkerd.cluster.local"
	authors   = "authors.default.serviceaccount.identity.linkerd.cluster.local"
	booksTok  = "token-of-books"
	badTokErr = "token-with-a-fault"
)

// tokens proves books with booksTok, and fails for badTokErr as a broken
// review would.
type tokens struct{}

func (tokens) Validate(_ context.Context, tok []byte) (string, error) {
	switch string(tok) {
	case booksTok:
		return books, nil
	case "malformed":
		return "", ErrInvalidToken
	case badTokErr:
		return "", assert.AnError
	}
	return "", ErrNotAuthenticated
}

func newTestIssuer(t *testing.T, opts ...IssuerOption) (*Issuer, *x509.CertPool, *CA) {
	t.Helper()
	root, err := NewRootCA("root.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("identity.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	i, err := NewIssuer(anchors, [][]byte{iss.DER}, iss.Key, tokens{}, append([]IssuerOption{WithIssuerLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	return i, anchors, iss
}

func csrFor(t *testing.T, tmpl *x509.CertificateRequest, key any) []byte {
	t.Helper()
	if key == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		key = k
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	require.NoError(t, err)
	return der
}

// Certify's refusals, each with the gRPC code and message of Linkerd's
// identity controller (linkerd2 pkg/identity/service.go: Certify,
// checkRequest, checkCSR; its service_test.go covers the same rules).
func TestCertifyRefusals(t *testing.T) {
	issuer, _, _ := newTestIssuer(t)
	good := csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, nil)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		req  *identitypb.CertifyRequest
		code codes.Code
		msg  string
	}{
		{"no identity", &identitypb.CertifyRequest{Token: []byte(booksTok), CertificateSigningRequest: good}, codes.InvalidArgument, "missing identity"},
		{"no token", &identitypb.CertifyRequest{Identity: books, CertificateSigningRequest: good}, codes.InvalidArgument, "missing token"},
		{"no csr", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok)}, codes.InvalidArgument, "missing certificate signing request"},
		{"csr not der", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok), CertificateSigningRequest: []byte("-----BEGIN")}, codes.InvalidArgument, ""},
		// service_test.go TestInvalidRequestArguments: a request of "fake-data".
		{"fake data", &identitypb.CertifyRequest{Identity: "fake-data", Token: []byte("fake-data"), CertificateSigningRequest: []byte("fake-data")}, codes.InvalidArgument, ""},
		{"signature of another key", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: swapKey(t, csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, nil))},
			codes.InvalidArgument, "CSR signature does not verify with its public key: x509: ECDSA verification failure"},
		{"two dns names", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{books, authors}}, nil)},
			codes.FailedPrecondition, "CSR must have exactly one DNSName"},
		{"no dns name", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: books}}, nil)},
			codes.FailedPrecondition, "CSR must have exactly one DNSName"},
		{"other dns name", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{authors}}, nil)},
			codes.FailedPrecondition, "CSR name does not match requested identity: csr=" + authors + "; req=" + books},
		{"other common name", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: authors}, DNSNames: []string{books}}, nil)},
			codes.FailedPrecondition, "invalid CommonName: " + authors},
		{"email", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}, EmailAddresses: []string{"a@b.c"}}, nil)},
			codes.FailedPrecondition, "cannot validate email addresses"},
		{"ip", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}, nil)},
			codes.FailedPrecondition, "cannot validate IP addresses"},
		{"uri", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}, URIs: []*url.URL{{Scheme: "spiffe", Host: "td", Path: "/books"}}}, nil)},
			codes.FailedPrecondition, "cannot validate URIs"},
		{"malformed token", &identitypb.CertifyRequest{Identity: books, Token: []byte("malformed"), CertificateSigningRequest: good}, codes.InvalidArgument, ""},
		{"unknown token", &identitypb.CertifyRequest{Identity: books, Token: []byte("who?"), CertificateSigningRequest: good}, codes.FailedPrecondition, "authentication token could not be authenticated"},
		{"review fails", &identitypb.CertifyRequest{Identity: books, Token: []byte(badTokErr), CertificateSigningRequest: good}, codes.Internal, ""},
		{"token of another identity", &identitypb.CertifyRequest{Identity: authors, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{authors}}, nil)},
			codes.FailedPrecondition, "requested identity did not match provided token: requested=" + authors + "; found=" + books},
		{"rsa key", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, rsaKey)},
			codes.Internal, "CSR must contain an ECDSA public key"},
		// Beyond Linkerd's controller, which signs any ECDSA key: its
		// proxies send P-256 only (linkerd2-proxy linkerd/meshtls).
		{"p-384 key", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, p384)},
			codes.Internal, "CSR must contain an ECDSA P-256 public key, not P-384"},
		{"ed25519 key", &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, edKey)},
			codes.Internal, "CSR must contain an ECDSA public key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := issuer.Certify(context.Background(), tc.req)
			st, _ := status.FromError(err)
			assert.Equal(t, tc.code, st.Code(), "%v", err)
			if tc.msg != "" {
				assert.Equal(t, tc.msg, st.Message())
			}
		})
	}
}

// An issued leaf: the CSR's subject and one DNS SAN, ECDSA with SHA-256,
// server and client use, valid from the clock skew before now to the
// lifetime and the skew after, a positive serial of its own, and the
// issuer as the one intermediate, as Linkerd's controller issues it
// (linkerd2 pkg/tls/ca.go).
func TestCertifyIssues(t *testing.T) {
	issuer, anchors, iss := newTestIssuer(t, WithIssuanceLifetime(time.Minute), WithClockSkew(5*time.Second))
	// A clock with a fraction of a second: the certificate and
	// valid_until both hold whole seconds (linkerd2 pkg/identity/service.go
	// sends the issued certificate's NotAfter).
	now := time.Now().Truncate(time.Second).UTC()
	issuer.now = func() time.Time { return now.Add(638346700 * time.Nanosecond) }
	var serials []string
	for range 2 {
		resp, err := issuer.Certify(context.Background(), &identitypb.CertifyRequest{
			Identity: books, Token: []byte(booksTok),
			CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: books}, DNSNames: []string{books}}, nil),
		})
		require.NoError(t, err)
		leaf, err := x509.ParseCertificate(resp.LeafCertificate)
		require.NoError(t, err)
		assert.Equal(t, []string{books}, leaf.DNSNames)
		assert.Equal(t, books, leaf.Subject.CommonName)
		assert.Equal(t, x509.ECDSAWithSHA256, leaf.SignatureAlgorithm)
		assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, leaf.ExtKeyUsage)
		assert.Equal(t, now.Add(-5*time.Second), leaf.NotBefore)
		assert.Equal(t, now.Add(65*time.Second), leaf.NotAfter)
		assert.Equal(t, now.Add(65*time.Second), resp.ValidUntil.AsTime())
		assert.Positive(t, leaf.SerialNumber.Sign())
		assert.NotContains(t, serials, leaf.SerialNumber.String(), "a serial issued before")
		serials = append(serials, leaf.SerialNumber.String())
		require.Equal(t, [][]byte{iss.DER}, resp.IntermediateCertificates)
		inter := x509.NewCertPool()
		inter.AddCert(iss.Cert)
		_, err = leaf.Verify(x509.VerifyOptions{Roots: anchors, Intermediates: inter, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		assert.NoError(t, err)
	}
}

// An issuer started anew over the same CA (a restarted control plane)
// never issues a serial the one before it issued: a CA's serials are
// unique (RFC 5280, 4.1.2.2), so that a renewed certificate is told from
// the one it replaces.
func TestCertifySerialsUniqueAcrossRestarts(t *testing.T) {
	first, anchors, iss := newTestIssuer(t)
	seen := map[string]bool{}
	for n := range 3 {
		issuer := first
		if n > 0 {
			var err error
			issuer, err = NewIssuer(anchors, [][]byte{iss.DER}, iss.Key, tokens{}, WithIssuerLogger(quiet))
			require.NoError(t, err)
		}
		for range 3 {
			resp, err := issuer.Certify(context.Background(), &identitypb.CertifyRequest{
				Identity: books, Token: []byte(booksTok), CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, nil),
			})
			require.NoError(t, err)
			leaf, err := x509.ParseCertificate(resp.LeafCertificate)
			require.NoError(t, err)
			serial := leaf.SerialNumber.String()
			assert.False(t, seen[serial], "issuer %d issued serial %s again", n, serial)
			seen[serial] = true
		}
	}
}

// A leaf never outlives the issuer chain.
func TestCertifyClampsToIssuerExpiry(t *testing.T) {
	issuer, _, iss := newTestIssuer(t, WithIssuanceLifetime(48*time.Hour))
	resp, err := issuer.Certify(context.Background(), &identitypb.CertifyRequest{
		Identity: books, Token: []byte(booksTok), CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, nil),
	})
	require.NoError(t, err)
	assert.Equal(t, iss.Cert.NotAfter, resp.ValidUntil.AsTime())
}

func TestNewIssuerRejects(t *testing.T) {
	root, err := NewRootCA("root", time.Hour)
	require.NoError(t, err)
	other, err := NewRootCA("other", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("issuer", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	_, err = NewIssuer(anchors, [][]byte{iss.DER}, other.Key, tokens{})
	assert.ErrorContains(t, err, "does not match")
	foreign := x509.NewCertPool()
	foreign.AddCert(other.Cert)
	_, err = NewIssuer(foreign, [][]byte{iss.DER}, iss.Key, tokens{})
	assert.ErrorContains(t, err, "does not chain to the trust anchors")
	_, err = NewIssuer(anchors, nil, iss.Key, tokens{})
	assert.Error(t, err)
	_, err = NewIssuer(anchors, [][]byte{iss.DER}, iss.Key, nil)
	assert.Error(t, err)
}

// Tokens from a tokens file prove service-account identities under the
// control plane's namespace and trust domain; a Set replaces them whole.
func TestTokens(t *testing.T) {
	tokens := NewTokens("linkerd", "cluster.local")
	tokens.Set([]manifest.Token{{Token: "t1", ServiceAccount: "books", Namespace: "default"}})
	id, err := tokens.Validate(context.Background(), []byte("t1"))
	require.NoError(t, err)
	assert.Equal(t, books, id)
	_, err = tokens.Validate(context.Background(), []byte("t2"))
	assert.ErrorIs(t, err, ErrNotAuthenticated)
	tokens.Set([]manifest.Token{{Token: "t2", ServiceAccount: "authors", Namespace: "default"}})
	_, err = tokens.Validate(context.Background(), []byte("t1"))
	assert.ErrorIs(t, err, ErrNotAuthenticated, "the old entry is gone")
	id, err = tokens.Validate(context.Background(), []byte("t2"))
	require.NoError(t, err)
	assert.Equal(t, authors, id)
}

// A refused token is logged once per reason and interval, however often a
// caller repeats it.
func TestRefusedTokensAreLoggedOnce(t *testing.T) {
	var logs testutil.LogLines
	issuer, _, _ := newTestIssuer(t, WithIssuerLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	csr := csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, nil)
	for range 100 {
		_, err := issuer.Certify(context.Background(), &identitypb.CertifyRequest{Identity: books, Token: []byte("who?"), CertificateSigningRequest: csr})
		require.Error(t, err)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "refused a token"), logs.String())
}

// swapKey returns csr (ECDSA P-256) with another key's public key in place
// of its own and its signature unchanged: a request whose signature does
// not prove that the requester holds the key to be certified.
func swapKey(t *testing.T, csr []byte) []byte {
	t.Helper()
	parsed, err := x509.ParseCertificateRequest(csr)
	require.NoError(t, err)
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	spki, err := x509.MarshalPKIXPublicKey(&other.PublicKey)
	require.NoError(t, err)
	require.Len(t, spki, len(parsed.RawSubjectPublicKeyInfo))
	swapped := bytes.Replace(csr, parsed.RawSubjectPublicKeyInfo, spki, 1)
	again, err := x509.ParseCertificateRequest(swapped)
	require.NoError(t, err, "the swapped request still parses")
	require.True(t, other.PublicKey.Equal(again.PublicKey))
	return swapped
}

// A signing request for books that carries another party's public key
// under books' own signature, sent with books' valid token, gets no
// certificate: the signature must verify with the key in the request
// (RFC 2986, 3), or anyone holding a token could bind its identity to a
// key it does not hold.
func TestCertifyRefusesACSRWhoseSignatureDoesNotVerify(t *testing.T) {
	var logs testutil.LogLines
	issuer, _, _ := newTestIssuer(t, WithIssuerLogger(logs.Logger()))
	resp, err := issuer.Certify(context.Background(), &identitypb.CertifyRequest{
		Identity: books, Token: []byte(booksTok),
		CertificateSigningRequest: swapKey(t, csrFor(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: books}, DNSNames: []string{books}}, nil)),
	})
	assert.Empty(t, resp.GetLeafCertificate(), "a certificate binding books to a key books' requester does not hold")
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.Equal(t, 1, logs.Count("level=WARN", "signature does not verify", "identity="+books), logs.String())
}

// An issuer whose own certificate has expired refuses to sign, as
// Linkerd's controller does before each certificate (linkerd2
// pkg/identity/service.go ensureIssuerStillValid: the verification error
// returned as it is, which gRPC answers Unknown, with the times of the
// issuer's certificate); it says so at error level, once per interval
// however many proxies ask, counts each refusal, and reports the issuer's
// time left (issuer_cert_ttl_seconds, negative now).
func TestCertifyRefusesWhileTheIssuerIsExpired(t *testing.T) {
	var logs testutil.LogLines
	mt := testutil.NewMetrics(t)
	issuer, _, iss := newTestIssuer(t, WithIssuerLogger(logs.Logger()), WithIssuerMeterProvider(mt.Provider))
	req := &identitypb.CertifyRequest{Identity: books, Token: []byte(booksTok),
		CertificateSigningRequest: csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, nil)}
	_, err := issuer.Certify(context.Background(), req)
	require.NoError(t, err, "valid before its expiry")
	assert.Empty(t, mt.Value(t, "identity_issuer_invalid_total"), "nothing refused yet")

	after := iss.Cert.NotAfter.Add(time.Minute)
	issuer.now = func() time.Time { return after }
	for range 3 {
		resp, err := issuer.Certify(context.Background(), req)
		assert.Empty(t, resp.GetLeafCertificate(), "an already expired leaf")
		st, _ := status.FromError(err)
		assert.Equal(t, codes.Unknown, st.Code(), "%v", err)
		assert.Contains(t, st.Message(), "x509: certificate has expired or is not yet valid")
		assert.Contains(t, st.Message(), " - Invalid After "+iss.Cert.NotAfter.String())
	}
	assert.Equal(t, 1, logs.Count("level=ERROR", "issuer's certificate does not verify", "identity="+books), logs.String())
	assert.Equal(t, "3", mt.Value(t, "identity_issuer_invalid_total"))
	assert.Equal(t, "-60", mt.Value(t, "issuer_cert_ttl_seconds"))
}

// A caller with no token worth anything cannot make the issuer keep or
// print an identity of its choosing at any length: an identity longer
// than a DNS name is refused before a line names it.
func TestCertifyRefusesAnIdentityLongerThanADNSName(t *testing.T) {
	var logs testutil.LogLines
	issuer, _, _ := newTestIssuer(t, WithIssuerLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	long := strings.Repeat("a", 1<<20) + ".default.serviceaccount.identity.linkerd.cluster.local"
	for _, csr := range [][]byte{
		swapKey(t, csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, nil)),
		csrFor(t, &x509.CertificateRequest{DNSNames: []string{books}}, nil),
	} {
		_, err := issuer.Certify(context.Background(), &identitypb.CertifyRequest{Identity: long, Token: []byte("who?"), CertificateSigningRequest: csr})
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		assert.Less(t, len(status.Convert(err).Message()), 1024)
	}
	assert.Less(t, len(logs.String()), 4096, "the log holds the caller's identity")
}
