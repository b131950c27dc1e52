package mesh

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/regtest"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/registration"
)

const registeredBooks = "books.default.svc.cluster.local:7000"

// registeredServer is a meshed server of name with books' identity that
// registers itself as an endpoint of books:7000.
type registeredServer struct {
	mesh *Server
	http *http.Server
	done chan struct{}
}

func startRegistered(t *testing.T, c *regtest.ControlPlane, name string) *registeredServer {
	t.Helper()
	local := c.Certify(t, regtest.BooksID)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name+" "+r.Header.Get("L5d-Client-Id"))
	})
	s := &registeredServer{done: make(chan struct{})}
	s.mesh = NewServer(app, WithIdentity(local), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet),
		WithRegistration(c.Dial(t, local), []registration.Endpoint{{Authority: registeredBooks, Labels: map[string]string{"zone": "zone-a"}}}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s.http = origproto.NewServer(s.mesh)
	s.http.ErrorLog = quietLog
	ln := s.mesh.Listener(lis)
	go func() {
		defer close(s.done)
		_ = s.http.Serve(ln)
	}()
	t.Cleanup(func() {
		s.mesh.Close()
		s.http.Close()
		<-s.done
	})
	return s
}

func (s *registeredServer) waitAccepted(t *testing.T) {
	t.Helper()
	regs := s.mesh.Registrations()
	require.Len(t, regs, 1)
	select {
	case <-regs[0].Accepted():
	case <-time.After(testutil.Timeout):
		t.Fatalf("not accepted: %v", regs[0].Err())
	}
}

// peerClient is a meshed client with web's identity that discovers
// endpoints from the control plane.
func peerClient(t *testing.T, c *regtest.ControlPlane) *http.Client {
	t.Helper()
	dst, err := destination.Dial(c.Addr, destination.WithLogger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { dst.Close() })
	client := NewClient(WithDestination(dst), WithIdentity(c.Certify(t, regtest.WebID)),
		WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
	t.Cleanup(client.Close)
	return &http.Client{Transport: client, Timeout: testutil.Timeout}
}

// A server that registers itself is reachable by its Service's name
// through a peer, over mTLS with both identities, on the peer's first
// request (a fresh client, no endpoints file): the cold path.
func TestRegisteredServerReachableByName(t *testing.T) {
	c := regtest.Start(t, regtest.Manifests)
	s := startRegistered(t, c, "books-a")
	s.waitAccepted(t)

	resp, err := peerClient(t, c).Get("http://" + registeredBooks + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "books-a "+regtest.WebID, string(body), "reached over mTLS, the peer's identity verified")
}

// Graceful shutdown under load: of two registered replicas, one drains
// (Drain deregisters it, and its removal reaches the peer's watch, before
// its listener closes) and shuts down while a peer sends requests without
// pause; the peer sees no failed request, and the rest go to the other.
func TestDrainBeforeShutdownUnderLoad(t *testing.T) {
	c := regtest.Start(t, regtest.Manifests)
	a := startRegistered(t, c, "books-a")
	b := startRegistered(t, c, "books-b")
	a.waitAccepted(t)
	b.waitAccepted(t)
	hc := peerClient(t, c)

	// The peer's own watch of the Service's endpoints, to see when a's
	// removal reaches it.
	dst, err := destination.Dial(c.Addr, destination.WithLogger(quiet))
	require.NoError(t, err)
	defer dst.Close()
	sets := make(chan int, 64)
	stopWatch, err := dst.WatchEndpoints(context.Background(), registeredBooks, func(u endpoint.Update) {
		if u.Set != nil {
			sets <- len(u.Set.Endpoints)
		}
	})
	require.NoError(t, err)
	defer stopWatch()

	var (
		failed, total atomic.Int64
		servedBy      sync.Map
		stop          = make(chan struct{})
		wg            sync.WaitGroup
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := hc.Get("http://" + registeredBooks + "/")
				total.Add(1)
				if err != nil {
					failed.Add(1)
					t.Logf("failed: %v", err)
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
					t.Logf("failed: %d %s", resp.StatusCode, body)
					continue
				}
				name := string(body[:7])
				n, _ := servedBy.LoadOrStore(name, new(atomic.Int64))
				n.(*atomic.Int64).Add(1)
			}
		}()
	}
	// Both replicas serve before the drain.
	require.Eventually(t, func() bool {
		_, okA := servedBy.Load("books-a")
		_, okB := servedBy.Load("books-b")
		return okA && okB
	}, testutil.Timeout, 10*time.Millisecond, "both replicas serve")

	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	require.NoError(t, a.mesh.Drain(ctx))
	// Drain returned: the peer's watch has a set without a.
	require.Eventually(t, func() bool {
		select {
		case n := <-sets:
			return n == 1
		default:
			return false
		}
	}, testutil.Timeout, time.Millisecond, "a's removal reaches the peer")
	require.NoError(t, a.http.Shutdown(ctx))
	<-a.done
	afterA, _ := servedBy.Load("books-b")
	bBefore := afterA.(*atomic.Int64).Load()
	require.Eventually(t, func() bool { return afterA.(*atomic.Int64).Load() > bBefore+50 }, testutil.Timeout, 10*time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("%d requests, %d failed", total.Load(), failed.Load())
	assert.Zero(t, failed.Load(), "failed requests at the caller")
}
