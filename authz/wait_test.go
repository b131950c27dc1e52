package authz_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/internal/testutil"
)

// handSource answers when the test says so: watched reports each port
// whose watch starts, with its update.
type handSource struct {
	mu      sync.Mutex
	watched chan uint16
	updates map[uint16]func(*authz.Server)
}

func newHandSource() *handSource {
	return &handSource{watched: make(chan uint16, 16), updates: map[uint16]func(*authz.Server){}}
}

func (s *handSource) Watch(port uint16, update func(*authz.Server)) func() {
	s.mu.Lock()
	s.updates[port] = update
	s.mu.Unlock()
	s.watched <- port
	return func() {}
}

func (s *handSource) answer(port uint16, srv *authz.Server) {
	s.mu.Lock()
	u := s.updates[port]
	s.mu.Unlock()
	u(srv)
}

var waitConn = authz.Conn{Local: netip.MustParseAddrPort("127.0.0.1:8080"), Remote: netip.MustParseAddrPort("127.0.0.2:40000")}

// decideAsync decides a GET / on waitConn under ctx in a goroutine.
func decideAsync(ctx context.Context, h *authz.Handler) <-chan authz.Decision {
	out := make(chan authz.Decision, 1)
	go func() {
		r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
		out <- h.Decide(r, waitConn)
	}()
	return out
}

// TestPolicyWait: a request to a port whose first answer is pending waits
// for it and is decided by it; an answer of no Server, Close (which
// refuses the ports the Source never answered for), or the end
// of the request's context end the wait; a negative wait and a
// StaticSource without the port's Server never wait.
func TestPolicyWait(t *testing.T) {
	deny := mustDefault(t, authz.Deny, authz.DefaultOptions{})
	newHandler := func(t *testing.T, src authz.Source, opts ...authz.Option) *authz.Handler {
		h, err := authz.New(http.NotFoundHandler(), append([]authz.Option{authz.WithSource(src), authz.WithPolicyWait(testutil.Timeout)}, opts...)...)
		require.NoError(t, err)
		t.Cleanup(h.Close)
		return h
	}
	t.Run("the first answer decides", func(t *testing.T) {
		src := newHandSource()
		h := newHandler(t, src, authz.WithPorts(8080))
		require.Equal(t, uint16(8080), <-src.watched, "watched from New")
		got := decideAsync(context.Background(), h)
		src.answer(8080, deny)
		assert.Equal(t, http.StatusForbidden, (<-got).Status, "the Server's, never the open default's")
	})
	t.Run("WatchPorts", func(t *testing.T) {
		src := newHandSource()
		h := newHandler(t, src)
		h.WatchPorts(8080)
		require.Equal(t, uint16(8080), <-src.watched)
		got := decideAsync(context.Background(), h)
		src.answer(8080, deny)
		assert.Equal(t, http.StatusForbidden, (<-got).Status)
	})
	t.Run("no Server: the default at once", func(t *testing.T) {
		src := newHandSource()
		h := newHandler(t, src, authz.WithPorts(8080))
		<-src.watched
		got := decideAsync(context.Background(), h)
		src.answer(8080, nil)
		assert.Equal(t, 0, (<-got).Status, "the open default")
	})
	t.Run("the request's context ends", func(t *testing.T) {
		src := newHandSource()
		h := newHandler(t, src, authz.WithPorts(8080))
		<-src.watched
		ctx, cancel := context.WithCancel(context.Background())
		got := decideAsync(ctx, h)
		cancel()
		d := <-got
		assert.Equal(t, http.StatusServiceUnavailable, d.Status)
		assert.Equal(t, "inbound policy not yet known", d.Cause)
		assert.Error(t, h.WaitPolicy(ctx, waitConn.Local))
	})
	t.Run("Close", func(t *testing.T) {
		src := newHandSource()
		h := newHandler(t, src, authz.WithPorts(8080))
		<-src.watched
		got := decideAsync(context.Background(), h)
		h.Close()
		// Fails closed: the Source never said what the port allows.
		d := <-got
		assert.Equal(t, http.StatusServiceUnavailable, d.Status, "pending at Close")
		assert.Equal(t, "inbound policy not yet known", d.Cause)
		assert.Equal(t, http.StatusServiceUnavailable, h.Decide(httptest.NewRequest("GET", "/", nil), waitConn).Status, "after Close")
		assert.ErrorIs(t, h.WaitPolicy(context.Background(), waitConn.Local), authz.ErrClosed)
	})
	t.Run("Close: a port first seen after it", func(t *testing.T) {
		h := newHandler(t, newHandSource())
		h.Close()
		d := h.Decide(httptest.NewRequest("GET", "/", nil), waitConn)
		assert.Equal(t, http.StatusServiceUnavailable, d.Status)
		assert.Equal(t, "inbound policy not yet known", d.Cause)
		// Served: 503 over HTTP, UNAVAILABLE to a gRPC client.
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		assert.Equal(t, http.StatusServiceUnavailable, w.Code)
		w = httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/test.Service/Call", nil)
		r.Header.Set("Content-Type", "application/grpc")
		h.ServeHTTP(w, r)
		assert.Equal(t, "14", w.Header().Get("Grpc-Status"), "UNAVAILABLE")
	})
	t.Run("Close: a port past the wait without an answer", func(t *testing.T) {
		src := newHandSource()
		h := newHandler(t, src, authz.WithPorts(8080), authz.WithPolicyWait(time.Nanosecond))
		<-src.watched
		require.NoError(t, h.WaitPolicy(context.Background(), waitConn.Local))
		assert.Equal(t, 0, h.Decide(httptest.NewRequest("GET", "/", nil), waitConn).Status, "the default past the wait")
		h.Close()
		assert.Equal(t, http.StatusServiceUnavailable, h.Decide(httptest.NewRequest("GET", "/", nil), waitConn).Status, "refused once closed")
	})
	t.Run("Close: answered ports keep their last policy", func(t *testing.T) {
		src := newHandSource()
		h := newHandler(t, src, authz.WithPorts(8080, 9090))
		<-src.watched
		<-src.watched
		src.answer(8080, deny)
		src.answer(9090, nil)
		h.Close()
		assert.Equal(t, http.StatusForbidden, h.Decide(httptest.NewRequest("GET", "/", nil), waitConn).Status, "the Server answered")
		c := waitConn
		c.Local = netip.MustParseAddrPort("127.0.0.1:9090")
		assert.Equal(t, 0, h.Decide(httptest.NewRequest("GET", "/", nil), c).Status, "the default the Source answered with")
	})
	t.Run("a negative wait", func(t *testing.T) {
		src := newHandSource()
		h := newHandler(t, src, authz.WithPorts(8080), authz.WithPolicyWait(-1))
		<-src.watched
		assert.Equal(t, 0, h.Decide(httptest.NewRequest("GET", "/", nil), waitConn).Status, "the default, at once")
	})
	t.Run("StaticSource without the port", func(t *testing.T) {
		h := newHandler(t, authz.StaticSource{9090: deny})
		assert.Equal(t, 0, h.Decide(httptest.NewRequest("GET", "/", nil), waitConn).Status, "the default, at once")
	})
	t.Run("the target's port is watched from New", func(t *testing.T) {
		src := newHandSource()
		h := newHandler(t, src, authz.WithTarget(netip.MustParseAddrPort("127.0.0.1:7000")))
		require.Equal(t, uint16(7000), <-src.watched)
		h.WatchPorts(8080) // with a target, only its port has a policy
		select {
		case p := <-src.watched:
			t.Fatalf("port %d watched", p)
		default:
		}
		got := decideAsync(context.Background(), h)
		src.answer(7000, deny)
		assert.Equal(t, http.StatusForbidden, (<-got).Status)
	})
	t.Run("past the bound", func(t *testing.T) {
		src := newHandSource()
		var logs testutil.LogLines
		m := testutil.NewMetrics(t)
		h := newHandler(t, src, authz.WithPorts(8080), authz.WithPolicyWait(50*time.Millisecond),
			authz.WithLogger(logs.Logger()), authz.WithMeterProvider(m.Provider))
		<-src.watched
		assert.Equal(t, 0, (<-decideAsync(context.Background(), h)).Status, "the open default, past the bound")
		assert.Equal(t, 1, logs.Count("no inbound policy from the control plane within the wait", "port=8080"), "%s", logs.String())
		assert.Equal(t, "1", m.Value(t, authz.MetricPolicyUnavailable, `target_port="8080"`))
		src.answer(8080, deny)
		assert.Equal(t, http.StatusForbidden, (<-decideAsync(context.Background(), h)).Status, "the late answer decides")
		assert.Equal(t, 1, logs.Count("inbound policy arrived after the wait", "port=8080"), "%s", logs.String())
		assert.Equal(t, "1", m.Value(t, authz.MetricPolicyUnavailable, `target_port="8080"`), "no longer counted")
	})
}

