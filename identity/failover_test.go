package identity_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	xcredentials "google.golang.org/grpc/experimental/credentials"
)

// heldListener keeps its port for the whole test: once its server closes
// it, a connection is accepted and closed at once (a replica whose process
// died, on a port nobody else can take).
type heldListener struct {
	net.Listener
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func holdPort(t *testing.T) *heldListener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := &heldListener{Listener: lis, conns: make(chan net.Conn), closed: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			select {
			case h.conns <- c:
			case <-h.closed:
				c.Close()
			}
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		<-done
	})
	return h
}

func (h *heldListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-h.closed:
		return nil, net.ErrClosed
	}
}

func (h *heldListener) Close() error {
	h.once.Do(func() { close(h.closed) })
	return nil
}

// A session given two Identity replicas ("a,b") with the same trust root
// keeps its identity renewed when the replica it uses dies, or goes silent
// without closing the connection (its host lost, its process frozen; the
// keepalive ping goes unanswered): the next renewal goes to the other one.
func TestStartFailsOverToAnotherReplica(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stall bool
	}{{"stopped", false}, {"stalled", true}} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMesh(t)
			svc := m.certified(t, svcName, "svc-token")
			replica := func() (string, *grpc.Server) {
				lis := holdPort(t)
				// Served as the control-plane program serves it.
				srv := grpc.NewServer(append(controlplane.KeepaliveOptions(time.Minute),
					grpc.Creds(xcredentials.NewTLSWithALPNDisabled(svc.ServerConfig())))...)
				m.issuer.Register(srv)
				done := make(chan struct{})
				go func() {
					defer close(done)
					_ = srv.Serve(lis)
				}()
				t.Cleanup(func() {
					srv.Stop()
					<-done
				})
				return lis.Addr().String(), srv
			}
			firstAddr, first := replica()
			secondAddr, _ := replica()
			lose := first.Stop
			cfg := m.config(t, books, booksTok)
			if tc.stall {
				proxy := testutil.StartStallProxy(t, firstAddr)
				firstAddr, lose = proxy.Addr(), proxy.Stall
				cfg.Keepalive, cfg.KeepaliveTimeout = controlplane.MinClientPing, time.Second
			}
			cfg.Addr = firstAddr + "," + secondAddr
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			s, err := identity.Start(ctx, cfg, identity.WithLogger(quiet), identity.WithRefreshBounds(50*time.Millisecond, 100*time.Millisecond))
			require.NoError(t, err)
			defer s.Close()
			l := s.Local()

			lose()
			lost := l.Certificate().Leaf.SerialNumber.String()
			// A stalled replica is left within the keepalive and its
			// timeout.
			require.Eventually(t, func() bool { return l.Certificate().Leaf.SerialNumber.String() != lost },
				controlplane.MinClientPing+timeout, 5*time.Millisecond, "no renewal after the first replica was lost")
		})
	}
}

// A Certify call to a replica that went silent, on a connection nothing
// pings, fails at its deadline and is counted and logged as a failed
// renewal, the certificate kept; before, it held every renewal for ever.
func TestCertifyCallHasADeadline(t *testing.T) {
	m := newMesh(t)
	svc := m.certified(t, svcName, "svc-token")
	// Short, but long enough for the first certification on a loaded
	// machine: only the stalled renewal may end by it.
	defer identity.SetCertifyTimeout(3 * time.Second)()
	lis := holdPort(t)
	srv := grpc.NewServer(append(controlplane.KeepaliveOptions(time.Minute),
		grpc.Creds(xcredentials.NewTLSWithALPNDisabled(svc.ServerConfig())))...)
	m.issuer.Register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	proxy := testutil.StartStallProxy(t, lis.Addr().String())

	cfg := m.config(t, books, booksTok)
	cfg.Addr, cfg.Keepalive = proxy.Addr(), -1 // no pings: only the deadline ends a call
	var logs testutil.LogLines
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := identity.Start(ctx, cfg, identity.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		identity.WithRefreshBounds(50*time.Millisecond, 100*time.Millisecond))
	require.NoError(t, err)
	defer s.Close()
	cert := s.Local().Certificate()

	proxy.Stall()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "DeadlineExceeded") }, timeout, 5*time.Millisecond,
		"a renewal on the silent replica ended by its deadline: %s", &logs)
	assert.Same(t, cert, s.Local().Certificate(), "the certificate stays in use")
}
