package destination

import (
	"net"
	"syscall"
	"time"
)

// setUserTimeout bounds how long data written to c may go unacknowledged
// before the kernel drops the connection (TCP_USER_TIMEOUT), as gRPC does
// for a connection with keepalive; gRPC itself cannot here, since the
// client's dialer hands it the connection wrapped.
func setUserTimeout(c *net.TCPConn, d time.Duration) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d/time.Millisecond))
	}); err != nil {
		return err
	}
	return serr
}

// tcpUserTimeout is Linux's TCP_USER_TIMEOUT socket option (linux/tcp.h),
// which package syscall does not name.
const tcpUserTimeout = 0x12
