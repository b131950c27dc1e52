package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
)

// The identities of the two ends of sidecar_pair, as Linkerd names a
// workload's service account.
const (
	pairServer = "books.default.serviceaccount.identity.linkerd.cluster.local"
	pairClient = "web.default.serviceaccount.identity.linkerd.cluster.local"
)

// pairPKI returns the two identities of sidecar_pair, certified by one
// in-memory issuer, and the issuer's trust anchor.
func pairPKI() (server, client *identity.Local, pki *benchPKI, err error) {
	if pki, err = newBenchPKI(pairServer, pairClient); err != nil {
		return nil, nil, nil, err
	}
	if server, err = pki.certify(pairServer); err != nil {
		return nil, nil, nil, err
	}
	if client, err = pki.certify(pairClient); err != nil {
		return nil, nil, nil, err
	}
	return server, client, pki, nil
}

// haproxyPair is the sidecar deployment of a mesh: the client's HAProxy
// (outbound) and the server's (inbound), mTLS between them with the
// workloads' identities, in front of an application on loopback.
type haproxyPair struct {
	out, in *haproxy
	dir     string
	// inPEM and caPEM are the server's certificate and the trust
	// anchor as the sidecars read them.
	inPEM, caPEM string
	anchors      *x509.CertPool
}

// startHAProxyPair starts the two sidecars in front of app (host:port)
// and returns once a request goes through both. It returns errNoHAProxy
// when HAProxy is not installed.
func startHAProxyPair(app string, server, client *identity.Local, pki *benchPKI) (*haproxyPair, error) {
	bin, err := haproxyBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "inmesh-bench-haproxy-")
	if err != nil {
		return nil, err
	}
	p := &haproxyPair{dir: dir, anchors: pki.anchors, inPEM: filepath.Join(dir, "server.pem"), caPEM: filepath.Join(dir, "ca.pem")}
	outPEM := filepath.Join(dir, "client.pem")
	for _, err := range []error{writePEM(p.inPEM, server), writePEM(outPEM, client), writeAnchor(p.caPEM, pki.root)} {
		if err != nil {
			p.stop()
			return nil, err
		}
	}
	if p.in, err = startHAProxy(bin, dir, "inbound", fmt.Sprintf(haproxyInbound, app, p.inPEM, p.caPEM)); err != nil {
		p.stop()
		return nil, err
	}
	if p.out, err = startHAProxy(bin, dir, "outbound", fmt.Sprintf(haproxyOutbound, p.in.addr, outPEM, p.caPEM, pairServer)); err != nil {
		p.stop()
		return nil, err
	}
	// Ready when a request goes through both.
	c := &http.Client{Transport: h1Transport(), Timeout: 2 * time.Second}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.Get("http://" + p.out.addr + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		for _, h := range []*haproxy{p.in, p.out} {
			if why, gone := h.exited(); gone {
				p.stop()
				return nil, fmt.Errorf("haproxy exited: %s", why)
			}
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("the haproxy pair did not come up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop stops both sidecars and removes their directory.
func (p *haproxyPair) stop() {
	for _, h := range []*haproxy{p.out, p.in} {
		if h != nil {
			h.stop()
		}
	}
	os.RemoveAll(p.dir)
}

// dialInbound opens a TLS connection to the inbound sidecar as the outbound
// one does (ALPN h2, verifying the server's identity), presenting cert
// (none when nil), and completes the handshake with a first read.
func (p *haproxyPair) dialInbound(cert *tls.Certificate) (*tls.Conn, error) {
	cfg := &tls.Config{ServerName: pairServer, RootCAs: p.anchors, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", p.in.addr, cfg)
	if err != nil {
		return nil, err
	}
	// TLS 1.3 reports a refused client certificate after the client's
	// handshake is done: send the HTTP/2 preface and read the server's
	// SETTINGS, or its alert.
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")); err == nil {
		_, err = c.Read(make([]byte, 9))
		if err != nil {
			c.Close()
			return nil, err
		}
	} else {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// inmeshPair is the same path through inmesh: the outbound stack in the
// client's process, the inbound stack around the application in the
// server's, meshed mTLS (upgraded to HTTP/2) between them.
type inmeshPair struct {
	client *mesh.Client
	url    string
	close  func()
}

func startInmeshPair(server, client *identity.Local) (*inmeshPair, error) {
	mp := newMeter()
	srv := mesh.NewServer(ok, mesh.WithIdentity(server), mesh.WithMeterProvider(mp), mesh.WithLogger(quiet))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return nil, err
	}
	hs := origproto.NewServer(srv)
	go hs.Serve(srv.Listener(lis))
	const authority = "books.default.svc.cluster.local:80"
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		authority: {{Addr: netip.MustParseAddrPort(lis.Addr().String()), H2: true, Identity: pairServer}},
	})
	if err != nil {
		hs.Close()
		srv.Close()
		return nil, err
	}
	c := mesh.NewClient(mesh.WithEndpoints(eps), mesh.WithIdentity(client), mesh.WithMeterProvider(mp), mesh.WithLogger(quiet))
	p := &inmeshPair{client: c, url: "http://" + authority + "/books/1", close: func() {
		c.Close()
		hs.Close()
		srv.Close()
		mp.Shutdown(context.Background())
	}}
	if err := do(c, get(p.url, "")); err != nil {
		p.close()
		return nil, fmt.Errorf("inmesh pair: %w", err)
	}
	return p, nil
}

// sidecarPair: the whole mesh path a user would otherwise deploy, client
// -> HAProxy (outbound sidecar) -> HAProxy (inbound sidecar) -> app, with
// mTLS between the sidecars, against inmesh's outbound stack in the
// client and inbound stack around the app, with inmesh's mTLS between
// them: throughput at 64 clients, and p50/p99 at a fixed rate.
func sidecarPair(o options) (*result, error) {
	server, client, pki, err := pairPKI()
	if err != nil {
		return nil, err
	}
	app := serve(&http.Server{Handler: ok})
	defer app.Close()
	hp, err := startHAProxyPair(app.addr(), server, client, pki)
	if errors.Is(err, errNoHAProxy) {
		return &result{Skipped: err.Error()}, nil
	} else if err != nil {
		return nil, err
	}
	defer hp.stop()
	im, err := startInmeshPair(server, client)
	if err != nil {
		return nil, err
	}
	defer im.close()
	rt := h1Transport()
	defer rt.CloseIdleConnections()
	hpURL := "http://" + hp.out.addr + "/books/1"
	n := o.scale(10000, 3000)
	rate, fixed := o.scale(2000, 1000), o.scale(3000, 1000)
	vs := []variant{
		{"haproxy_64", withConns(app, func() (figures, error) {
			return parallel(rt, func() *http.Request { return get(hpURL, "") }, n, 64, false)
		})},
		{"inmesh_64", func() (figures, error) {
			return parallel(im.client, func() *http.Request { return get(im.url, "") }, n, 64, false)
		}},
		{"haproxy_rate", func() (figures, error) {
			return fixedRate(rt, func() *http.Request { return get(hpURL, "") }, rate, fixed)
		}},
		{"inmesh_rate", func() (figures, error) {
			return fixedRate(im.client, func() *http.Request { return get(im.url, "") }, rate, fixed)
		}},
	}
	rs, err := interleave(o.roundsAtMost(7), vs...)
	if err != nil {
		return nil, err
	}
	const hp64, im64, hpRate, imRate = 0, 1, 2, 3
	r := &result{
		ratio:     rs.ratio("", atLeast(1.0), func(f []figures) float64 { return f[im64].RPS / f[hp64].RPS }),
		Candidate: rs.median(im64), Baseline: rs.median(hp64),
		Others: map[string]figures{"haproxy_rate": *rs.median(hpRate), "inmesh_rate": *rs.median(imRate)},
		Extra: []ratio{
			rs.ratio(fmt.Sprintf("p99 at %d req/s: inmesh / haproxy pair", rate), atMost(1.0), func(f []figures) float64 { return f[imRate].P99 / f[hpRate].P99 }),
			rs.ratio(fmt.Sprintf("p50 at %d req/s: inmesh / haproxy pair", rate), noGoal, func(f []figures) float64 { return f[imRate].P50 / f[hpRate].P50 }),
		},
	}
	hpR, imR := rs.median(hpRate), rs.median(imRate)
	r.Note = fmt.Sprintf("ratio = requests/s through inmesh's two stacks / through two HAProxy %s sidecars (64 clients); at %d req/s (open loop): p50 %s / p99 %s through inmesh, p50 %s / p99 %s through HAProxy; "+
		"HAProxy: HTTP/1 client -> outbound, h2 over mTLS (ALPN h2) between the sidecars, HTTP/1 keep-alive to the app (%d upstream connections); inmesh: the client calls its outbound stack in process, HTTP/1 upgraded to h2 over meshed mTLS to the inbound stack, which calls the app in process",
		haproxyVersion(), rate, dur(imR.P50), dur(imR.P99), dur(hpR.P50), dur(hpR.P99), app.conns.Load())
	return r, nil
}

// haproxyVersion is the installed HAProxy's version, "" if unknown.
func haproxyVersion() string {
	bin, err := haproxyBin()
	if err != nil {
		return ""
	}
	out, _ := exec.Command(bin, "-v").Output()
	var v string
	_, _ = fmt.Sscanf(string(out), "HAProxy version %s", &v)
	return v
}

// fixedRate sends n requests at rate a second, each from its own
// goroutine at its scheduled time whatever the earlier ones are doing
// (open loop: a slow response delays no later request), and reports the
// latency percentiles, each measured from the request's start, and the
// rate achieved.
func fixedRate(rt http.RoundTripper, req func() *http.Request, rate, n int) (figures, error) {
	n = sized(n)
	interval := time.Second / time.Duration(rate)
	lat := make([]time.Duration, n)
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		if firstErr.Load() != nil {
			break
		}
		wg.Add(1)
		t0 := time.Now()
		go func() {
			defer wg.Done()
			if err := do(rt, req()); err != nil {
				firstErr.CompareAndSwap(nil, &err)
				return
			}
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if e := firstErr.Load(); e != nil {
		return figures{}, *e
	}
	f := figures{RPS: float64(n) / el.Seconds()}
	f.P50, f.P99 = percentiles(lat)
	return f, nil
}
