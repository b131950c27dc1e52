//go:build linux

package destination_test

import (
	"context"
	"math"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
)

func serveEmptyControlPlane(t *testing.T, lis net.Listener) {
	g := grpc.NewServer()
	controlplane.NewServer(controlplane.NewStore()).Register(g)
	done := make(chan struct{})
	go func() { defer close(done); g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
}

func waitEndpoints(t *testing.T, c *destination.Client) {
	got := make(chan struct{}, 1)
	stop, err := c.WatchEndpoints(context.Background(), "books.default.svc.cluster.local:7000", func(endpoint.Update) {
		select {
		case got <- struct{}{}:
		default:
		}
	})
	require.NoError(t, err)
	t.Cleanup(stop)
	select {
	case <-got:
	case <-time.After(testutil.Timeout):
		t.Fatal("no update")
	}
}

func userTimeoutOf(t *testing.T, tc *net.TCPConn) int {
	raw, err := tc.SyscallConn()
	require.NoError(t, err)
	var v int
	var gerr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, 0x12 /* TCP_USER_TIMEOUT */)
	}))
	require.NoError(t, gerr)
	return v
}

// The client's connections to the control plane have TCP_USER_TIMEOUT at
// the keepalive's timeout with keepalive on, as gRPC sets it on the
// connections it sees bare (it cannot here: the client's dialer hands it
// the connection wrapped, which left it unset), and none with keepalive
// off: WithKeepalive(0, x), or gRPC's own keepalive option through
// WithDialOptions, which gRPC applies last.
func TestKeepaliveTCPUserTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  destination.Option
		want int // ms
	}{
		{"WithKeepalive(1m, 7s)", destination.WithKeepalive(time.Minute, 7*time.Second), 7000},
		{"WithKeepalive(0)", destination.WithKeepalive(0, 7*time.Second), 0},
		{"WithDialOptions(grpc.WithKeepaliveParams(off))", destination.WithDialOptions(grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: time.Duration(math.MaxInt64)})), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			serveEmptyControlPlane(t, lis)
			conns := make(chan *net.TCPConn, 4)
			var d net.Dialer
			c, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quietLogger), tc.opt,
				destination.WithDialFunc(func(ctx context.Context, network, addr string) (net.Conn, error) {
					conn, err := d.DialContext(ctx, network, addr)
					if err == nil {
						conns <- conn.(*net.TCPConn)
					}
					return conn, err
				}))
			require.NoError(t, err)
			defer c.Close()
			waitEndpoints(t, c) // the stream is up: gRPC has set up its transport on the connection
			assert.Equal(t, tc.want, userTimeoutOf(t, <-conns), "TCP_USER_TIMEOUT (ms) of the client's connection")
		})
	}
}

// A custom dial function that returns a unix socket connection works.
func TestUnixDialFuncWithKeepalive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cp.sock")
	lis, err := net.Listen("unix", path)
	require.NoError(t, err)
	serveEmptyControlPlane(t, lis)
	var d net.Dialer
	c, err := destination.Dial("127.0.0.1:1", destination.WithLogger(quietLogger),
		destination.WithDialFunc(func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}))
	require.NoError(t, err)
	defer c.Close()
	waitEndpoints(t, c)
}
