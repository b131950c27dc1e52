package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/examples/internal/booksapp"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// booksThroughTwoProxies starts a control plane that knows books at proxy
// B's inbound listener (labels pod: books-0), proxies A and B in front of
// handler, and waits until both are ready.
func booksThroughTwoProxies(t *testing.T, handler http.Handler) (aOut, aMetrics, bIn, bMetrics string) {
	bin := build(t)
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "books.yaml"), []byte(profile("")), 0o644))
	app := httptest.NewServer(handler)
	t.Cleanup(app.Close)
	appAddr := strings.TrimPrefix(app.URL, "http://")
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644))
	dstArgs := []string{"-profiles", profiles, "-endpoints", endpoints, "-interval", "100ms"}
	dst := start(t, filepath.Join(bin, "destination"), nil, append([]string{"-listen", "127.0.0.1:0"}, dstArgs...)...)
	dstAddr := dst.waitLog(t, dstAddrRe)
	_, _, bIn, bMetrics = startProxy(t, bin, dstAddr, appAddr)
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n    labels: {pod: books-0}\n", books, bIn)), 0o644))
	dst.waitLog(t, loadedEndpointsRe)
	_, aOut, _, aMetrics = startProxy(t, bin, dstAddr, appAddr)
	for _, addr := range []string{aMetrics, bMetrics} {
		require.Eventually(t, func() bool {
			resp, err := http.Get("http://" + addr + "/ready")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		}, timeout, 20*time.Millisecond)
	}
	return aOut, aMetrics, bIn, bMetrics
}

// `linkerd viz stat svc/books` (and `-o wide`) reads a Service's TCP
// columns from the clients' outbound connections selected by the
// authority (linkerd2 viz/metrics-api/stat_summary.go,
// serviceResourceQuery: "Service stats always need to have `peer=dst`"):
//
//	sum(tcp_open_connections{direction="outbound", peer="dst", authority=~"^books.default.svc.cluster.local.*"}) by (dst_namespace, dst_service)
//
// and the same selector on tcp_read_bytes_total / tcp_write_bytes_total.
// Linkerd's proxy labels an HTTP endpoint's connections with the logical
// authority it was balanced for (linkerd/app/outbound/src/http/concrete.rs:
// OutboundEndpointLabels{authority: self.parent.param(), ...} as
// transport::labels::Key::OutboundClient; Concrete.authority is
// Some(addr.as_http_authority()) for a profile or policy Service); so does
// inmesh's outbound stack (a version without it left the selector empty).
func TestMetricsServiceStatTCPColumns(t *testing.T) {
	needCurl(t)
	aOut, aMetrics, _, _ := booksThroughTwoProxies(t, booksapp.Handler(5*time.Second))
	require.Eventually(t, func() bool {
		curl(t, "-H", "Host: "+books, "http://"+aOut+"/books/1")
		_, ok := metric(scrape(t, aMetrics), "route_request_total", `rt_route="GET /books/{id}"`, `direction="outbound"`)
		return ok
	}, timeout, 50*time.Millisecond, "the profile never arrived")

	// A's bytes to B are counted once its writes have returned, which may
	// be after the responses came.
	var text string
	require.Eventually(t, func() bool {
		text = scrape(t, aMetrics)
		_, wrote := testutil.Select(t, text, "tcp_write_bytes_total", `direction="outbound"`, `peer="dst"`, `dst_service="books"`)
		return wrote > 0
	}, timeout, 20*time.Millisecond)
	// Control: the request columns of the same `viz stat svc/books` select A's series.
	reqs, _ := testutil.Select(t, text, "response_total", `direction="outbound"`, `authority=~"^books.default.svc.cluster.local.*"`)
	require.NotEmpty(t, reqs, "control: response_total of svc/books:\n%s", testutil.Family(text, "response_total"))
	// The connection to B is open (its edge is on /metrics by dst_*).
	edge, _ := testutil.Select(t, text, "tcp_open_connections", `direction="outbound"`, `peer="dst"`, `dst_service="books"`)
	require.NotEmpty(t, edge, "control: A's connection to B:\n%s", testutil.Family(text, "tcp_open_connections"))

	for _, fam := range []string{"tcp_open_connections", "tcp_read_bytes_total", "tcp_write_bytes_total"} {
		got, _ := testutil.Select(t, text, fam, `direction="outbound"`, `peer="dst"`, `authority=~"^books.default.svc.cluster.local.*"`)
		assert.NotEmpty(t, got, "viz stat svc/books selects no %s series; proxy A has:\n%s", fam, testutil.Family(text, fam))
	}
}

// A request cancelled by its client before any response is counted by
// Linkerd's proxy in request_total and nowhere in response_total or
// response_latency_ms: linkerd/http/metrics/src/requests/service.rs records
// a response only when the inner future resolves (ResponseFuture::poll) or
// its body ends (ResponseBody's PinnedDrop); a ResponseFuture dropped
// because the client reset the stream has no Drop hook and records nothing.
// The sidecar's inbound stack writes nothing to a client that went away
// (proxylog.ErrorHandler) and counts no response for it: a version that
// answered 502 to nobody counted it as
// response_total{direction="inbound",status_code="502",classification="failure"},
// and every client timeout, cancelled hedge or abandoned call lowered the
// server's success rate in `linkerd viz stat deploy/books` and the
// dashboards, for responses nobody received.
func TestMetricsClientGoneIsNoInboundResponse(t *testing.T) {
	arrived, returned := make(chan struct{}, 1), make(chan struct{}, 1)
	handler := http.NewServeMux()
	handler.Handle("/", booksapp.Handler(5*time.Second))
	handler.HandleFunc("GET /hang", func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // answers only when the caller goes away
		returned <- struct{}{}
	})
	_, _, bIn, bMetrics := booksThroughTwoProxies(t, handler)

	// A client of B's inbound listener calls /hang and gives up once the
	// application has the request.
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+bIn+"/hang", nil)
	require.NoError(t, err)
	req.Host = books
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	errc := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		errc <- err
	}()
	<-arrived
	cancel()
	require.Error(t, <-errc)
	<-returned

	// B is done with the request once it has closed the client's connection
	// (after its handler returned).
	var text string
	require.Eventually(t, func() bool {
		text = scrape(t, bMetrics)
		_, closed := testutil.Select(t, text, "tcp_close_total", `direction="inbound"`, `peer="src"`)
		return closed >= 1
	}, timeout, 20*time.Millisecond, "B never closed the client's connection")

	_, requests := testutil.Select(t, text, "request_total", `direction="inbound"`)
	assert.Equal(t, 1.0, requests, "the request is counted:\n%s", testutil.Family(text, "request_total"))
	failures, _ := testutil.Select(t, text, "response_total", `direction="inbound"`, `classification="failure"`)
	assert.Empty(t, failures, "a response nobody received is counted as the server's failure (success rate of deploy/books drops)")
	lat, _ := testutil.Select(t, text, "response_latency_ms_count", `direction="inbound"`)
	assert.Empty(t, lat, "and its latency is in the server's latency histogram")
}
