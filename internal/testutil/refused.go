package testutil

import (
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// RefusedAddr returns a loopback address whose port refuses every
// connection, as a process that died leaves it: a TCP socket bound to it
// and never listening. The socket holds the port until the end of the
// test, so no other listener takes it.
func RefusedAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	in, ok := sa.(*syscall.SockaddrInet4)
	require.True(t, ok, "bound %T", sa)
	return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port))
}

// RefusedUntilListen returns a loopback address that refuses every
// connection, as [RefusedAddr]'s does, until listen is called: from then
// on it listens, and listen returns the listener, closed at the end of
// the test (a server that was not up yet when its clients first dialled).
// The port is held from the start to the end of the test; listen may be
// called once.
func RefusedUntilListen(t testing.TB) (_ netip.AddrPort, listen func() net.Listener) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	var once sync.Once
	closeFD := func() { once.Do(func() { syscall.Close(fd) }) }
	t.Cleanup(closeFD)
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	in, ok := sa.(*syscall.SockaddrInet4)
	require.True(t, ok, "bound %T", sa)
	listen = func() net.Listener {
		t.Helper()
		require.NoError(t, syscall.Listen(fd, syscall.SOMAXCONN))
		f := os.NewFile(uintptr(fd), "listener")
		lis, err := net.FileListener(f) // a copy of fd
		once.Do(func() { f.Close() })
		require.NoError(t, err)
		t.Cleanup(func() { lis.Close() })
		return lis
	}
	return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)), listen
}
