package origproto

import (
	"net/http"
	"time"
)

// NewServer returns an http.Server for h that serves HTTP/1.1 and HTTP/2
// without TLS (prior knowledge; never the h2c Upgrade dance) on one
// listener, with limits for a proxy facing other proxies: 64 KiB of request
// headers, a 10s deadline for them, idle connections closed after 2
// minutes, and up to 1000 concurrent streams per HTTP/2 connection. Stop it
// with Shutdown, which drains requests in flight.
func NewServer(h http.Handler) *http.Server {
	srv := &http.Server{
		Handler:           h,
		Protocols:         new(http.Protocols),
		MaxHeaderBytes:    64 << 10,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          1000,
			MaxDecoderHeaderTableSize:     4096,
			MaxReceiveBufferPerConnection: 4 << 20,
			MaxReceiveBufferPerStream:     1 << 20,
		},
	}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv
}
