package balancer

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/inmesh/inmesh/controlplane"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const books = "books.default.svc.cluster.local"

var quietLogger = slog.New(slog.DiscardHandler)

// backendHandler starts a loopback server (HTTP/1.1 and h2c, with the
// orig-proto downgrade) for h and returns its endpoint.
func backendHandler(t *testing.T, h http.Handler) endpoint.Endpoint {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = origproto.NewServer(origproto.NewHandler(h))
	srv.Start()
	t.Cleanup(srv.Close)
	return endpoint.Endpoint{Addr: netip.MustParseAddrPort(srv.Listener.Addr().String()), Weight: endpoint.DefaultWeight}
}

// backend starts a server that answers "<name> <proto> <host>".
func backend(t *testing.T, name string) endpoint.Endpoint {
	return backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name+" "+r.Proto+" "+r.Host)
	}))
}

// refusing starts a listener that accepts each connection and closes it at
// once: an endpoint that fails every request fast. It is held until the
// end of the test, so its port is never reused.
func refusing(t *testing.T) endpoint.Endpoint {
	addr, _ := testutil.AcceptAndClose(t)
	return endpoint.Endpoint{Addr: addr, Weight: endpoint.DefaultWeight}
}

func staticSource(t *testing.T, m map[string][]endpoint.Endpoint) *StaticSource {
	t.Helper()
	s, err := NewStaticSource(m)
	require.NoError(t, err)
	return s
}

// newClient returns a Balancer over src and an http.Client through it and
// orig-proto.
func newClient(t *testing.T, src Source, opts ...Option) (*Balancer, *http.Client) {
	t.Helper()
	b := New(src, append([]Option{WithLogger(quietLogger)}, opts...)...)
	t.Cleanup(b.Close)
	h2 := origproto.NewH2Transport()
	t.Cleanup(h2.CloseIdleConnections)
	h1 := &http.Transport{MaxIdleConnsPerHost: 200}
	t.Cleanup(h1.CloseIdleConnections)
	return b, &http.Client{Transport: b.Transport(origproto.NewTransport(origproto.WithH2(h2), origproto.WithHTTP1(h1))), Timeout: testutil.Timeout}
}

func fetch(t *testing.T, c *http.Client, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

// controlPlane serves store's Destination API on loopback and returns a
// client of it.
func controlPlane(t *testing.T, store *controlplane.Store, opts ...destination.Option) *destination.Client {
	t.Helper()
	return grpcClient(t, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)), opts...)
}

// grpcClient serves svc on loopback and returns a client of it.
func grpcClient(t *testing.T, svc pb.DestinationServer, opts ...destination.Option) *destination.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	pb.RegisterDestinationServer(srv, svc)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	c, err := destination.Dial(lis.Addr().String(), append([]destination.Option{destination.WithLogger(quietLogger)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// fakeClock is a clock for the load estimates that moves only when told.
type fakeClock struct{ now atomic.Int64 }

func (c *fakeClock) read() int64 { return c.now.Load() }

func withClock(now func() int64) Option { return optionFunc(func(c *config) { c.now = now }) }

// lookup returns the state of authority in b, made on first use.
func lookup(b *Balancer, authority string) *authority {
	a, _ := b.table.lookup(authority)
	return a
}
