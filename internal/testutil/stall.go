package testutil

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// StallProxy forwards TCP connections to a target until stall; from then
// on it reads and drops every byte and closes nothing: what a client sees
// of a replica whose host went away without a FIN or RST (power lost, a
// partition) or whose process froze.
type StallProxy struct {
	lis     net.Listener // its address is Addr
	stalled chan struct{}
	once    sync.Once
}

// Stall makes the proxy go silent.
func (p *StallProxy) Stall() { p.once.Do(func() { close(p.stalled) }) }

// StartStallProxy starts a StallProxy to target on loopback, stopped when
// the test ends.
func StartStallProxy(t testing.TB, target string) *StallProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &StallProxy{lis: lis, stalled: make(chan struct{})}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if err != nil {
				dst.Close()
				return
			}
			select {
			case <-p.stalled:
				continue
			default:
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			wg.Add(2)
			go pipe(u, c)
			go pipe(c, u)
		}
	}()
	return p
}

// Addr is the proxy's address.
func (p *StallProxy) Addr() string { return p.lis.Addr().String() }

// AcceptAndClose listens on loopback until the test ends and closes every
// connection it accepts at once: a port whose server takes connections and
// refuses everything on them. It returns the address and the count of
// connections accepted so far.
func AcceptAndClose(t testing.TB) (netip.AddrPort, *atomic.Int64) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var accepted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { lis.Close(); <-done })
	return netip.MustParseAddrPort(lis.Addr().String()), &accepted
}
