package destination_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/destination"

	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	// defaultTestTimeout bounds waits for what must happen.
	defaultTestTimeout = 10 * time.Second
	// defaultTestShortTimeout is how long a test watches for something
	// that must not happen.
	defaultTestShortTimeout = 300 * time.Millisecond
)

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// controlPlane is a real gRPC server on loopback.
type controlPlane struct {
	t    *testing.T
	addr string
	srv  *grpc.Server
	done chan struct{}
}

// serve starts a gRPC server with svc on a port the kernel picks.
func serve(t *testing.T, svc pb.DestinationServer) *controlPlane {
	t.Helper()
	return serveHeld(t, holdListener(t), svc)
}

// serveHeld starts a gRPC server with svc on h. Several servers may serve h
// one after the other: the port stays held by the test in between.
func serveHeld(t *testing.T, h *heldListener, svc pb.DestinationServer) *controlPlane {
	t.Helper()
	lis := h.generation()
	cp := &controlPlane{t: t, addr: lis.Addr().String(), srv: grpc.NewServer(), done: make(chan struct{})}
	pb.RegisterDestinationServer(cp.srv, svc)
	if viaWatches {
		watchespb.RegisterWatchesServer(cp.srv, watchesBridge{svc: svc})
	}
	go func() {
		defer close(cp.done)
		_ = cp.srv.Serve(lis)
	}()
	t.Cleanup(cp.stop)
	return cp
}

// heldListener holds a loopback port for a whole test and hands its
// connections to one server at a time; while none serves, a connection is
// closed as soon as it is accepted. It stands for a control plane that
// restarts on its port without the test ever releasing the port.
type heldListener struct {
	lis  net.Listener
	mu   sync.Mutex
	cur  *genListener
	done chan struct{}
}

func holdListener(t *testing.T) *heldListener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := &heldListener{lis: lis, done: make(chan struct{})}
	go h.acceptLoop()
	t.Cleanup(func() {
		lis.Close()
		<-h.done
	})
	return h
}

func (h *heldListener) addr() string { return h.lis.Addr().String() }

// serving reports whether a server takes the connections now.
func (h *heldListener) serving() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur != nil
}

func (h *heldListener) acceptLoop() {
	defer close(h.done)
	for {
		c, err := h.lis.Accept()
		if err != nil {
			return
		}
		h.mu.Lock()
		g := h.cur
		h.mu.Unlock()
		if g == nil || !g.offer(c) {
			c.Close()
		}
	}
}

// generation returns the listener of the next server.
func (h *heldListener) generation() net.Listener {
	g := &genListener{h: h, conns: make(chan net.Conn), closed: make(chan struct{})}
	h.mu.Lock()
	h.cur = g
	h.mu.Unlock()
	return g
}

// genListener is one server's view of a heldListener; closing it does not
// release the port.
type genListener struct {
	h      *heldListener
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (g *genListener) Accept() (net.Conn, error) {
	select {
	case c := <-g.conns:
		return c, nil
	case <-g.closed:
		return nil, net.ErrClosed
	}
}

func (g *genListener) offer(c net.Conn) bool {
	select {
	case g.conns <- c:
		return true
	case <-g.closed:
		return false
	}
}

func (g *genListener) Close() error {
	g.once.Do(func() {
		g.h.mu.Lock()
		if g.h.cur == g {
			g.h.cur = nil
		}
		g.h.mu.Unlock()
		close(g.closed)
	})
	return nil
}

func (g *genListener) Addr() net.Addr { return g.h.lis.Addr() }

// stop closes the listener and cuts every stream.
func (cp *controlPlane) stop() {
	cp.srv.Stop()
	<-cp.done
}

func newTestClient(t *testing.T, addr string, opts ...destination.Option) *destination.Client {
	t.Helper()
	opts = append([]destination.Option{destination.WithLogger(quietLogger), destination.WithBackoff(fastBackoff)}, opts...)
	c, err := destination.Dial(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// recorder collects the updates of one watch.
type recorder[U any] struct {
	mu  sync.Mutex
	got []U
	ch  chan struct{}
}

func newRecorder[U any]() *recorder[U] { return &recorder[U]{ch: make(chan struct{}, 1)} }

func (r *recorder[U]) update(u U) {
	r.mu.Lock()
	r.got = append(r.got, u)
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

func (r *recorder[U]) all() []U {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]U(nil), r.got...)
}

// waitFor waits until some update satisfies ok and returns it.
func (r *recorder[U]) waitFor(t *testing.T, what string, ok func(U) bool) U {
	t.Helper()
	deadline := time.NewTimer(defaultTestTimeout)
	defer deadline.Stop()
	seen := 0
	for {
		got := r.all()
		for _, u := range got[seen:] {
			if ok(u) {
				return u
			}
		}
		seen = len(got)
		select {
		case <-r.ch:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s; got %d updates", what, len(got))
		}
	}
}

func hasRoute(name string) func(profiles.Update) bool {
	return func(u profiles.Update) bool {
		return u.Profile != nil && len(u.Profile.Routes) > 0 && u.Profile.Routes[0].Labels["route"] == name
	}
}

func routeNamed(name string) profiles.Route {
	return profiles.Route{Condition: profiles.PathRegex("/" + name), Labels: map[string]string{"route": name}}
}

func serviceProfile(name string, routes ...string) *profiles.ServiceProfile {
	sp := &profiles.ServiceProfile{Name: name, Namespace: "default", RetryBudget: profiles.DefaultRetryBudget()}
	for _, r := range routes {
		sp.Routes = append(sp.Routes, routeNamed(r))
	}
	return sp
}

// scripted is a Destination service whose every call is answered by a
// function of its own, for faults a Store cannot produce.
type scripted struct {
	pb.UnimplementedDestinationServer
	mu       sync.Mutex
	calls    []time.Time
	profile  func(call int, req *pb.GetDestination, s grpc.ServerStreamingServer[pb.DestinationProfile]) error
	get      func(call int, req *pb.GetDestination, s grpc.ServerStreamingServer[pb.Update]) error
	callSeen chan int
}

func newScripted() *scripted { return &scripted{callSeen: make(chan int, 1000)} }

func (s *scripted) record() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, time.Now())
	n := len(s.calls)
	s.callSeen <- n
	return n
}

func (s *scripted) callTimes() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.calls...)
}

// GetProfile and Get run the script's function for the call, or stay
// silent when the script has none for the RPC.
func (s *scripted) GetProfile(req *pb.GetDestination, stream grpc.ServerStreamingServer[pb.DestinationProfile]) error {
	if s.profile == nil {
		return block(stream.Context())
	}
	return s.profile(s.record(), req, stream)
}

func (s *scripted) Get(req *pb.GetDestination, stream grpc.ServerStreamingServer[pb.Update]) error {
	if s.get == nil {
		return block(stream.Context())
	}
	return s.get(s.record(), req, stream)
}

// waitCalls waits until the service has seen n calls.
func (s *scripted) waitCalls(t *testing.T, n int) {
	t.Helper()
	deadline := time.NewTimer(defaultTestTimeout)
	defer deadline.Stop()
	for {
		if len(s.callTimes()) >= n {
			return
		}
		select {
		case <-s.callSeen:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %d calls; saw %d", n, len(s.callTimes()))
		}
	}
}

// block waits until the call is cancelled.
func block(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}
