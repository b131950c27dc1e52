//go:build !linux

package destination

import (
	"net"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not known.
func setUserTimeout(*net.TCPConn, time.Duration) error { return nil }