// causeSource is a handSource that knows why it has not answered.
type causeSource struct {
	*handSource
	cause error
}

func (s causeSource) Pending(uint16) error { return s.cause }

// The warning at the end of a port's wait names why the Source has not
// answered when the Source says ([authz.PendingCause]), and only then.
func TestPolicyWaitWarningNamesTheCause(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cause error
	}{
		{"a cause", errors.New("dial tcp 127.0.0.1:8090: connect: connection refused")},
		{"none known", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testutil.LogLines
			src := causeSource{newHandSource(), tc.cause}
			h, err := authz.New(http.NotFoundHandler(), authz.WithSource(src), authz.WithLogger(logs.Logger()),
				authz.WithPolicyWait(time.Millisecond), authz.WithPorts(8080))
			require.NoError(t, err)
			t.Cleanup(h.Close)
			<-src.watched
			require.NoError(t, h.WaitPolicy(context.Background(), waitConn.Local))
			require.Equal(t, 1, logs.Count("no inbound policy from the control plane within the wait", "port=8080"), "%s", logs.String())
			if tc.cause != nil {
				assert.Equal(t, 1, logs.Count("within the wait", `error="dial tcp 127.0.0.1:8090: connect: connection refused"`), "%s", logs.String())
			} else {
				assert.Zero(t, logs.Count("within the wait", "error="), "%s", logs.String())
			}
		})
	}
}
