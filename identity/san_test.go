package identity_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// san is one subject alternative name of a test certificate, in order.
type san struct {
	uri   bool // a URI; a DNS name otherwise
	name  string
	email bool // an rfc822Name: neither kind of identity
}

func dnsSAN(n string) san   { return san{name: n} }
func uriSAN(n string) san   { return san{uri: true, name: n} }
func emailSAN(n string) san { return san{email: true, name: n} }

// sanExtension encodes sans in the order given; x509.CreateCertificate
// would write every DNS name before every URI.
func sanExtension(t *testing.T, sans []san) pkix.Extension {
	var raw []asn1.RawValue
	for _, s := range sans {
		tag := 2 // dNSName
		if s.uri {
			tag = 6 // uniformResourceIdentifier
		} else if s.email {
			tag = 1 // rfc822Name
		}
		raw = append(raw, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: tag, Bytes: []byte(s.name)})
	}
	der, err := asn1.Marshal(raw)
	require.NoError(t, err)
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: der}
}

// leafOf returns a certificate for a new key, signed by root, with sans in
// order, a CA's when ca.
func leafOf(t *testing.T, root *controlplane.CA, ca bool, sans ...san) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		NotBefore:    time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if len(sans) > 0 {
		tmpl.ExtraExtensions = []pkix.Extension{sanExtension(t, sans)}
	}
	if ca {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root.Cert, &key.PublicKey, root.Key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

const (
	fooDNS  = "foo.ns1.serviceaccount.identity.linkerd.cluster.local"
	barDNS  = "bar.ns1.serviceaccount.identity.linkerd.cluster.local"
	narDNS  = "nar.ns1.serviceaccount.identity.linkerd.cluster.local"
	spiffe  = "spiffe://some-trust-comain/some-system/some-component"
	spiffe2 = "spiffe://root.linkerd.cluster.local/proxy-harness"
	urn     = "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66"
)

// The identity of a client certificate is its first subject alternative
// name that is a DNS name valid as an identity or a URI, in the
// certificate's order. Cases of linkerd2-proxy's
// linkerd/meshtls/verifier/src/lib.rs (client_identity).
func TestPeerIdentityIsTheFirstIdentitySAN(t *testing.T) {
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		sans []san
		want string
	}{
		{"one DNS name", []san{dnsSAN(fooDNS)}, fooDNS},
		{"DNS names, then a URI", []san{dnsSAN(fooDNS), dnsSAN(barDNS), dnsSAN(narDNS), uriSAN(spiffe)}, fooDNS},
		{"one URI", []san{uriSAN(spiffe)}, spiffe},
		{"a URI, then DNS names", []san{uriSAN(spiffe), dnsSAN(barDNS), dnsSAN(narDNS)}, spiffe},
		{"a DNS name among emails", []san{dnsSAN(fooDNS), emailSAN("foo@foo.com"), emailSAN("bar@bar.com")}, fooDNS},
		{"a URI among emails", []san{emailSAN("foo@foo.com"), uriSAN(spiffe), emailSAN("bar@bar.com")}, spiffe},
		{"a urn: URI, then a DNS name", []san{uriSAN(urn), dnsSAN(fooDNS)}, urn},
		{"a DNS name, then a urn: URI", []san{dnsSAN(fooDNS), uriSAN(urn)}, fooDNS},
		{"a URI of another scheme", []san{uriSAN("http://host:1234/path"), dnsSAN(fooDNS)}, "http://host:1234/path"},
		{"a DNS name with a trailing dot", []san{dnsSAN(fooDNS + ".")}, ""},
		{"a trailing dot skipped for the next", []san{dnsSAN(fooDNS + "."), dnsSAN(barDNS)}, barDNS},
		{"no SAN", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, identity.PeerIdentity(leafOf(t, root, false, tc.sans...).Leaf))
		})
	}
}

