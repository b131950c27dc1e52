package faults

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	inmesh "github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// The tests in this file's siblings that run the library's stacks in the
// test process (rather than the example binaries) measure the process's
// own goroutines and heap.

const (
	webID   = "web.default.serviceaccount.identity.linkerd.cluster.local"
	booksID = "books.default.serviceaccount.identity.linkerd.cluster.local"
)

var quiet = slog.New(slog.DiscardHandler)

// pki is a trust anchor with an issuer under it.
type pki struct {
	anchors *x509.CertPool
	issuer  *controlplane.CA
}

// newPKI makes a new trust anchor and issuer CA.
func newPKI(t *testing.T) *pki {
	t.Helper()
	root, err := controlplane.NewRootCA("root.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	iss, err := root.NewIntermediate("identity.linkerd.cluster.local", time.Hour)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(root.Cert)
	return &pki{anchors: pool, issuer: iss}
}

// newIssuer returns an issuer of p taking tokens.
func (p *pki) newIssuer(t *testing.T, tokens controlplane.TokenValidator, opts ...controlplane.IssuerOption) *controlplane.Issuer {
	t.Helper()
	i, err := controlplane.NewIssuer(p.anchors, [][]byte{p.issuer.DER}, p.issuer.Key, tokens,
		append([]controlplane.IssuerOption{controlplane.WithIssuerLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	return i
}

// local returns name's identity certified directly by p's issuer for an
// hour.
func (p *pki) local(t *testing.T, name string) *identity.Local {
	t.Helper()
	l, err := identity.NewLocal(name, p.anchors)
	require.NoError(t, err)
	require.NoError(t, p.newIssuer(t, controlplane.StaticTokens{}).CertifyLocal(l))
	return l
}

// serveInbound serves s on a held loopback port with origproto.NewServer
// (meshed TLS beside plaintext with an identity) and returns its address.
func serveInbound(t *testing.T, s *inmesh.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := origproto.NewServer(s)
	go srv.Serve(s.Listener(lis))
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

// meshClient returns an outbound stack whose one authority is served by
// the peer at addr (with the identity id, "" for plaintext).
func meshClient(t *testing.T, authority, addr, id string, opts ...inmesh.ClientOption) *inmesh.Client {
	t.Helper()
	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		authority: {{Addr: netip.MustParseAddrPort(addr), H2: true, Identity: id}},
	})
	require.NoError(t, err)
	c := inmesh.NewClient(append([]inmesh.ClientOption{inmesh.WithEndpoints(src), inmesh.WithMeterProvider(noop.NewMeterProvider()),
		inmesh.WithLogger(quiet), inmesh.WithBalancerOptions(balancer.WithFallback(false))}, opts...)...)
	t.Cleanup(c.Close)
	return c
}

// self is what the test process holds: goroutines and heap in use.
type self struct {
	goroutines int
	heapMiB    float64
}

func (s self) String() string {
	return fmt.Sprintf("%d goroutines, heap in use %.1f MiB", s.goroutines, s.heapMiB)
}

func measure() self {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return self{runtime.NumGoroutine(), float64(ms.HeapInuse) / (1 << 20)}
}

// backToBaseline waits (generously) until the process's goroutines and
// heap are back near base; while waiting, ping keeps the stacks serving.
func backToBaseline(t *testing.T, base self, goroutines int, heapMiB float64, ping func()) {
	t.Helper()
	var now self
	assert.Eventually(t, func() bool {
		if ping != nil {
			ping()
		}
		now = measure()
		return now.goroutines <= base.goroutines+goroutines && now.heapMiB <= base.heapMiB+heapMiB
	}, 30*time.Second, 100*time.Millisecond, "not back: %v (baseline %v)", now, base)
	t.Logf("after: %v (baseline %v)", now, base)
}

// get makes GET path with Host host to addr and drains the answer.
func get(ctx context.Context, hc *http.Client, addr, host, path string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+path, nil)
	if err != nil {
		return 0, err
	}
	req.Host = host
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}
