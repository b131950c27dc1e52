package main

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The HAProxy pair of sidecar_pair is the deployment it claims to be:
// requests go through both sidecars; between them, the inbound sidecar
// speaks h2 over TLS with the server's identity and refuses a client
// without a certificate, or with one from another trust anchor; both stop
// on stop.
func TestHAProxyPairMTLS(t *testing.T) {
	server, client, pki, err := pairPKI()
	require.NoError(t, err)
	app := serve(&http.Server{Handler: ok})
	defer app.Close()
	p, err := startHAProxyPair(app.addr(), server, client, pki)
	if errors.Is(err, errNoHAProxy) {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	require.NoError(t, err)
	stopped := false
	defer func() {
		if !stopped {
			p.stop()
		}
	}()

	rt := h1Transport()
	defer rt.CloseIdleConnections()
	resp, err := rt.RoundTrip(get("http://"+p.out.addr+"/books/1", ""))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "ok", string(body))
	assert.NotZero(t, app.conns.Load(), "the request did not reach the app")

	c, err := p.dialInbound(client.Certificate())
	require.NoError(t, err, "the client's identity")
	st := c.ConnectionState()
	assert.Equal(t, "h2", st.NegotiatedProtocol)
	require.NotEmpty(t, st.PeerCertificates)
	assert.Equal(t, []string{pairServer}, st.PeerCertificates[0].DNSNames)
	c.Close()

	_, err = p.dialInbound(nil)
	assert.Error(t, err, "no client certificate")

	// An identity of another mesh (another trust anchor) with the
	// client's own name.
	other, err := newBenchPKI(pairClient)
	require.NoError(t, err)
	stranger, err := other.certify(pairClient)
	require.NoError(t, err)
	_, err = p.dialInbound(stranger.Certificate())
	assert.Error(t, err, "a client certificate from another trust anchor")

	p.stop()
	stopped = true
	for _, h := range []*haproxy{p.in, p.out} {
		_, gone := h.exited()
		assert.True(t, gone, "haproxy still running after stop")
	}
	_, err = os.Stat(p.dir)
	assert.True(t, os.IsNotExist(err), "the configuration directory is left: %v", err)
}

// fixedRate is open loop: a request that waits on the ones after it
// completes (a driver that waits for each response before the next would
// never finish), every request is sent, and the achieved rate is never
// above the rate asked for.
func TestFixedRateOpenLoop(t *testing.T) {
	const n, rate = 50, 1000
	var seen atomic.Int64
	var timedOut atomic.Bool
	release := make(chan struct{})
	var once sync.Once
	srv := serve(&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch seen.Add(1) {
		case 1:
			select {
			case <-release:
			case <-time.After(30 * time.Second):
				timedOut.Store(true)
			}
		case n:
			once.Do(func() { close(release) })
		}
		w.Write([]byte("ok"))
	})})
	defer srv.Close()
	rt := h1Transport()
	defer rt.CloseIdleConnections()
	f, err := fixedRate(rt, func() *http.Request { return get(srv.URL+"/", "") }, rate, n)
	require.NoError(t, err)
	assert.EqualValues(t, n, seen.Load())
	assert.False(t, timedOut.Load(), "the first request was answered before the last was sent")
	assert.LessOrEqual(t, f.RPS, float64(rate)*n/(n-1))
	assert.Greater(t, f.P99, f.P50, "the first request waited for the last")
}

// Without HAProxy, sidecar_pair is skipped with a note saying so, and
// nothing else runs.
func TestSidecarPairSkipsWithoutHAProxy(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	prev := haproxyPath
	haproxyPath = "/nonexistent/haproxy"
	t.Cleanup(func() { haproxyPath = prev })
	r, err := sidecarPair(options{rounds: 1, short: true})
	require.NoError(t, err)
	assert.Contains(t, r.Skipped, "haproxy is not installed")
	assert.Nil(t, r.Candidate)
}