// A server proves an identity when its certificate carries it: a DNS-like
// identity as a DNS name, a URI identity as a URI, among any others. Cases
// of linkerd2-proxy's linkerd/meshtls/verifier/src/lib.rs (verify_id),
// over real handshakes.
func TestServerProvesDNSOrURIIdentity(t *testing.T) {
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	client, err := identity.NewLocal(authors, anchors)
	require.NoError(t, err)
	all := []san{dnsSAN(fooDNS), dnsSAN(barDNS), uriSAN(spiffe)}
	for _, tc := range []struct {
		name     string
		sans     []san
		expected string
		ok       bool
	}{
		{"DNS name matches", []san{dnsSAN(fooDNS)}, fooDNS, true},
		{"URI matches", []san{uriSAN(spiffe)}, spiffe, true},
		{"another DNS name", []san{dnsSAN(fooDNS)}, barDNS, false},
		{"a DNS name for a URI", []san{dnsSAN(barDNS)}, spiffe, false},
		{"no SAN for a DNS name", nil, barDNS, false},
		{"no SAN for a URI", nil, spiffe, false},
		{"one of several matches a DNS name", all, fooDNS, true},
		{"one of several matches a URI", all, spiffe, true},
		{"none of several DNS names", []san{dnsSAN(fooDNS), dnsSAN(barDNS), uriSAN(spiffe)}, narDNS, false},
		{"none of several for a URI", []san{dnsSAN(fooDNS), dnsSAN(barDNS), dnsSAN(narDNS)}, spiffe, false},
		{"another URI", []san{uriSAN(spiffe)}, spiffe2, false},
		{"urn: URI matches", []san{dnsSAN(fooDNS), uriSAN(urn)}, urn, true},
		{"a DNS name for a urn: URI", []san{dnsSAN(fooDNS)}, urn, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := handshake(t, leafOf(t, root, false, tc.sans...), client.ClientConfig(tc.expected))
			if tc.ok {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, identity.ErrWrongName)
			}
		})
	}
}

// A CA's certificate proves no workload identity, though it chains to the
// anchors and carries the name: a client refuses it from a server, and a
// server from a client (rustls-webpki, which Linkerd's proxy uses, refuses
// a CA as an end entity).
func TestCACertificateProvesNoIdentity(t *testing.T) {
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	client, err := identity.NewLocal(authors, anchors)
	require.NoError(t, err)
	err = handshake(t, leafOf(t, root, true, dnsSAN(books)), client.ClientConfig(books))
	assert.ErrorIs(t, err, identity.ErrCAAsLeaf, "a server with a CA's certificate")

	iss, err := controlplane.NewIssuer(anchors, [][]byte{root.DER}, root.Key, controlplane.StaticTokens{})
	require.NoError(t, err)
	server, err := identity.NewLocal(books, anchors)
	require.NoError(t, err)
	require.NoError(t, iss.CertifyLocal(server))
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server.ServerConfig())
	require.NoError(t, err)
	defer lis.Close()
	served := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		served <- c.(*tls.Conn).Handshake()
	}()
	caLeaf := leafOf(t, root, true, dnsSAN(authors))
	cfg := client.ClientConfig(books)
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &caLeaf, nil }
	c, err := tls.Dial("tcp", lis.Addr().String(), cfg)
	if err == nil {
		_ = c.SetReadDeadline(time.Now().Add(timeout))
		_, _ = c.Read(make([]byte, 1)) // the server's verdict
		c.Close()
	}
	assert.ErrorIs(t, <-served, identity.ErrCAAsLeaf, "a client with a CA's certificate")
}

// handshake serves cert on loopback and returns the error of a client
// handshake with cfg.
func handshake(t *testing.T, cert tls.Certificate, cfg *tls.Config) error {
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}})
	require.NoError(t, err)
	defer lis.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if c, err := lis.Accept(); err == nil {
			_ = c.SetDeadline(time.Now().Add(timeout))
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	defer func() { <-done }()
	raw, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(timeout))
	return tls.Client(raw, cfg).Handshake()
}

