package faults

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	inmesh "github.com/inmesh/inmesh/mesh"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	xcredentials "google.golang.org/grpc/experimental/credentials"
)

// heldListener keeps one loopback listener open across the lives of the
// servers served on it, as a restarted control plane finds its address:
// while no server is attached, connections are accepted and closed at
// once, as a machine answers for a process that is gone.
type heldListener struct {
	ln  net.Listener
	mu  sync.Mutex
	cur *attached
}

type attached struct {
	h     *heldListener
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func holdListener(t *testing.T) *heldListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := &heldListener{ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			a := h.cur
			h.mu.Unlock()
			if a == nil {
				c.Close()
				continue
			}
			select {
			case a.conns <- c:
			case <-a.done:
				c.Close()
			}
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return h
}

// attach returns a listener for the next server.
func (h *heldListener) attach() net.Listener {
	a := &attached{h: h, conns: make(chan net.Conn), done: make(chan struct{})}
	h.mu.Lock()
	h.cur = a
	h.mu.Unlock()
	return a
}

func (a *attached) Accept() (net.Conn, error) {
	select {
	case c := <-a.conns:
		return c, nil
	case <-a.done:
		return nil, net.ErrClosed
	}
}

// Close detaches the server: the held listener stays open.
func (a *attached) Close() error {
	a.once.Do(func() {
		close(a.done)
		a.h.mu.Lock()
		if a.h.cur == a {
			a.h.cur = nil
		}
		a.h.mu.Unlock()
	})
	return nil
}

func (a *attached) Addr() net.Addr { return a.h.ln.Addr() }

// identityService is an embedded control plane's Identity API: an issuer
// of p and the service's own certificate, served on a held listener.
type identityService struct {
	p      *pki
	tokens controlplane.StaticTokens
	life   time.Duration
	lis    *heldListener
	srv    *grpc.Server
}

const identitySvcName = "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"

// start starts the control plane anew: a new Issuer over the same CA, its
// own certificate issued anew, served on the held listener.
func (s *identityService) start(t *testing.T) {
	t.Helper()
	issuer := s.p.newIssuer(t, s.tokens, controlplane.WithIssuanceLifetime(s.life), controlplane.WithClockSkew(0))
	self := s.p.local(t, identitySvcName)
	s.srv = grpc.NewServer(grpc.Creds(xcredentials.NewTLSWithALPNDisabled(self.ServerConfig())))
	issuer.Register(s.srv)
	go s.srv.Serve(s.lis.attach())
}

// stop stops it: its connections are closed and new ones are refused.
func (s *identityService) stop() { s.srv.Stop() }

func serialOf(l *identity.Local) string {
	if c := l.Certificate(); c != nil && c.Leaf != nil {
		return c.Leaf.SerialNumber.String()
	}
	return ""
}

// The control plane goes away just before the proxies' certificates are
// due for renewal (a lifetime of 12 s, renewed at 70%: after 8.4 s) and
// comes back on the same address before they expire. The two meshed
// stacks' certifiers keep retrying meanwhile; no request between them
// fails and no new mTLS handshake fails while the current certificates are
// valid, and once the control plane is back, renewal succeeds: both hold
// certificates with new serials. With INMESH_FULL=1, five renewals in a
// row each meet a restart. Last, the control plane stays away until the
// certificates have expired: once it is back, they are renewed.
func TestControlPlaneRestartDuringRenewal(t *testing.T) {
	const life = 12 * time.Second
	p := newPKI(t)
	svc := &identityService{p: p, life: life, lis: holdListener(t),
		tokens: controlplane.StaticTokens{"books-token": booksID, "web-token": webID}}
	svc.start(t)
	t.Cleanup(func() { svc.stop() })
	idAddr := svc.lis.ln.Addr().String()

	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	t.Cleanup(bg.Wait)
	t.Cleanup(cancel)
	var certFailures atomic.Int64
	certify := func(name, token string) *identity.Local {
		l, err := identity.NewLocal(name, p.anchors)
		require.NoError(t, err)
		cc, err := grpc.NewClient("passthrough:///"+idAddr, grpc.WithTransportCredentials(l.TransportCredentials(identitySvcName)))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		tokenFile := filepath.Join(t.TempDir(), "token")
		require.NoError(t, os.WriteFile(tokenFile, []byte(token), 0o600))
		log := slog.New(countingHandler{&certFailures})
		c := identity.NewCertifier(l, cc, tokenFile, identity.WithLogger(log), identity.WithRefreshBounds(100*time.Millisecond, time.Hour),
			identity.WithMeterProvider(noop.NewMeterProvider()))
		bg.Add(1)
		go func() { defer bg.Done(); _ = c.Run(ctx) }()
		select {
		case <-l.Ready():
		case <-time.After(timeout):
			t.Fatalf("%s was never certified", name)
		}
		return l
	}
	books, web := certify(booksID, "books-token"), certify(webID, "web-token")

	var reached atomic.Int64
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if got := r.Header.Get("L5d-Client-Id"); got != webID {
			http.Error(w, "client id "+got, http.StatusForbidden)
		}
	})
	srv := inmesh.NewServer(app, inmesh.WithIdentity(books), inmesh.WithMeterProvider(noop.NewMeterProvider()), inmesh.WithLogger(quiet))
	t.Cleanup(srv.Close)
	addr := serveInbound(t, srv)
	const authority = "books.default.svc.cluster.local:7000"
	hc := &http.Client{Transport: meshClient(t, authority, addr, booksID, inmesh.WithIdentity(web)), Timeout: 10 * time.Second}

	// Requests through the stacks and fresh mTLS handshakes between the
	// identities, without a pause, counting the failures.
	var failures, served, handshakes atomic.Int64
	var mu sync.Mutex
	var samples []string
	fail := func(s string) {
		failures.Add(1)
		mu.Lock()
		if len(samples) < 5 {
			samples = append(samples, s)
		}
		mu.Unlock()
	}
	stop := make(chan struct{})
	var traffic sync.WaitGroup
	traffic.Add(2)
	go func() {
		defer traffic.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if code, err := get(context.Background(), hc, authority, authority, "/books/1"); err != nil || code != 200 {
				fail(fmt.Sprint("request: ", code, err))
			} else {
				served.Add(1)
			}
		}
	}()
	go func() {
		defer traffic.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, web.ClientConfig(booksID))
			if err != nil {
				fail(fmt.Sprint("handshake: ", err, " (books expires ", books.Expiry(), ", web expires ", web.Expiry(), ")"))
			} else {
				c.Close()
				handshakes.Add(1)
			}
			time.Sleep(20 * time.Millisecond) // a pace, not a synchronisation
		}
	}()

	for round := range size(5, 1) {
		oldBooks, oldWeb := serialOf(books), serialOf(web)
		expiry := books.Expiry()
		if e := web.Expiry(); e.Before(expiry) {
			expiry = e
		}
		// Stop the control plane; it stays away until both certifiers
		// have found it gone at renewal time (a few failed attempts).
		svc.stop()
		before := certFailures.Load()
		require.Eventually(t, func() bool { return certFailures.Load() >= before+4 }, timeout, 20*time.Millisecond,
			"round %d: the certifiers never tried to renew", round)
		require.True(t, time.Now().Before(expiry), "round %d: the certificates expired before the control plane came back", round)
		svc.start(t)
		require.Eventually(t, func() bool {
			return serialOf(books) != oldBooks && serialOf(web) != oldWeb
		}, timeout, 20*time.Millisecond, "round %d: no renewal after the restart", round)
		t.Logf("round %d: %d failed certifications while the control plane was away; renewed %s to %s, %s to %s with %v left",
			round, certFailures.Load()-before, oldBooks[:8], serialOf(books)[:8], oldWeb[:8], serialOf(web)[:8],
			time.Until(expiry).Round(100*time.Millisecond))
	}
	close(stop)
	traffic.Wait()
	t.Logf("%d requests served, %d handshakes, %d failures", served.Load(), handshakes.Load(), failures.Load())
	assert.Positive(t, served.Load())
	assert.Positive(t, handshakes.Load())
	assert.Zero(t, failures.Load(), "failures while the certificates were valid, e.g. %v", samples)

	// Away for longer than the lifetime: once the control plane is back,
	// the expired certificates are renewed and handshakes succeed again.
	oldBooks, oldWeb := serialOf(books), serialOf(web)
	svc.stop()
	require.Eventually(t, func() bool { return time.Now().After(books.Expiry()) && time.Now().After(web.Expiry()) },
		2*life, 50*time.Millisecond, "the certificates never expired")
	svc.start(t)
	require.Eventually(t, func() bool {
		return serialOf(books) != oldBooks && serialOf(web) != oldWeb
	}, timeout, 20*time.Millisecond, "no renewal after the certificates expired")
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, web.ClientConfig(booksID))
	require.NoError(t, err, "a handshake after the renewal")
	c.Close()
}

// countingHandler counts the records logged (a Certifier logs only its
// failures).
type countingHandler struct{ n *atomic.Int64 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }
