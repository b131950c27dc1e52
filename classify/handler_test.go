package classify

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHandlerMetrics(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		m := testutil.NewMetrics(t)
		app := http.NewServeMux()
		app.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
		app.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(502) })
		app.HandleFunc("/implicit", func(w http.ResponseWriter, r *http.Request) {})
		app.HandleFunc("/grpc-trailer", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Trailer", "Grpc-Status")
			w.Write([]byte("msg"))
			w.Header().Set("Grpc-Status", "14")
		})
		app.HandleFunc("/grpc-prefix", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Write([]byte("msg"))
			w.(http.Flusher).Flush() // undeclared trailers need a chunked (or h2) body
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "13")
		})
		app.HandleFunc("/grpc-head", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Status", "5")
			w.WriteHeader(200)
		})
		srv := testutil.NewServer(t, NewHandler(app, WithMeterProvider(m.Provider)))
		client := &http.Client{Transport: NewTransport(testutil.NewTransport(t, mode), WithMeterProvider(m.Provider))}
		for _, path := range []string{"/ok", "/fail", "/implicit", "/grpc-trailer", "/grpc-prefix", "/grpc-head"} {
			req, _ := http.NewRequest("POST", srv.URL+path, nil)
			if strings.HasPrefix(path, "/grpc") {
				req.Header.Set("Content-Type", "application/grpc")
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		host := strings.TrimPrefix(srv.URL, "http://")
		for _, dir := range []string{"inbound", "outbound"} {
			base := []string{`authority="` + host + `"`, `direction="` + dir + `"`}
			assert.Equal(t, "6", m.Value(t, "request_total", base...))
			assert.Equal(t, "2", m.Value(t, "response_total", append(base, `status_code="200"`, `classification="success"`, `grpc_status=""`, `error=""`)...), dir)
			assert.Equal(t, "1", m.Value(t, "response_total", append(base, `status_code="502"`, `classification="failure"`)...), dir)
			assert.Equal(t, "1", m.Value(t, "response_total", append(base, `grpc_status="14"`, `classification="failure"`)...), dir)
			assert.Equal(t, "1", m.Value(t, "response_total", append(base, `grpc_status="13"`, `classification="failure"`)...), dir)
			assert.Equal(t, "1", m.Value(t, "response_total", append(base, `grpc_status="5"`, `classification="success"`)...), dir)
			assert.Equal(t, "5", m.Value(t, "response_latency_ms_count", append(base, `status_code="200"`)...))
		}
	})
}

func TestTransportError(t *testing.T) {
	m := testutil.NewMetrics(t)
	client := &http.Client{Transport: NewTransport(testutil.NewTransport(t, testutil.H1), WithMeterProvider(m.Provider))}
	_, err := client.Get("http://" + testutil.FreeAddr(t) + "/")
	require.Error(t, err)
	lines := m.Lines(t, "response_total", `direction="outbound"`, `classification="failure"`, `error="unclassified"`)
	require.Len(t, lines, 1)
	assert.NotContains(t, lines[0], "status_code", "no status without a response head")
}

// The wrapped writer offers exactly the optional interfaces of the writer
// below it, and Unwrap reaches it for http.ResponseController.
func TestHandlerKeepsWriterInterfaces(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		type seen struct{ flusher, hijacker, readerFrom, pusher, deadline bool }
		got := make(chan seen, 1)
		app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var s seen
			_, s.flusher = w.(http.Flusher)
			_, s.hijacker = w.(http.Hijacker)
			_, s.readerFrom = w.(io.ReaderFrom)
			_, s.pusher = w.(http.Pusher)
			s.deadline = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Minute)) == nil
			got <- s
		})
		srv := testutil.NewServer(t, NewHandler(app))
		client := &http.Client{Transport: testutil.NewTransport(t, mode)}
		resp, err := client.Get(srv.URL)
		require.NoError(t, err)
		resp.Body.Close()
		s := <-got
		assert.True(t, s.flusher)
		assert.True(t, s.deadline, "ResponseController reaches the connection through Unwrap")
		if mode == testutil.H1 {
			assert.True(t, s.hijacker)
			assert.True(t, s.readerFrom)
			assert.False(t, s.pusher)
		} else {
			assert.False(t, s.hijacker, "HTTP/2 writers cannot be hijacked, nor can the wrapper")
		}
	})
	// A writer with no optional interface stays without.
	var plain struct{ http.ResponseWriter }
	plain.ResponseWriter = httptest.NewRecorder()
	NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, f := w.(http.Flusher)
		assert.False(t, f)
	})).ServeHTTP(plain, httptest.NewRequest("GET", "/", nil))
}

