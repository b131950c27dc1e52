package authz_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/proxyapi/identitypb"
)

const (
	serverID = "books.default.serviceaccount.identity.linkerd.cluster.local"
	webID    = "web.default.serviceaccount.identity.linkerd.cluster.local"
	adminID  = "admin.ops.serviceaccount.identity.linkerd.cluster.local"
)

var quiet = slog.New(slog.DiscardHandler)

// remoteIP is the client address of the tests' "remote" clients: a
// loopback address that is not the pod's own 127.0.0.1, so that the
// localhost authorization does not admit it.
var remoteIP = netip.MustParseAddr("127.0.0.2")

type pki struct {
	anchors *x509.CertPool
	issuer  *controlplane.Issuer
}

func newPKI(t *testing.T) *pki {
	root, err := controlplane.NewRootCA("root", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("issuer", time.Hour)
	require.NoError(t, err)
	p := &pki{anchors: x509.NewCertPool()}
	p.anchors.AddCert(root.Cert)
	p.issuer, err = controlplane.NewIssuer(p.anchors, [][]byte{iss.DER}, iss.Key,
		controlplane.StaticTokens{serverID: serverID, webID: webID, adminID: adminID}, controlplane.WithIssuerLogger(quiet))
	require.NoError(t, err)
	return p
}

func (p *pki) certify(t *testing.T, name string) *identity.Local {
	l, err := identity.NewLocal(name, p.anchors)
	require.NoError(t, err)
	resp, err := p.issuer.Certify(context.Background(), &identitypb.CertifyRequest{
		Identity: name, Token: []byte(name), CertificateSigningRequest: l.CSR()})
	require.NoError(t, err)
	require.NoError(t, l.SetCertificate(resp.LeafCertificate, resp.IntermediateCertificates))
	return l
}

// env is one Handler served on loopback in plaintext (HTTP/1 and h2c) and
// over mesh TLS, with the peer's verified identity in the context as the
// mesh's identity layer puts it.
type env struct {
	h       *authz.Handler
	plain   string // base URL
	tls     string
	pki     *pki
	reached chan struct{} // receives when the application is reached, if set
	release chan struct{}
}

func newEnv(t *testing.T, opts ...authz.Option) *env {
	e := &env{}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			e.reached <- struct{}{}
			<-e.release
		}
		w.Header().Set("X-App", "reached")
		w.Header().Set("X-Seen-Header", r.Header.Get("X-Added"))
	})
	h, err := authz.New(app, append([]authz.Option{authz.WithLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(h.Close)
	e.h = h
	withPeer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := identity.WithPeer(r.Context(), identity.PeerFromState(r.TLS))
		h.ServeHTTP(w, r.WithContext(ctx))
	})
	e.plain = testutil.NewServer(t, withPeer).URL

	e.pki = newPKI(t)
	local := e.pki.certify(t, serverID)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: withPeer, TLSConfig: local.ServerConfig(), ErrorLog: nil}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	e.tls = "https://" + ln.Addr().String()
	return e
}

// client returns a client from ip in mode; with id, over mesh TLS with
// that identity ("-" for TLS without a certificate).
func (e *env) client(t *testing.T, mode testutil.Mode, ip netip.Addr, id string) (*http.Client, string) {
	tr := testutil.NewTransport(t, mode)
	tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip.AsSlice()}}).DialContext
	if id == "" {
		return &http.Client{Transport: tr, CheckRedirect: noRedirects}, e.plain
	}
	var cfg *tls.Config
	if id == "-" {
		anon, err := identity.NewLocal(webID, e.pki.anchors) // never certified: sends no certificate
		require.NoError(t, err)
		cfg = anon.ClientConfig(serverID)
	} else {
		cfg = e.pki.certify(t, id).ClientConfig(serverID)
	}
	tr = &http.Transport{TLSClientConfig: cfg, DialContext: tr.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, CheckRedirect: noRedirects}, e.tls
}

func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

type result struct {
	status int
	hdr    http.Header
	body   string
}

func do(t *testing.T, c *http.Client, method, url string, hdr ...string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	h := resp.Header.Clone()
	for k, v := range resp.Trailer {
		h[k] = v
	}
	return result{resp.StatusCode, h, string(b)}
}

func mustDefault(t *testing.T, mode authz.Mode, opts authz.DefaultOptions) *authz.Server {
	s, err := authz.DefaultServer(mode, opts)
	require.NoError(t, err)
	return s
}

