package mesh

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// hosts starts n responsive HTTP/1 servers, each on its own loopback
// address (127.0.x.y), and returns their addresses.
func hosts(t *testing.T, n int) []string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("needs the whole of 127.0.0.0/8 on loopback and /proc/self/fd")
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})}
	var wg sync.WaitGroup
	addrs := make([]string, n)
	for i := range n {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.%d.%d:0", 1+i/250, 1+i%250))
		require.NoError(t, err)
		addrs[i] = l.Addr().String()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("serve: %v", err)
			}
		}()
	}
	t.Cleanup(func() {
		srv.Close()
		wg.Wait()
	})
	return addrs
}

func openFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(fds)
}

// getAll sends one request to each address through rt, 16 at a time.
func getAll(t *testing.T, rt http.RoundTripper, addrs []string) {
	t.Helper()
	hc := &http.Client{Transport: rt, Timeout: testutil.Timeout}
	work := make(chan string)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range work {
				resp, err := hc.Get("http://" + a + "/")
				if !assert.NoError(t, err) {
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				assert.Equal(t, "ok", string(b))
			}
		}()
	}
	for _, a := range addrs {
		work <- a
	}
	close(work)
	wg.Wait()
}

// 1,000 distinct fallback hosts (no control plane), then idle: every
// connection is closed after the idle timeout, on both ends.
func TestClientClosesIdleConnections(t *testing.T) {
	addrs := hosts(t, 1000)
	client := NewClient(WithLogger(quiet), WithIdleConnTimeout(500*time.Millisecond))
	defer client.Close()
	baseline := openFDs(t)
	getAll(t, client, addrs)
	t.Logf("fds: baseline %d, after 1,000 hosts %d", baseline, openFDs(t))
	require.Eventually(t, func() bool { return openFDs(t) <= baseline+10 }, testutil.Timeout, 50*time.Millisecond,
		"open fds back within 10 of the baseline after the idle timeout")
	t.Logf("fds after the idle timeout: %d", openFDs(t))
}

// Past the total idle cap, connections returned to the pool are closed at
// once rather than kept until the timeout.
func TestClientCapsIdleConnections(t *testing.T) {
	addrs := hosts(t, 1000)
	client := NewClient(WithLogger(quiet), WithMaxIdleConns(100, 0))
	defer client.Close()
	baseline := openFDs(t)
	getAll(t, client, addrs)
	// 100 kept on the client side and their 100 server ends.
	require.Eventually(t, func() bool { return openFDs(t) <= baseline+200+10 }, testutil.Timeout, 50*time.Millisecond)
}

func TestClientTransportDefaults(t *testing.T) {
	client := NewClient(WithLogger(quiet), WithIdleConnTimeout(0), WithMaxIdleConns(-1, 0))
	defer client.Close()
	for _, tr := range []*http.Transport{client.h1.Transport(), client.h2} {
		assert.Equal(t, DefaultIdleConnTimeout, tr.IdleConnTimeout)
		assert.Equal(t, DefaultMaxIdleConns, tr.MaxIdleConns)
		assert.Equal(t, DefaultMaxIdleConnsPerHost, tr.MaxIdleConnsPerHost)
	}
}

// The outbound stack adds no header of its own: a request without
// Accept-Encoding reaches the server without one, and a response the
// server compressed reaches the client as it was sent, with its
// Content-Encoding, over HTTP/1 and upgraded to a mesh peer alike.
func TestNoAcceptEncodingAdded(t *testing.T) {
	const books = "books.default.svc.cluster.local:7000"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = io.WriteString(zw, "hello hello hello")
	require.NoError(t, zw.Close())
	seen := make(chan []string, 1)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Values("Accept-Encoding")
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(gz.Bytes())
	})
	for _, peer := range []bool{false, true} {
		t.Run(fmt.Sprintf("peer=%v", peer), func(t *testing.T) {
			var addr netip.AddrPort
			if peer {
				server := NewServer(app, WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
				defer server.Close()
				addr = serveMeshed(t, server)
			} else {
				addr = netip.MustParseAddrPort(testutil.NewServer(t, app).Listener.Addr().String())
			}
			eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{books: {{Addr: addr, H2: peer}}})
			require.NoError(t, err)
			client := NewClient(WithEndpoints(eps), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet), WithoutPolicies())
			defer client.Close()
			req, err := http.NewRequest("GET", "http://"+books+"/", nil)
			require.NoError(t, err)
			resp, err := client.RoundTrip(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Empty(t, <-seen, "Accept-Encoding the client did not send")
			assert.Equal(t, "gzip", resp.Header.Get("Content-Encoding"))
			assert.False(t, resp.Uncompressed)
			assert.Equal(t, gz.Bytes(), body, "the body as the server compressed it")
		})
	}
}
