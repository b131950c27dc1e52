package mesh

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const books = "books.default.svc.cluster.local:7000"

func TestWholeMesh(t *testing.T) {
	m := testutil.NewMetrics(t)
	var flaky atomic.Int32
	app := http.NewServeMux()
	app.HandleFunc("/books/", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("L5d-Orig-Proto") != "" || r.Proto != "HTTP/1.1" {
			http.Error(w, "not HTTP/1.1: "+r.Proto, 500)
			return
		}
		io.WriteString(w, "book")
	})
	app.HandleFunc("/flaky", func(w http.ResponseWriter, r *http.Request) {
		if flaky.Add(1)%2 == 1 {
			w.WriteHeader(503)
			return
		}
		io.WriteString(w, "recovered")
	})

	// The peer: the inbound stack behind the one-port server.
	store := controlplane.NewStore()
	sps, err := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local}
spec:
  routes:
  - name: GET /books/{id}
    condition: {method: GET, pathRegex: '/books/[^/]+'}
  - name: GET /flaky
    condition: {method: GET, pathRegex: /flaky}
    isRetryable: true
`))
	require.NoError(t, err)
	store.SetServiceProfiles(sps)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
	go g.Serve(lis)
	defer g.Stop()
	dst, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quiet))
	require.NoError(t, err)
	defer dst.Close()

	var peerConns atomic.Int32
	inbound := NewServer(app, WithDestination(dst), WithMeterProvider(m.Provider), WithLogger(quiet), WithLocalAuthorities(books))
	defer inbound.Close()
	peer := httptest.NewUnstartedServer(nil)
	peer.Config = origproto.NewServer(inbound)
	peer.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			peerConns.Add(1)
		}
	}
	peer.Start()
	defer peer.Close()
	store.PutEndpoints(books, []endpoint.Endpoint{{
		Addr: netip.MustParseAddrPort(strings.TrimPrefix(peer.URL, "http://")), H2: true,
		Labels: map[string]string{"pod": "books-0"},
	}})

	client := NewClient(WithDestination(dst), WithMeterProvider(m.Provider), WithLogger(quiet))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: testutil.Timeout}
	get := func(path string) (int, string) {
		resp, err := hc.Get("http://" + books + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool {
		get("/books/1")
		return len(m.Lines(t, "route_request_total", `rt_route="GET /books/{id}"`, `direction="outbound"`)) > 0 &&
			len(m.Lines(t, "route_request_total", `rt_route="GET /books/{id}"`, `direction="inbound"`)) > 0
	}, testutil.Timeout, 10*time.Millisecond)
	status, body := get("/books/7")
	assert.Equal(t, 200, status)
	assert.Equal(t, "book", body)
	status, body = get("/flaky")
	assert.Equal(t, 200, status, "the retryable route hid the 503")
	assert.Equal(t, "recovered", body)
	assert.Equal(t, "1", m.Value(t, "route_actual_response_total", `direction="outbound"`, `rt_route="GET /flaky"`, `status_code="503"`))
	assert.NotEmpty(t, m.Lines(t, "request_total", `direction="outbound"`, `dst_pod="books-0"`))
	assert.Equal(t, int32(1), peerConns.Load(), "one h2 connection between the peers")
}

// The inbound stack serves HTTP/1 full duplex: the application can answer
// while the request body still arrives.
func TestServerHTTP1FullDuplex(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ack;")
		w.(http.Flusher).Flush()
		n, _ := io.Copy(io.Discard, r.Body)
		io.WriteString(w, strconv.FormatInt(n, 10))
	})
	s := NewServer(app, WithLogger(quiet))
	defer s.Close()
	srv := testutil.NewServer(t, s)
	pr, pw := io.Pipe()
	defer pw.CloseWithError(io.ErrUnexpectedEOF)
	go func() { _, _ = pw.Write([]byte("part-1;")) }()
	req, err := http.NewRequest("POST", srv.URL+"/upload", pr)
	require.NoError(t, err)
	req.Host = books
	client := &http.Client{Transport: testutil.NewTransport(t, testutil.H1)}
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := client.Do(req)
		assert.NoError(t, err)
		done <- resp
	}()
	var resp *http.Response
	select {
	case resp = <-done:
	case <-time.After(testutil.Timeout):
		t.Fatal("no response while the request body streams")
	}
	require.NotNil(t, resp)
	defer resp.Body.Close()
	ack := make([]byte, 4)
	_, err = io.ReadFull(resp.Body, ack)
	require.NoError(t, err)
	assert.Equal(t, "ack;", string(ack))
	_, err = pw.Write([]byte("part-2;"))
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	rest, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "14", string(rest))
}

// Without a control plane: endpoints from a static source, the balancer's
// options passed through.
func TestClientWithStaticEndpoints(t *testing.T) {
	app := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "app "+r.Host)
	}))
	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		books: {{Addr: netip.MustParseAddrPort(strings.TrimPrefix(app.URL, "http://"))}},
	})
	require.NoError(t, err)
	client := NewClient(WithEndpoints(src), WithLogger(quiet),
		WithBalancerOptions(balancer.WithFallback(false), balancer.WithQueue(10, 100*time.Millisecond), nil))
	defer client.Close()
	require.NotNil(t, client.Balancer())
	hc := &http.Client{Transport: client, Timeout: testutil.Timeout}
	resp, err := hc.Get("http://" + books + "/x")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "app "+books, string(b))
	resp, err = hc.Get("http://unknown.ns.svc.cluster.local/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 504, resp.StatusCode, "WithFallback(false) reached the balancer")
	assert.Contains(t, resp.Header.Get("l5d-proxy-error"), "fail-fast: no endpoints for unknown service")
}
