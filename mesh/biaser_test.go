package mesh

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
)

// A Service configured only by the load biaser's annotations, served by
// the embedded control plane: after one of its two endpoints answers 429
// with Retry-After: 2, it gets no request for as long as the requests that
// follow take, up to 1.5 s; the other endpoint takes them.
func TestLoadBiaserFromAnnotations(t *testing.T) {
	var limitedHits, okHits atomic.Int32
	var limiting atomic.Bool
	// The endpoint's own clock: the balancer reads the 429 after the
	// endpoint wrote it, so a hit less than 2 s after the first 429 was
	// written is inside the Retry-After, however slowly the machine runs.
	start := time.Now()
	var first429 atomic.Int64 // since start, 0 until the first 429
	var early atomic.Int32    // hits inside the Retry-After
	limited := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limitedHits.Add(1)
		if limiting.Load() {
			now := int64(time.Since(start))
			if f := first429.Load(); f != 0 && time.Duration(now-f) < 2*time.Second {
				early.Add(1)
			}
			first429.CompareAndSwap(0, now)
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		io.WriteString(w, "limited")
	}))
	ok := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		okHits.Add(1)
		io.WriteString(w, "ok")
	}))

	res, err := manifest.Parse([]byte(`
apiVersion: v1
kind: Service
metadata:
  name: books
  namespace: default
  annotations:
    balancer.alpha.linkerd.io/penalize-failures: "true"
spec:
  ports: [{port: 7000}]
`))
	require.NoError(t, err)
	store := controlplane.NewStore()
	store.SetManifests(res)
	const books = "books.default.svc.cluster.local:7000"
	store.PutEndpoints(books, []endpoint.Endpoint{
		{Addr: netip.MustParseAddrPort(strings.TrimPrefix(limited.URL, "http://"))},
		{Addr: netip.MustParseAddrPort(strings.TrimPrefix(ok.URL, "http://"))},
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
	go g.Serve(lis)
	defer g.Stop()
	dst, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quiet))
	require.NoError(t, err)
	defer dst.Close()
	client := NewClient(WithDestination(dst), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: testutil.Timeout}
	get := func() int {
		resp, err := hc.Get("http://" + books + "/")
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// The policy and both endpoints are in once each endpoint has answered.
	require.Eventually(t, func() bool {
		get()
		return limitedHits.Load() > 0 && okHits.Load() > 0 && client.Router().Explain(
			must(http.NewRequest("GET", "http://"+books+"/", nil))).Model == "policy"
	}, testutil.Timeout, time.Millisecond)

	limiting.Store(true)
	for i := 0; get() != http.StatusTooManyRequests; i++ {
		require.Less(t, i, 10_000, "the limited endpoint never answered")
	}
	at, before := time.Now(), limitedHits.Load()
	sent := 0
	for time.Since(at) < 1500*time.Millisecond && sent < 200 {
		get()
		sent++
	}
	t.Logf("%d requests in %v after the 429, %d of them to the limited endpoint", sent, time.Since(at).Round(time.Millisecond), limitedHits.Load()-before)
	assert.Zero(t, early.Load(), "requests to the endpoint inside its Retry-After")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
