package backoff

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DialFunc is the shape of [net.Dialer.DialContext], of
// [net/http.Transport.DialContext], and (with the network fixed) of gRPC's
// context dialer.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// maxTrackedAddrs bounds the failure records a Dialer keeps; past it the
// oldest record is forgotten, which at worst lets one address be dialled
// early.
const maxTrackedAddrs = 4096

// Dialer wraps a dial function so that, after a dial to an address fails, the
// next dial to that address first waits out the policy's delay; each further
// failure lengthens the delay and a success resets it. A dialled
// connection is a success once the peer has sent it a byte, and a failure
// if the peer closes or resets it before: an address that accepts
// connections and closes them at once (a load balancer without a healthy
// backend, a server shutting down) is held back like one that refuses
// them. Until either, the connection changes nothing, so that a protocol
// in which the client speaks first (HTTP/1) is not held back while its
// server has not answered yet, nor is one the client closed itself. Dials to other addresses are not held back. The wait is on a timer owned by the dialling goroutine and ends at
// once when the dial's context is cancelled.
//
// A Dialer is safe for concurrent use. Its zero value dials with a plain
// [net.Dialer] and [DefaultPolicy].
type Dialer struct {
	// Dial makes the connection; nil means a zero net.Dialer's DialContext.
	Dial DialFunc
	// Policy sets the delays; the zero value means DefaultPolicy.
	Policy Policy

	mu    sync.Mutex
	state map[string]*dialState
}

type dialState struct {
	failures  int
	notBefore time.Time
}

// NewDialer returns a Dialer that dials with dial (nil: net.Dialer) under p.
func NewDialer(dial DialFunc, p Policy) *Dialer { return &Dialer{Dial: dial, Policy: p} }

// DialContext waits until addr may be dialled again, then dials it.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	key := network + " " + addr
	if err := d.waitTurn(ctx, key); err != nil {
		return nil, err
	}
	dial := d.Dial
	if dial == nil {
		var nd net.Dialer
		dial = nd.DialContext
	}
	conn, err := dial(ctx, network, addr)
	if err != nil {
		d.record(key, false)
		return nil, err
	}
	return &provingConn{Conn: conn, d: d, key: key}, nil
}

// provingConn records its address's success when the peer first sends a
// byte, or a failure when its first read ends without one.
type provingConn struct {
	net.Conn
	d       *Dialer
	key     string
	decided atomic.Bool
}

func (c *provingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 || err != nil {
		if !c.decided.Load() && c.decided.CompareAndSwap(false, true) {
			switch {
			case n > 0:
				c.d.record(c.key, true)
			case peerEnded(err):
				c.d.record(c.key, false)
			}
			// The client's own end of the read (its Close, its
			// deadline) says nothing of the peer.
		}
	}
	return n, err
}

// peerEnded reports whether a read's error is the peer's end of the
// connection: its close or its reset.
func peerEnded(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNABORTED)
}

// DialGRPC dials a TCP address; it has the shape grpc.WithContextDialer
// takes.
func (d *Dialer) DialGRPC(ctx context.Context, addr string) (net.Conn, error) {
	return d.DialContext(ctx, "tcp", addr)
}

// Failures returns the number of consecutive failed dials to addr on network.
func (d *Dialer) Failures(network, addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.state[network+" "+addr]; s != nil {
		return s.failures
	}
	return 0
}

func (d *Dialer) waitTurn(ctx context.Context, key string) error {
	d.mu.Lock()
	var wait time.Duration
	if s := d.state[key]; s != nil {
		wait = time.Until(s.notBefore)
	}
	d.mu.Unlock()
	return Wait(ctx, wait)
}

func (d *Dialer) record(key string, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ok {
		delete(d.state, key)
		return
	}
	if d.state == nil {
		d.state = make(map[string]*dialState)
	}
	s := d.state[key]
	if s == nil {
		if len(d.state) >= maxTrackedAddrs {
			d.forgetOldest()
		}
		s = &dialState{}
		d.state[key] = s
	}
	s.notBefore = time.Now().Add(d.Policy.Delay(s.failures))
	s.failures++
}

func (d *Dialer) forgetOldest() {
	var oldest string
	var at time.Time
	for k, s := range d.state {
		if oldest == "" || s.notBefore.Before(at) {
			oldest, at = k, s.notBefore
		}
	}
	delete(d.state, oldest)
}
