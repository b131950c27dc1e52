//go:build linux

package origproto

import (
	"crypto/tls"
	"net"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/require"
)

// gatedConn holds its reads until gate closes, so that the client's
// handshake reads nothing of the server's flight.
type gatedConn struct {
	net.Conn
	gate chan struct{}
}

func (c *gatedConn) Read(b []byte) (int, error) { <-c.gate; return c.Conn.Read(b) }

// The server closed (Server.Close, or Shutdown closing a connection still
// new) while a meshed client's TLS handshake is in flight: the connection
// is closed from another goroutine than the one handshaking, which the
// race detector checks. The test waits for the server's first flight
// without reading it (by the socket's count of unread bytes): a read would
// order the server's handshake before the close and hide a race.
func TestCloseDuringMeshTLSHandshake(t *testing.T) {
	server, client, _ := certifiedPair(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(nil)
	srv.ErrorLog = quietLogger
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(GuardListener(MeshTLSListener(lis, server))) }()

	raw, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	defer raw.Close()
	gate := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tls.Client(&gatedConn{Conn: raw, gate: gate}, client.ClientConfig(server.Name())).Handshake()
	}()
	rc, err := raw.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	deadline := time.Now().Add(testutil.Timeout)
	for n := int32(0); n == 0; {
		require.True(t, time.Now().Before(deadline), "the server's first flight never came")
		require.NoError(t, rc.Control(func(fd uintptr) {
			_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
		}))
	}
	require.NoError(t, srv.Close())
	close(gate)
	<-done
	<-served
}
