package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/proxyapi/identitypb"
)

// mtlsLoopback: a round trip between two inmesh peers on loopback over
// meshed mTLS, on reused connections, against the same peers in
// plaintext; and the TLS handshakes a second one core's worth of client
// and server complete.
func mtlsLoopback(o options) (*result, error) {
	const books, web = "books.default.serviceaccount.identity.linkerd.cluster.local", "web.default.serviceaccount.identity.linkerd.cluster.local"
	pki, err := newBenchPKI(books, web)
	if err != nil {
		return nil, err
	}
	booksID, err := pki.certify(books)
	if err != nil {
		return nil, err
	}
	webID, err := pki.certify(web)
	if err != nil {
		return nil, err
	}
	mp := newMeter()
	defer mp.Shutdown(context.Background())

	// One server stack with an identity serves both: plaintext and mTLS
	// are told apart by the first bytes on the one port.
	srvStack := mesh.NewServer(ok, mesh.WithIdentity(booksID), mesh.WithMeterProvider(mp), mesh.WithLogger(quiet))
	defer srvStack.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hs := origproto.NewServer(srvStack)
	go hs.Serve(srvStack.Listener(lis))
	defer hs.Close()
	addr := netip.MustParseAddrPort(lis.Addr().String())

	const plainName, tlsName = "plain.default.svc.cluster.local:80", "tls.default.svc.cluster.local:80"
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		plainName: {{Addr: addr, H2: true}},
		tlsName:   {{Addr: addr, H2: true, Identity: books}},
	})
	if err != nil {
		return nil, err
	}
	client := mesh.NewClient(mesh.WithEndpoints(eps), mesh.WithIdentity(webID), mesh.WithMeterProvider(mp), mesh.WithLogger(quiet))
	defer client.Close()
	n := o.scale(2000, 500)
	run := func(authority string) func() (figures, error) {
		return func() (figures, error) {
			return serial(client, func() *http.Request { return get("http://"+authority+"/", "") }, n)
		}
	}
	for _, a := range []string{plainName, tlsName} {
		if err := do(client, get("http://"+a+"/", "")); err != nil {
			return nil, fmt.Errorf("%s: %w", a, err)
		}
	}
	rs, err := interleave(o.rounds, variant{"plaintext", run(plainName)}, variant{"mtls", run(tlsName)})
	if err != nil {
		return nil, err
	}
	const plain, mtls = 0, 1

	// Full handshakes, one after another, with the client's certificate:
	// at the mesh's listener, and at Go's own crypto/tls server with the
	// same certificate and configuration. The client and the server share
	// the process, so the figure per core is the rate over GOMAXPROCS.
	goTLS, err := tls.Listen("tcp", "127.0.0.1:0", booksID.ServerConfig())
	if err != nil {
		return nil, err
	}
	defer goTLS.Close()
	go func() {
		for {
			c, err := goTLS.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Read(make([]byte, 1)) // until the client closes
			}()
		}
	}()
	cfg := webID.ClientConfig(books)
	handshakes := o.scale(300, 50)
	rate := func(addr string) (float64, error) {
		start := time.Now()
		for range handshakes {
			c, err := tls.Dial("tcp", addr, cfg)
			if err != nil {
				return 0, fmt.Errorf("handshake with %s: %w", addr, err)
			}
			c.Close()
		}
		return float64(handshakes) / time.Since(start).Seconds(), nil
	}
	perSecond, err := rate(lis.Addr().String())
	if err != nil {
		return nil, err
	}
	goPerSecond, err := rate(goTLS.Addr().String())
	if err != nil {
		return nil, err
	}
	procs := float64(runtime.GOMAXPROCS(0))

	r := &result{
		ratio:     rs.ratio("", atMost(1.10), func(f []figures) float64 { return f[mtls].P50 / f[plain].P50 }),
		Candidate: rs.median(mtls), Baseline: rs.median(plain),
		Others: map[string]figures{"handshakes": {RPS: perSecond}, "go_tls_handshakes": {RPS: goPerSecond}},
		Extra: []ratio{{Name: "full handshakes/s: inmesh's listener / Go's crypto/tls server", Ratio: perSecond / goPerSecond,
			Goal: noGoal, Spread: spread{perSecond / goPerSecond, perSecond / goPerSecond}}},
	}
	r.Note = fmt.Sprintf("ratio = p50 over meshed mTLS / p50 in plaintext, both on reused connections; full handshakes one after another: %.0f/s at inmesh's listener (%.0f per core), %.0f/s at Go's crypto/tls server with the same certificate (%.0f per core)",
		perSecond, perSecond/procs, goPerSecond, goPerSecond/procs)
	return r, nil
}

// benchPKI is an issuer made in memory for the bench's identities.
type benchPKI struct {
	root    *x509.Certificate
	anchors *x509.CertPool
	issuer  *controlplane.Issuer
}

func newBenchPKI(names ...string) (*benchPKI, error) {
	root, err := controlplane.NewRootCA("bench root", time.Hour)
	if err != nil {
		return nil, err
	}
	iss, err := root.NewIntermediate("bench issuer", time.Hour)
	if err != nil {
		return nil, err
	}
	p := &benchPKI{root: root.Cert, anchors: x509.NewCertPool()}
	p.anchors.AddCert(root.Cert)
	tokens := controlplane.StaticTokens{}
	for _, n := range names {
		tokens[n] = n
	}
	p.issuer, err = controlplane.NewIssuer(p.anchors, [][]byte{iss.DER}, iss.Key, tokens, controlplane.WithIssuerLogger(quiet))
	return p, err
}

func (p *benchPKI) certify(name string) (*identity.Local, error) {
	l, err := identity.NewLocal(name, p.anchors)
	if err != nil {
		return nil, err
	}
	resp, err := p.issuer.Certify(context.Background(), &identitypb.CertifyRequest{
		Identity: name, Token: []byte(name), CertificateSigningRequest: l.CSR()})
	if err != nil {
		return nil, err
	}
	return l, l.SetCertificate(resp.LeafCertificate, resp.IntermediateCertificates)
}
