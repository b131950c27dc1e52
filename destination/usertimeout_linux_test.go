//go:build linux

package destination_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
)

// With keepalive on, the client's connections to the control plane have
// TCP_USER_TIMEOUT at the keepalive's timeout, as gRPC sets it on the
// connections it sees bare (it cannot here: the client's dialer hands it
// the connection wrapped, which left it unset).
func TestKeepaliveSetsTCPUserTimeout(t *testing.T) {
	store := controlplane.NewStore()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store).Register(g)
	go g.Serve(lis)
	defer g.Stop()

	conns := make(chan *net.TCPConn, 4)
	var d net.Dialer
	c, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quietLogger),
		destination.WithKeepalive(time.Minute, 7*time.Second),
		destination.WithDialFunc(func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err == nil {
				conns <- conn.(*net.TCPConn)
			}
			return conn, err
		}))
	require.NoError(t, err)
	defer c.Close()
	got := make(chan struct{}, 1)
	stop, err := c.WatchEndpoints(context.Background(), "books.default.svc.cluster.local:7000", func(endpoint.Update) {
		select {
		case got <- struct{}{}:
		default:
		}
	})
	require.NoError(t, err)
	defer stop()
	var tc *net.TCPConn
	select {
	case tc = <-conns:
	case <-time.After(testutil.Timeout):
		t.Fatal("no connection")
	}
	<-got // the stream is up: grpc has set up its transport on the conn
	raw, err := tc.SyscallConn()
	require.NoError(t, err)
	var v int
	var gerr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, 0x12 /* TCP_USER_TIMEOUT */)
	}))
	require.NoError(t, gerr)
	assert.Equal(t, 7000, v, "TCP_USER_TIMEOUT (ms) of the destination client's connection")
}
