package transport

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An h2c peer whose handler holds every request until release is closed,
// counting its connections and the requests it holds.
type heldPeer struct {
	srv     *httptest.Server
	conns   atomic.Int32
	held    atomic.Int32
	release chan struct{}
}

func newHeldPeer(t *testing.T) *heldPeer {
	p := &heldPeer{release: make(chan struct{})}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/held" {
			p.held.Add(1)
			<-p.release
		}
		_, _ = io.WriteString(w, "ok")
	}))
	p.srv.Config.Protocols = new(http.Protocols)
	p.srv.Config.Protocols.SetUnencryptedHTTP2(true)
	p.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			p.conns.Add(1)
		}
	}
	p.srv.Start()
	t.Cleanup(p.srv.Close)
	return p
}

// send sends n requests to path at once and returns a function that waits
// for them and checks their answers.
func send(t *testing.T, rt http.RoundTripper, url string, n int) func() {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequest("GET", url, nil)
			if err == nil {
				var resp *http.Response
				if resp, err = rt.RoundTrip(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					err = resp.Body.Close()
				}
			}
			errs <- err
		}()
	}
	return func() {
		wg.Wait()
		close(errs)
		for err := range errs {
			assert.NoError(t, err)
		}
	}
}

// A cold burst shares one connection; once that connection has answered,
// requests past DefaultStreamsPerConn waiting on it go on a second one,
// and never on a third.
func TestH2PoolOpensASecondConnectionOnlyWhenTheFirstIsBusy(t *testing.T) {
	p := newHeldPeer(t)
	pool := NewH2Pool(Limits{})
	defer pool.CloseIdleConnections()

	wait := send(t, pool, p.srv.URL+"/held", 3*DefaultStreamsPerConn)
	require.Eventually(t, func() bool { return p.held.Load() == 3*DefaultStreamsPerConn }, 20*time.Second, 5*time.Millisecond)
	assert.Equal(t, int32(1), p.conns.Load(), "a cold burst opened more than one connection")
	close(p.release)
	wait()

	// Few requests at a time: one connection, however many are sent.
	for range 20 {
		send(t, pool, p.srv.URL+"/", DefaultStreamsPerConn/2)()
	}
	assert.Equal(t, int32(1), p.conns.Load(), "a connection with spare streams was not used")

	p.release = make(chan struct{})
	p.held.Store(0)
	wait = send(t, pool, p.srv.URL+"/held", 3*DefaultConnsPerPeer*DefaultStreamsPerConn)
	require.Eventually(t, func() bool { return p.held.Load() == 3*DefaultConnsPerPeer*DefaultStreamsPerConn }, 20*time.Second, 5*time.Millisecond)
	assert.Equal(t, int32(DefaultConnsPerPeer), p.conns.Load(), "connections to the peer while the first is busy")
	close(p.release)
	wait()
}

// Requests to another peer are not held back by a busy one: each peer
// gets its own connections.
func TestH2PoolPeersHaveTheirOwnConnections(t *testing.T) {
	a, b := newHeldPeer(t), newHeldPeer(t)
	pool := NewH2PoolSize(Limits{}, 1, 1)
	defer pool.CloseIdleConnections()
	wait := send(t, pool, a.srv.URL+"/held", 4)
	require.Eventually(t, func() bool { return a.held.Load() == 4 }, 20*time.Second, 5*time.Millisecond)
	send(t, pool, b.srv.URL+"/", 4)()
	close(a.release)
	wait()
	assert.Equal(t, int32(1), a.conns.Load())
	assert.Equal(t, int32(1), b.conns.Load())
}
