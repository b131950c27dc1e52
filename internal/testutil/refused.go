package testutil

import (
	"net/netip"
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
