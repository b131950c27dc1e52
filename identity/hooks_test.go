package identity

import "time"

// SetCertifyTimeout bounds each Certify call by d until the returned
// function restores the bound.
func SetCertifyTimeout(d time.Duration) (restore func()) {
	prev := certifyTimeout
	certifyTimeout = d
	return func() { certifyTimeout = prev }
}