// clientIdentityOver returns the identity a server of server's
// ServerConfig reads from a client presenting cert, over a real handshake
// on loopback: what the server's handlers see as the peer (l5d-client-id).
func clientIdentityOver(t *testing.T, server, client *identity.Local, cert tls.Certificate) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server.ServerConfig())
	require.NoError(t, err)
	defer lis.Close()
	type result struct {
		peer identity.Peer
		err  error
	}
	served := make(chan result, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			served <- result{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			served <- result{err: err}
			return
		}
		cs := tc.ConnectionState()
		served <- result{peer: identity.PeerFromState(&cs)}
	}()
	cfg := client.ClientConfig(books)
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	c, err := tls.Dial("tcp", lis.Addr().String(), cfg)
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	_, _ = c.Read(make([]byte, 1)) // until the server is done
	c.Close()
	r := <-served
	require.NoError(t, r.err)
	require.True(t, r.peer.TLS)
	return r.peer.ID
}

// A server reads a client's identity as Linkerd's proxy does: the first
// subject alternative name that parses as an identity, a DNS name in
// lower case whatever its case, or a URI. The rows named after a test are
// the cases of linkerd2-proxy's linkerd/meshtls/verifier/src/lib.rs
// (client_identity); the others are DNS names of the cases of
// linkerd/dns/name/src/name.rs (test_parse), which Id::parse_dns_name in
// linkerd/identity/src/lib.rs parses and lowercases, refusing a trailing
// dot. Each row is a real mTLS handshake on loopback.
func TestClientIdentityOverHandshake(t *testing.T) {
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	iss, err := controlplane.NewIssuer(anchors, [][]byte{root.DER}, root.Key, controlplane.StaticTokens{})
	require.NoError(t, err)
	server, err := identity.NewLocal(books, anchors)
	require.NoError(t, err)
	require.NoError(t, iss.CertifyLocal(server))
	client, err := identity.NewLocal(authors, anchors)
	require.NoError(t, err)

	const upperFoo = "FOO.NS1.serviceaccount.identity.linkerd.cluster.local"
	long := "a"
	for len(long) < 64 {
		long += "a"
	}
	for _, tc := range []struct {
		name string
		sans []san
		want string
	}{
		{"can_extract_spiffe_client_identity_one_san", []san{uriSAN(spiffe)}, spiffe},
		{"can_extract_spiffe_client_identity_many_sans", []san{uriSAN(spiffe), dnsSAN(barDNS), dnsSAN(narDNS)}, spiffe},
		{"can_extract_dns_client_identity_one_san", []san{dnsSAN(fooDNS)}, fooDNS},
		{"can_extract_dns_client_identity_many_sans", []san{dnsSAN(fooDNS), dnsSAN(barDNS), dnsSAN(narDNS), uriSAN(spiffe)}, fooDNS},
		{"extracts_dns_client_id_when_others_not_uri_or_dns", []san{dnsSAN(fooDNS), emailSAN("foo@foo.com"), emailSAN("bar@bar.com")}, fooDNS},
		{"extracts_spiffe_client_id_when_others_not_uri_or_dns", []san{uriSAN(spiffe), emailSAN("foo@foo.com"), emailSAN("bar@bar.com")}, spiffe},
		{"a urn: URI first of several", []san{uriSAN(urn), dnsSAN(barDNS)}, urn},
		{"a non-SPIFFE URI (roundtrip_uri_id_parsing_non_spiffe)", []san{uriSAN("http://host:1234/path"), dnsSAN(barDNS)}, "http://host:1234/path"},
		{"skips_dns_san_with_trailing_dot", []san{dnsSAN(fooDNS + ".")}, ""},
		{"upper case, lowercased", []san{dnsSAN(upperFoo)}, fooDNS},
		{"upper case first of several", []san{dnsSAN(upperFoo), dnsSAN(barDNS)}, fooDNS},
		{"mixed case (aBc)", []san{dnsSAN("aBc.ns1.svc"), dnsSAN(barDNS)}, "abc.ns1.svc"},
		{"underscore leading (_m.foo.bar)", []san{dnsSAN("_m.foo.bar"), dnsSAN(barDNS)}, "_m.foo.bar"},
		{"underscore trailing (m.foo.bar_)", []san{dnsSAN("m.foo.bar_"), dnsSAN(barDNS)}, "m.foo.bar_"},
		{"one label (a)", []san{dnsSAN("a"), dnsSAN(barDNS)}, "a"},
		{"digits first (1.a)", []san{dnsSAN("1.a"), dnsSAN(barDNS)}, "1.a"},
		{"IDN (xn--poema-9qae5a.com.br)", []san{dnsSAN("xn--poema-9qae5a.com.br")}, "xn--poema-9qae5a.com.br"},
		{"all-digit last label skipped (a.1)", []san{dnsSAN("a.1"), dnsSAN(barDNS)}, barDNS},
		{"address skipped (1.2.3.4)", []san{dnsSAN("1.2.3.4"), dnsSAN(barDNS)}, barDNS},
		{"hyphen last skipped (d.c.b.a-)", []san{dnsSAN("d.c.b.a-"), dnsSAN(barDNS)}, barDNS},
		{"hyphen first skipped (-a.b)", []san{dnsSAN("-a.b"), dnsSAN(barDNS)}, barDNS},
		{"wildcard skipped (*.a)", []san{dnsSAN("*.a"), dnsSAN(barDNS)}, barDNS},
		{"empty label skipped (.a)", []san{dnsSAN(".a"), dnsSAN(barDNS)}, barDNS},
		{"port skipped (example.com:80)", []san{dnsSAN("example.com:80"), dnsSAN(barDNS)}, barDNS},
		{"space skipped ( d.c.b.a)", []san{dnsSAN(" d.c.b.a"), dnsSAN(barDNS)}, barDNS},
		{"label of 64 skipped", []san{dnsSAN(long + ".a"), dnsSAN(barDNS)}, barDNS},
		{"upper case with a trailing dot skipped", []san{dnsSAN(upperFoo + "."), dnsSAN(barDNS)}, barDNS},
		{"no SAN", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, clientIdentityOver(t, server, client, leafOf(t, root, false, tc.sans...)))
		})
	}
}