// Every default policy, for a plaintext client, a TLS client without an
// identity and a meshed one, all from a remote address, and the pod's
// own loopback, which every policy admits (linkerd2's
// policy-controller/k8s/index/src/defaults.rs default_authzs;
// linkerd2-proxy's localhost authorization).
func TestDefaultPolicies(t *testing.T) {
	cluster := []netip.Prefix{netip.PrefixFrom(remoteIP, 32)}
	for _, tc := range []struct {
		mode                       authz.Mode
		clusterHasClient           bool
		plain, tlsNoID, meshed, lo int
	}{
		{authz.AllUnauthenticated, false, 200, 200, 200, 200},
		{authz.AllAuthenticated, false, 403, 403, 200, 200},
		{authz.ClusterUnauthenticated, true, 200, 200, 200, 200},
		{authz.ClusterUnauthenticated, false, 403, 403, 403, 200},
		{authz.ClusterAuthenticated, true, 403, 403, 200, 200},
		{authz.ClusterAuthenticated, false, 403, 403, 403, 200},
		{authz.Deny, false, 403, 403, 403, 200},
		{authz.Audit, false, 200, 200, 200, 200},
	} {
		t.Run(string(tc.mode)+"/clusterHasClient="+strconv.FormatBool(tc.clusterHasClient), func(t *testing.T) {
			opts := authz.DefaultOptions{}
			if tc.clusterHasClient {
				opts.ClusterNetworks = cluster
			}
			e := newEnv(t, authz.WithDefault(mustDefault(t, tc.mode, opts)))
			for _, c := range []struct {
				name string
				ip   netip.Addr
				id   string
				want int
			}{
				{"plaintext", remoteIP, "", tc.plain},
				{"tls without identity", remoteIP, "-", tc.tlsNoID},
				{"meshed", remoteIP, webID, tc.meshed},
				{"localhost", netip.MustParseAddr("127.0.0.1"), "", tc.lo},
			} {
				cl, base := e.client(t, testutil.H1, c.ip, c.id)
				r := do(t, cl, "GET", base+"/x")
				assert.Equal(t, c.want, r.status, c.name)
				assert.Empty(t, r.body, c.name)
				if c.want == 200 {
					assert.Equal(t, "reached", r.hdr.Get("X-App"), c.name)
				} else {
					assert.Empty(t, r.hdr.Get("X-App"), "%s: a denied request never reaches the application", c.name)
				}
			}
		})
	}
}

func TestDefaultServerShape(t *testing.T) {
	probeNets := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
	for _, mode := range []authz.Mode{authz.AllUnauthenticated, authz.AllAuthenticated, authz.ClusterUnauthenticated,
		authz.ClusterAuthenticated, authz.Deny, authz.Audit} {
		s := mustDefault(t, mode, authz.DefaultOptions{ProbePaths: []string{"/ready?x=1", "", "/live"}, ProbeNetworks: probeNets})
		assert.Equal(t, authz.Meta{Kind: "default", Name: string(mode)}, s.Meta)
		if mode == authz.Deny {
			assert.Empty(t, s.Authorizations)
		} else {
			require.Len(t, s.Authorizations, 1)
			assert.Equal(t, authz.DefaultMeta(string(mode)), s.Authorizations[0].Meta)
		}
		require.Len(t, s.Routes, 2)
		assert.Equal(t, authz.DefaultMeta("default"), s.Routes[0].Meta)
		assert.Empty(t, s.Routes[0].Authorizations, "the default route leaves the decision to the Server's authorizations")
		assert.Equal(t, authz.DefaultMeta("probe"), s.Routes[1].Meta)
		require.Len(t, s.Routes[1].Rules[0].Matches, 3)
		assert.Equal(t, []string{"/ready", "/", "/live"}, []string{
			s.Routes[1].Rules[0].Matches[0].Path.Value, s.Routes[1].Rules[0].Matches[1].Path.Value, s.Routes[1].Rules[0].Matches[2].Path.Value})
		_, err := authz.Compile(s)
		require.NoError(t, err)
	}
	s := mustDefault(t, authz.Deny, authz.DefaultOptions{ProbePaths: []string{"/ready"}})
	assert.Len(t, s.Routes, 1, "no probe networks: no probe route")
	_, err := authz.ParseMode("allow")
	assert.ErrorContains(t, err, `"allow" is not one of`)
}

// Under deny, the probe route admits the kubelet's GET of its paths, and
// nothing else (linkerd2 policy-controller/k8s/index/src/inbound/tests/
// http_routes.rs routes_created_for_probes).
func TestProbeRoute(t *testing.T) {
	e := newEnv(t, authz.WithDefault(mustDefault(t, authz.Deny, authz.DefaultOptions{
		ProbePaths: []string{"/ready"}, ProbeNetworks: []netip.Prefix{netip.PrefixFrom(remoteIP, 32)}})))
	cl, base := e.client(t, testutil.H1, remoteIP, "")
	assert.Equal(t, 200, do(t, cl, "GET", base+"/ready").status)
	assert.Equal(t, 403, do(t, cl, "POST", base+"/ready").status)
	assert.Equal(t, 403, do(t, cl, "GET", base+"/ready/more").status)
	assert.Equal(t, 403, do(t, cl, "GET", base+"/").status)
}
