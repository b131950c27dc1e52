package transport

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A flood of distinct hosts whose dials fail leaves net/http's per-host
// waiter state behind; the recycling transport bounds it by starting a new
// generation every maxHosts hosts, while requests to a live server keep
// working (and keep their connection within a generation).
func TestRecyclingBoundsHostState(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	// Port 1 on loopback addresses other than the server's refuses every
	// dial, with no DNS.
	r := NewRecycling(func() *http.Transport { return HTTP1(Limits{}) }, 100)
	defer r.CloseIdleConnections()
	get := func(url string) error {
		req, err := http.NewRequest("GET", url, nil)
		require.NoError(t, err)
		resp, err := r.RoundTrip(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	require.NoError(t, get(srv.URL))
	require.NoError(t, get(srv.URL))
	assert.Equal(t, int64(1), conns.Load(), "one connection, reused")

	heapBefore := liveHeap()
	for i := range 1000 {
		assert.Error(t, get(fmt.Sprintf("http://127.0.%d.%d:1/", 1+i/250, i%250)))
	}
	assert.Equal(t, int64(10), r.Generation(), "a new generation every 100 hosts")
	require.NoError(t, get(srv.URL))
	grown := int64(liveHeap()) - int64(heapBefore)
	t.Logf("heap growth over 1000 refused hosts: %d bytes", grown)
	assert.Less(t, grown, int64(200<<10), "per-host state beyond one generation was kept")
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
