package faults

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	inmesh "github.com/inmesh/inmesh/mesh"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// A meshed inbound port (mesh.Server with an identity, meshed TLS beside
// plaintext on one listener) under a flood of connections: garbage bytes,
// ClientHellos cut short and held open, full mTLS handshakes closed at
// once, and ClientHellos for a name that is not the local identity. A
// meshed client's requests keep succeeding all along, every foreign-SNI
// handshake is refused, the server ends a cut-short ClientHello at its
// header timeout, and afterwards the process's goroutines and heap
// are back near their baseline.
func TestTLSHandshakeFlood(t *testing.T) {
	p := newPKI(t)
	books, web := p.local(t, booksID), p.local(t, webID)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("L5d-Client-Id"); got != webID {
			http.Error(w, "client id "+got, http.StatusForbidden)
		}
	})
	srv := inmesh.NewServer(app, inmesh.WithIdentity(books), inmesh.WithMeterProvider(noop.NewMeterProvider()), inmesh.WithLogger(quiet))
	t.Cleanup(srv.Close)
	addr := serveInbound(t, srv)
	const authority = "books.default.svc.cluster.local:7000"
	hc := &http.Client{Transport: meshClient(t, authority, addr, booksID, inmesh.WithIdentity(web)), Timeout: 10 * time.Second}

	var failures atomic.Int64
	var mu sync.Mutex
	var samples []string
	request := func() bool {
		code, err := get(context.Background(), hc, authority, authority, "/books/1")
		if err == nil && code == 200 {
			return true
		}
		failures.Add(1)
		mu.Lock()
		if len(samples) < 5 {
			samples = append(samples, fmt.Sprint(code, err))
		}
		mu.Unlock()
		return false
	}
	for range 20 {
		require.True(t, request(), "the meshed client before the flood: %v", samples)
	}

	n := size(5000, 300) // connections of each kind
	kinds := []struct {
		name string
		do   func() error
	}{
		{"garbage", func() error {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			b := make([]byte, 1+rand.IntN(512))
			for i := range b {
				b[i] = byte(rand.Uint32())
			}
			_, err = c.Write(b)
			return err
		}},
		{"full handshake", func() error {
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, web.ClientConfig(booksID))
			if err != nil {
				return err
			}
			return c.Close()
		}},
		{"foreign SNI", func() error {
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
				web.ClientConfig("reviews.default.serviceaccount.identity.linkerd.cluster.local"))
			if err == nil {
				c.Close()
				return fmt.Errorf("a handshake for a foreign name succeeded")
			}
			return nil
		}},
	}
	// Warm up every path, then the baseline.
	for _, k := range kinds {
		for range 10 {
			require.NoError(t, k.do(), k.name)
		}
	}
	base := measure()
	t.Logf("baseline: %v", base)

	// The partial ClientHellos stay open until the flood is over: a TLS
	// record header announcing 512 bytes, and a few of them.
	var held []net.Conn
	var heldMu sync.Mutex
	partial := func() error {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		if _, err := c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01}); err != nil {
			c.Close()
			return err
		}
		heldMu.Lock()
		held = append(held, c)
		heldMu.Unlock()
		return nil
	}
	kinds = append(kinds, struct {
		name string
		do   func() error
	}{"partial ClientHello", partial})

	stop := make(chan struct{})
	var served atomic.Int64
	var traffic sync.WaitGroup
	for range 2 {
		traffic.Add(1)
		go func() {
			defer traffic.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if request() {
					served.Add(1)
				}
			}
		}()
	}

	jobs := make(chan int)
	errs := make([]atomic.Int64, len(kinds))
	var flood sync.WaitGroup
	for range 16 {
		flood.Add(1)
		go func() {
			defer flood.Done()
			for k := range jobs {
				if err := kinds[k].do(); err != nil {
					if errs[k].Add(1) == 1 {
						t.Logf("%s: %v", kinds[k].name, err)
					}
				}
			}
		}()
	}
	start := time.Now()
	for i := range n * len(kinds) {
		jobs <- i % len(kinds)
	}
	close(jobs)
	flood.Wait()
	t.Logf("%d connections of each of %d kinds in %v; %d partial ClientHellos held; right after: %v",
		n, len(kinds), time.Since(start).Round(time.Millisecond), len(held), measure())
	// A ClientHello that never completes holds the server only until its
	// header timeout: the server ends the connection.
	if len(held) > 0 {
		c := held[len(held)-1]
		require.NoError(t, c.SetReadDeadline(time.Now().Add(timeout)))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		assert.False(t, errors.As(err, &ne) && ne.Timeout(), "a cut-short ClientHello held for %v: %v", timeout, err)
	}
	for _, c := range held {
		c.Close()
	}
	close(stop)
	traffic.Wait()

	t.Logf("meshed client: %d requests served during the flood, %d failed", served.Load(), failures.Load())
	assert.Positive(t, served.Load())
	assert.Zero(t, failures.Load(), "the meshed client's requests failed, e.g. %v", samples)
	for k := range kinds {
		assert.Zero(t, errs[k].Load(), "%s connections failed", kinds[k].name)
	}
	backToBaseline(t, base, 10, 16, func() { request() })
	assert.Zero(t, failures.Load(), "the meshed client's requests failed after the flood, e.g. %v", samples)
}
