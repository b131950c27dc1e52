package mesh

import (
	"net/http"
	"time"

	"github.com/inmesh/inmesh/internal/transport"
)

// The connection bounds of [NewClient]'s transports, unless an option
// changes them.
const (
	// DefaultIdleConnTimeout is how long an idle connection to an endpoint
	// or a fallback address is kept before it is closed. The connections
	// to an endpoint that left discovery's answers (of every Service that
	// had it) are closed sooner: once its last request in flight ends.
	DefaultIdleConnTimeout = transport.DefaultIdleConnTimeout
	// DefaultMaxIdleConns caps the idle HTTP/1 connections across all hosts.
	DefaultMaxIdleConns = transport.DefaultMaxIdleConns
	// DefaultMaxIdleConnsPerHost caps the idle HTTP/1 connections to one
	// host.
	DefaultMaxIdleConnsPerHost = transport.DefaultMaxIdleConnsPerHost
)

// WithIdleConnTimeout sets how long the outbound stack keeps an idle
// connection, HTTP/1 or HTTP/2 (default [DefaultIdleConnTimeout]); d <= 0
// changes nothing.
func WithIdleConnTimeout(d time.Duration) ClientOption {
	return clientOption(func(c *config) {
		if d > 0 {
			c.conns.IdleConnTimeout = d
		}
	})
}

// WithMaxIdleConns caps the idle HTTP/1 connections of the outbound stack in
// total and per host (defaults [DefaultMaxIdleConns] and
// [DefaultMaxIdleConnsPerHost]); a value <= 0 keeps its default. Past the
// cap, a connection returned to the pool is closed.
func WithMaxIdleConns(total, perHost int) ClientOption {
	return clientOption(func(c *config) {
		if total > 0 {
			c.conns.MaxIdleConns = total
		}
		if perHost > 0 {
			c.conns.MaxIdleConnsPerHost = perHost
		}
	})
}

// transports returns the HTTP/1 and HTTP/2 transports at the bottom of the
// outbound stack, with the configured bounds (the HTTP/2 one is what
// origproto.NewH2Transport returns, with the same idle timeout). The
// HTTP/1 one, which also carries the requests that fall back to their own
// address, is recycled every transport.DefaultMaxHosts distinct hosts, so
// that a flood of Hosts leaves no per-host state behind in net/http.
func (c config) transports() (h1 *transport.Recycling, h2 *http.Transport) {
	h1 = transport.NewRecycling(func() *http.Transport {
		t := transport.HTTP1(c.conns)
		if c.dial != nil {
			t.DialContext = c.dial
		}
		return t
	}, 0)
	h2 = transport.H2(c.conns)
	if c.dial != nil {
		h2.DialContext = c.dial
	}
	return h1, h2
}