// A server proves the identity a client expects only with exactly that
// DNS name: lowercasing a client's identity does not make a server's
// upper-case name prove the lower-case identity, nor the reverse.
func TestServerNameCaseStaysExact(t *testing.T) {
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	anchors := x509.NewCertPool()
	anchors.AddCert(root.Cert)
	client, err := identity.NewLocal(authors, anchors)
	require.NoError(t, err)
	const upperFoo = "FOO.NS1.serviceaccount.identity.linkerd.cluster.local"
	err = handshake(t, leafOf(t, root, false, dnsSAN(upperFoo)), client.ClientConfig(fooDNS))
	assert.ErrorIs(t, err, identity.ErrWrongName, "an upper-case name for the lower-case identity")
	err = handshake(t, leafOf(t, root, false, dnsSAN(fooDNS)), client.ClientConfig(upperFoo))
	assert.ErrorIs(t, err, identity.ErrWrongName, "a lower-case name for an upper-case identity")
	assert.NoError(t, handshake(t, leafOf(t, root, false, dnsSAN(upperFoo), dnsSAN(fooDNS)), client.ClientConfig(fooDNS)),
		"the exact name among others")
}

// ParseID reads an identity an application names as Linkerd's proxy
// parses one (linkerd/identity/src/lib.rs, Id::from_str and its tests): a
// DNS-like name, lowercased, else a URI; anything else is no identity.
func TestParseID(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"books.default.serviceaccount.identity.linkerd.cluster.local", "books.default.serviceaccount.identity.linkerd.cluster.local", true},
		{"Books.Default.serviceaccount.identity.linkerd.cluster.local", "books.default.serviceaccount.identity.linkerd.cluster.local", true},
		{"web_1.ns", "web_1.ns", true},
		{"spiffe://cluster.local/ns/default/sa/books", "spiffe://cluster.local/ns/default/sa/books", true},
		{"uri://host:1234/path", "uri://host:1234/path", true},
		{"urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66", "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66", true},
		{"books.default.", "", false},
		{"books..default", "", false},
		{"", "", false},
		{" books.default", "", false},
		{"-books.default", "", false},
	} {
		id, ok := identity.ParseID(tc.in)
		assert.Equal(t, tc.ok, ok, "%q", tc.in)
		assert.Equal(t, tc.want, id, "%q", tc.in)
	}
}