func TestHandlerHijack(t *testing.T) {
	m := testutil.NewMetrics(t)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nhello")
		buf.Flush()
	})
	srv := testutil.NewServer(t, NewHandler(app, WithMeterProvider(m.Provider)))
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	assert.Equal(t, 101, resp.StatusCode)
	require.Eventually(t, func() bool {
		return m.Value(t, "response_total", `direction="inbound"`, `classification="success"`) == "1"
	}, testutil.Timeout, 5*time.Millisecond)
}

func TestHandlerPanicIsRecorded(t *testing.T) {
	m := testutil.NewMetrics(t)
	h := NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) }), WithMeterProvider(m.Provider))
	assert.PanicsWithValue(t, http.ErrAbortHandler, func() { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil)) })
	assert.Equal(t, "1", m.Value(t, "response_total", `classification="failure"`, `error="unclassified"`))
}

func TestAuthorityBound(t *testing.T) {
	m := testutil.NewMetrics(t)
	h := NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), WithMeterProvider(m.Provider), WithMaxAuthorities(3))
	for i := range 50 {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = strings.Repeat("h", i+1) + ".example.com"
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Host = "bad host\r\n"
	h.ServeHTTP(httptest.NewRecorder(), r)
	assert.Len(t, m.Lines(t, "request_total"), 4, "three authorities and other")
	assert.Equal(t, "48", m.Value(t, "request_total", `authority="other"`))
}

// A request's labels come from its context, set by WithLabels or by a
// LabelsContext; a LabelsContext without labels leaves its parent's.
func TestLabelsFromContext(t *testing.T) {
	labels := NewLabels("dst_", map[string]string{"pod": "books-0", "namespace": "default"})
	for _, tc := range []struct {
		name string
		with func(context.Context) context.Context
	}{
		{"WithLabels", func(ctx context.Context) context.Context { return WithLabels(ctx, labels) }},
		{"LabelsContext", func(ctx context.Context) context.Context { return &LabelsContext{Context: ctx, Labels: labels} }},
		{"LabelsContext without labels", func(ctx context.Context) context.Context {
			return &LabelsContext{Context: WithLabels(ctx, labels)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testutil.NewMetrics(t)
			srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			tr := NewTransport(testutil.NewTransport(t, testutil.H1), WithMeterProvider(m.Provider))
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req = req.WithContext(tc.with(req.Context()))
			assert.Same(t, labels, LabelsFromContext(req.Context()))
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, "1", m.Value(t, "request_total", `dst_namespace="default"`, `dst_pod="books-0"`))
		})
	}
}

// A handler's default labels apply to requests whose context carries
// none; labels in the context take their place.
func TestDefaultLabels(t *testing.T) {
	m := testutil.NewMetrics(t)
	h := NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		WithMeterProvider(m.Provider), WithDefaultLabels(NewLabels("", map[string]string{"tls": "disabled"})))
	r := httptest.NewRequest("GET", "http://books:7000/", nil)
	h.ServeHTTP(httptest.NewRecorder(), r)
	h.ServeHTTP(httptest.NewRecorder(), r.WithContext(WithLabels(r.Context(), NewLabels("", map[string]string{"tls": "true"}))))
	assert.Equal(t, "1", m.Value(t, "request_total", `tls="disabled"`))
	assert.Equal(t, "1", m.Value(t, "request_total", `tls="true"`))
	assert.Len(t, m.Lines(t, "request_total"), 2)
}

func TestHandlerAllocations(t *testing.T) {
	h := NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }))
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	h.ServeHTTP(w, r)
	allocs := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) })
	assert.Zero(t, allocs, "classification and recording allocate nothing")
}

func TestEqualLabelsShareATarget(t *testing.T) {
	rec := newRecorder(newConfig(nil), "outbound")
	for range 100 {
		// A balancer builds new Labels on every endpoint update.
		rec.target("books:7000", NewLabels("dst_", map[string]string{"pod": "books-0"}))
	}
	rec.target("books:7000", NewLabels("dst_", map[string]string{"pod": "books-1"}))
	assert.Len(t, rec.reg.Get("books:7000").Load().targets, 2)
}

// A nil handler is refused when the handler is made, with a message that
// names the mistake, not by a panic at the first request.
func TestNilHandlerIsRefusedAtConstruction(t *testing.T) {
	for name, h := range map[string]http.Handler{
		"nil":                nil,
		"nil HandlerFunc":    http.HandlerFunc(nil),
		"nil *http.ServeMux": (*http.ServeMux)(nil),
	} {
		t.Run(name, func(t *testing.T) {
			assert.PanicsWithValue(t, "classify: NewHandler: nil handler", func() { NewHandler(h) })
			assert.PanicsWithValue(t, "classify: nil handler", func() { NewMiddleware()(h) })
		})
	}
	assert.NotPanics(t, func() { NewHandler(http.NotFoundHandler()) })
}
