package destination_test

import (
	"time"

	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Client is the balancer's source of endpoints.
var _ balancer.Source = (*destination.Client)(nil)

func backend(t *testing.T, name string) (*httptest.Server, endpoint.Endpoint) {
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = origproto.NewServer(origproto.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name+" "+r.Proto+" "+r.Host)
	})))
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, endpoint.Endpoint{Addr: netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://")), Weight: endpoint.DefaultWeight}
}

// balancedClient returns a balancer over c and an HTTP client through it.
func balancedClient(t *testing.T, c *destination.Client, opts ...balancer.Option) (*balancer.Balancer, *http.Client) {
	b := balancer.New(c, append([]balancer.Option{balancer.WithLogger(quietLogger)}, opts...)...)
	t.Cleanup(b.Close)
	h1 := &http.Transport{}
	t.Cleanup(h1.CloseIdleConnections)
	return b, &http.Client{Transport: b.Transport(origproto.NewTransport(origproto.WithHTTP1(h1))), Timeout: testutil.Timeout}
}

func fetch(t *testing.T, c *http.Client, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// What the Get stream says reaches requests: endpoints, no endpoints (504
// fail-fast once the stream stayed silent past the first-message deadline,
// as Linkerd's controller says nothing for a Service without endpoints),
// and a service that does not exist (NotFound).
func TestClientFeedsBalancer(t *testing.T) {
	_, a := backend(t, "a")
	store := controlplane.NewStore()
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{a})
	store.PutEndpoints("empty.ns.svc.cluster.local:80", nil)
	cp := serve(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	_, client := balancedClient(t, newTestClient(t, cp.addr, destination.WithFirstMessageTimeout(100*time.Millisecond)),
		balancer.WithFallback(false), balancer.WithQueue(10, 100*time.Millisecond))
	status, body, _ := fetch(t, client, "http://"+books+":7000/")
	assert.Equal(t, 200, status)
	assert.Equal(t, "a HTTP/1.1 "+books+":7000", body)
	status, _, h := fetch(t, client, "http://empty.ns.svc.cluster.local/")
	assert.Equal(t, 504, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), "no endpoints")
	status, _, h = fetch(t, client, "http://unknown.ns.svc.cluster.local/")
	assert.Equal(t, 504, status)
	assert.Contains(t, h.Get("l5d-proxy-error"), "unknown service")
}
