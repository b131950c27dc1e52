// Package transport builds the net/http transports underneath inmesh's
// outbound stacks, so that every one of them bounds its connections the same
// way: idle connections are closed after a timeout, and the idle pool is
// capped in total and per host.
package transport

import (
	"net"
	"net/http"
	"time"
)

// The defaults of [Limits]' zero fields.
const (
	// DefaultIdleConnTimeout is how long an idle connection is kept.
	DefaultIdleConnTimeout = 90 * time.Second
	// DefaultMaxIdleConns caps the idle HTTP/1 connections of a transport
	// across all hosts.
	DefaultMaxIdleConns = 1000
	// DefaultMaxIdleConnsPerHost caps the idle HTTP/1 connections to one
	// host.
	DefaultMaxIdleConnsPerHost = 64
	// MaxResponseHeaderBytes bounds the response head a peer may send.
	MaxResponseHeaderBytes = 64 << 10
)

// Limits are the connection bounds of a transport. A zero or negative field
// takes its default.
type Limits struct {
	IdleConnTimeout     time.Duration
	MaxIdleConns        int
	MaxIdleConnsPerHost int
}

func (l Limits) withDefaults() Limits {
	if l.IdleConnTimeout <= 0 {
		l.IdleConnTimeout = DefaultIdleConnTimeout
	}
	if l.MaxIdleConns <= 0 {
		l.MaxIdleConns = DefaultMaxIdleConns
	}
	if l.MaxIdleConnsPerHost <= 0 {
		l.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	if l.MaxIdleConnsPerHost > l.MaxIdleConns {
		l.MaxIdleConnsPerHost = l.MaxIdleConns
	}
	return l
}

// Dialer returns the dialer of the transports here, Go's default
// transport's.
func Dialer() *net.Dialer { return &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second} }

// HTTP1 returns an HTTP/1-only transport with the bounds l. It uses no
// proxy from the environment: a mesh sends to the address it resolved.
func HTTP1(l Limits) *http.Transport {
	l = l.withDefaults()
	t := &http.Transport{
		DialContext:            Dialer().DialContext,
		Protocols:              new(http.Protocols),
		IdleConnTimeout:        l.IdleConnTimeout,
		MaxIdleConns:           l.MaxIdleConns,
		MaxIdleConnsPerHost:    l.MaxIdleConnsPerHost,
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		DisableCompression:     true, // see H2
	}
	t.Protocols.SetHTTP1(true)
	return t
}

// H2 returns an HTTP/2 transport without TLS (prior knowledge) that keeps
// one connection per peer, closed after l.IdleConnTimeout without streams.
// Dials to a peer are not made in parallel, so a burst of requests on a cold
// start shares one connection rather than racing to open many.
func H2(l Limits) *http.Transport {
	l = l.withDefaults()
	t := &http.Transport{
		DialContext:            Dialer().DialContext,
		Protocols:              new(http.Protocols),
		MaxConnsPerHost:        1,
		IdleConnTimeout:        l.IdleConnTimeout,
		MaxIdleConns:           l.MaxIdleConns,
		MaxIdleConnsPerHost:    l.MaxIdleConnsPerHost,
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
		// A mesh adds no header of its own: a request goes with the
		// Accept-Encoding its client sent, or none, and its response
		// comes back as the server encoded it.
		DisableCompression: true,
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerConnection: 4 << 20,
			MaxReceiveBufferPerStream:     1 << 20,
		},
	}
	t.Protocols.SetUnencryptedHTTP2(true)
	return t
}
