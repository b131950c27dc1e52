package mesh

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

const traceSvc = "svc.trace.test:80"

// traceMesh is a traced outbound stack routing traceSvc by a policy whose
// one backend is balanced over a static endpoint (zone "zone-a"), in front
// of a traced inbound stack around app, all on loopback.
type traceMesh struct {
	exp    *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	client *http.Client
	addrs  []string // the endpoints' addresses
}

func newTraceMesh(t *testing.T, app http.Handler, rule policy.HTTPRule, opts ...Option) *traceMesh {
	return newTraceMeshN(t, 1, app, rule, opts...)
}

// newTraceMeshN is newTraceMesh with n servers behind the backend.
func newTraceMeshN(t *testing.T, n int, app http.Handler, rule policy.HTTPRule, opts ...Option) *traceMesh {
	return newTraceMeshOutlier(t, n, app, rule, nil, opts...)
}

// newTraceMeshOutlier is newTraceMeshN whose backend has the outlier
// detection od (nil: none).
func newTraceMeshOutlier(t *testing.T, n int, app http.Handler, rule policy.HTTPRule, od *policy.OutlierDetection, opts ...Option) *traceMesh {
	m := &traceMesh{exp: tracetest.NewInMemoryExporter()}
	m.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(m.exp))
	t.Cleanup(func() { _ = m.tp.Shutdown(context.Background()) })
	opts = append([]Option{WithTracerProvider(m.tp)}, opts...)
	var set []endpoint.Endpoint
	for range n {
		server := NewServer(app, ServerOptions(opts...)...)
		t.Cleanup(server.Close)
		addr := serveH2C(t, server)
		m.addrs = append(m.addrs, addr)
		set = append(set, endpoint.Endpoint{Addr: netip.MustParseAddrPort(addr), Labels: map[string]string{"zone": "zone-a"}})
	}

	const backendSvc = "backend.trace.test:80"
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{backendSvc: set})
	require.NoError(t, err)
	rule.Backends = policy.Distribution{Kind: policy.DistributionFirstAvailable, Backends: []policy.RouteBackend{{
		Backend: policy.Backend{Meta: policy.Metadata{Kind: "Service", Namespace: "ns", Name: "backend", Port: 80},
			Balancer: &policy.Balancer{Authority: backendSvc, Outlier: od}}, Weight: 1}}}
	routes := []policy.HTTPRoute{{Meta: policy.Metadata{Group: "gateway.networking.k8s.io", Kind: "HTTPRoute", Namespace: "ns", Name: "web"},
		Rules: []policy.HTTPRule{rule}}}
	pol := policy.NewStaticSource(map[string]*policy.Policy{traceSvc: {
		Parent: policy.Metadata{Kind: "Service", Namespace: "ns", Name: "svc", Port: 80}, Protocol: policy.ProtocolDetect,
		HTTP1: policy.HTTPProtocol{Routes: routes}, HTTP2: policy.HTTPProtocol{Routes: routes}}})
	client := NewClient(append(ClientOptions(opts...), WithPolicies(pol), WithEndpoints(eps),
		WithDiscoveryWait(testutil.Timeout))...)
	t.Cleanup(client.Close)
	m.client = &http.Client{Transport: client, Timeout: testutil.Timeout}
	return m
}

// get sends GET path under a root span of the test's and returns the
// response status and the root span's context.
func (m *traceMesh) get(t *testing.T, path string) (int, trace.SpanContext) {
	ctx, root := m.tp.Tracer("test").Start(context.Background(), "app")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+traceSvc+path, nil)
	require.NoError(t, err)
	resp, err := m.client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	root.End()
	return resp.StatusCode, root.SpanContext()
}

// spans waits for n spans and returns them.
func (m *traceMesh) spans(t *testing.T, n int) tracetest.SpanStubs {
	t.Helper()
	require.Eventually(t, func() bool { return len(m.exp.GetSpans()) >= n }, testutil.Timeout, 5*time.Millisecond,
		"spans: %d of %d", len(m.exp.GetSpans()), n)
	return m.exp.GetSpans()
}

// node is a span and its children, by start time.
type node struct {
	span     tracetest.SpanStub
	children []*node
}

// tree returns the spans of the trace of root as a tree under root, and
// fails the test for a span of another trace or one whose parent is not
// in the trace.
func tree(t *testing.T, spans tracetest.SpanStubs, root trace.SpanContext) *node {
	t.Helper()
	byID := map[trace.SpanID]*node{}
	for _, s := range spans {
		require.Equal(t, root.TraceID(), s.SpanContext.TraceID(), "span %s is of another trace", s.Name)
		byID[s.SpanContext.SpanID()] = &node{span: s}
	}
	var top *node
	for _, s := range spans {
		n := byID[s.SpanContext.SpanID()]
		if s.SpanContext.SpanID() == root.SpanID() {
			top = n
			continue
		}
		p := byID[s.Parent.SpanID()]
		require.NotNil(t, p, "the parent of span %s (%v) is not in the trace", s.Name, s.SpanKind)
		p.children = append(p.children, n)
	}
	for _, n := range byID {
		ch := n.children
		for i := 1; i < len(ch); i++ {
			for j := i; j > 0 && ch[j].span.StartTime.Before(ch[j-1].span.StartTime); j-- {
				ch[j], ch[j-1] = ch[j-1], ch[j]
			}
		}
	}
	require.NotNil(t, top)
	return top
}

func attr(s tracetest.SpanStub, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// A retried request: the client span of the logical request has a child
// per attempt (first, then retry), each the parent of the server span its
// request made on the other side; route, backend, endpoint, zone and the
// classification are on the spans. It is the first request of the
// stacks: nothing warmed them up.
func TestTraceRetriedRequest(t *testing.T) {
	var n atomic.Int64
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	})
	bo := backoff.Policy{Min: time.Millisecond, Max: time.Millisecond}
	m := newTraceMesh(t, app, policy.HTTPRule{Retry: &policy.Retry{MaxRetries: 1, Backoff: &bo,
		StatusRanges: []policy.StatusRange{{Start: 500, End: 599}}}})
	status, root := m.get(t, "/books")
	require.Equal(t, http.StatusOK, status)

	top := tree(t, m.spans(t, 6), root)
	require.Len(t, top.children, 1, "one client span under the application's")
	client := top.children[0]
	assert.Equal(t, trace.SpanKindClient, client.span.SpanKind)
	assert.Equal(t, "GET", client.span.Name)
	assert.Equal(t, "web", attr(client.span, "inmesh.route").AsString())
	assert.Equal(t, "HTTPRoute", attr(client.span, "inmesh.route.kind").AsString())
	assert.Equal(t, "success", attr(client.span, "inmesh.classification").AsString())
	assert.Equal(t, int64(1), attr(client.span, "inmesh.retries").AsInt64())
	assert.Equal(t, int64(200), attr(client.span, "http.response.status_code").AsInt64())
	assert.Equal(t, "svc.trace.test", attr(client.span, "server.address").AsString())

	require.Len(t, client.children, 2, "one span per attempt")
	for i, want := range []struct {
		kind   string
		status int64
	}{{"first", 503}, {"retry", 200}} {
		a := client.children[i]
		assert.Equal(t, trace.SpanKindClient, a.span.SpanKind)
		assert.Equal(t, want.kind, attr(a.span, "inmesh.attempt.kind").AsString(), "attempt %d", i)
		assert.Equal(t, want.status, attr(a.span, "http.response.status_code").AsInt64(), "attempt %d", i)
		assert.Equal(t, int64(i), attr(a.span, "http.request.resend_count").AsInt64(), "attempt %d", i)
		assert.Equal(t, "backend", attr(a.span, "inmesh.backend").AsString())
		assert.Equal(t, "zone-a", attr(a.span, "inmesh.zone").AsString())
		assert.NotEmpty(t, attr(a.span, "inmesh.endpoint").AsString())
		assert.Equal(t, "127.0.0.1", attr(a.span, "network.peer.address").AsString())
		require.Len(t, a.children, 1, "the server span of attempt %d", i)
		srv := a.children[0]
		assert.Equal(t, trace.SpanKindServer, srv.span.SpanKind)
		assert.Equal(t, want.status, attr(srv.span, "http.response.status_code").AsInt64())
		assert.Equal(t, "/books", attr(srv.span, "url.path").AsString())
	}
	assert.Equal(t, codes.Error, client.children[0].span.Status.Code, "the failed attempt")
	assert.Equal(t, codes.Unset, client.children[1].span.Status.Code)
	assert.Equal(t, codes.Unset, client.span.Status.Code)
}

// A request whose route times out: the client span says 504, the mesh's
// l5d-proxy-error and REQUEST_TIMEOUT, and the server span under it saw
// the request (a route that never retries sends one attempt, which is the
// client span itself). With retries, the attempt that timed out is cut
// off and no retry follows a route timeout.
func TestTraceTimedOutRequest(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	m := newTraceMesh(t, app, policy.HTTPRule{Timeouts: policy.Timeouts{Request: 200 * time.Millisecond}})
	status, root := m.get(t, "/slow")
	require.Equal(t, http.StatusGatewayTimeout, status)

	top := tree(t, m.spans(t, 3), root)
	require.Len(t, top.children, 1)
	client := top.children[0]
	assert.Equal(t, int64(504), attr(client.span, "http.response.status_code").AsInt64())
	assert.Equal(t, "REQUEST_TIMEOUT", attr(client.span, "error.type").AsString())
	assert.Equal(t, "failure", attr(client.span, "inmesh.classification").AsString())
	assert.Contains(t, attr(client.span, "inmesh.proxy_error").AsString(), "request timed out after 200ms")
	assert.Equal(t, codes.Error, client.span.Status.Code)
	assert.Equal(t, "zone-a", attr(client.span, "inmesh.zone").AsString(), "the endpoint of its one attempt")
	require.Len(t, client.children, 1, "the server span")
	assert.Equal(t, trace.SpanKindServer, client.children[0].span.SpanKind)

	m.exp.Reset()
	bo := backoff.Policy{Min: time.Millisecond, Max: time.Millisecond}
	m = newTraceMesh(t, app, policy.HTTPRule{Timeouts: policy.Timeouts{Request: 200 * time.Millisecond},
		Retry: &policy.Retry{MaxRetries: 1, Backoff: &bo}})
	status, root = m.get(t, "/slow")
	require.Equal(t, http.StatusGatewayTimeout, status)
	top = tree(t, m.spans(t, 4), root)
	client = top.children[0]
	assert.Equal(t, "REQUEST_TIMEOUT", attr(client.span, "error.type").AsString())
	require.Len(t, client.children, 1, "one attempt: a route timeout is not retried")
	a := client.children[0]
	assert.Equal(t, "first", attr(a.span, "inmesh.attempt.kind").AsString())
	assert.Equal(t, codes.Error, a.span.Status.Code, "the attempt was cut off")
	require.Len(t, a.children, 1)
	assert.Equal(t, trace.SpanKindServer, a.children[0].span.SpanKind)
}

// The inbound stack continues the trace a request carries in W3C or in B3
// headers (Linkerd's proxies send both), and the application's requests
// through the outbound stack carry it on in both forms; an unsampled
// parent stays unsampled downstream (parent-based sampling).
func TestTracePropagation(t *testing.T) {
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	for _, tc := range []struct {
		name    string
		headers map[string]string
		sampled bool
	}{
		{"w3c", map[string]string{"Traceparent": "00-" + traceID + "-" + spanID + "-01"}, true},
		{"b3 multi", map[string]string{"X-B3-Traceid": traceID, "X-B3-Spanid": spanID, "X-B3-Sampled": "1"}, true},
		{"b3 single", map[string]string{"B3": traceID + "-" + spanID + "-1"}, true},
		{"w3c unsampled", map[string]string{"Traceparent": "00-" + traceID + "-" + spanID + "-00"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan http.Header, 1)
			last := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() })
			// The application behind the first inbound stack calls the
			// next service through the outbound stack, with its request's
			// context.
			m := newTraceMesh(t, last, policy.HTTPRule{})
			front := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://"+traceSvc+"/next", nil)
				resp, err := m.client.Do(req)
				if err != nil {
					w.WriteHeader(http.StatusBadGateway)
					return
				}
				resp.Body.Close()
			}), WithTracerProvider(m.tp))
			t.Cleanup(front.Close)
			addr := serveH2C(t, front)
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)

			h := <-got
			w3c := propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(h))
			sc := trace.SpanContextFromContext(w3c)
			assert.Equal(t, traceID, sc.TraceID().String(), "traceparent downstream")
			assert.Equal(t, traceID, h.Get("X-B3-Traceid"), "B3 downstream")
			assert.Equal(t, sc.SpanID().String(), h.Get("X-B3-Spanid"), "both forms name the same span")
			assert.Equal(t, tc.sampled, sc.IsSampled())
			assert.Empty(t, h.Get("B3"), "no stale single-header B3")
			if !tc.sampled {
				assert.Equal(t, "0", h.Get("X-B3-Sampled"))
				assert.Empty(t, m.exp.GetSpans(), "nothing recorded under an unsampled parent")
				return
			}
			// front's server span, its client span (the route never
			// retries: its one attempt), the last server span: one
			// trace, each the parent of the next.
			spans := m.spans(t, 3)
			var srv tracetest.SpanStub
			for _, s := range spans {
				assert.Equal(t, traceID, s.SpanContext.TraceID().String())
				if s.Parent.SpanID().String() == spanID {
					srv = s
				}
			}
			assert.Equal(t, trace.SpanKindServer, srv.SpanKind, "the caller's span is the parent of the server span")
		})
	}
}

// Without a tracer provider, or with OpenTelemetry's no-op one, a request
// through both stacks allocates no more than before tracing existed: the
// hooks are branches.
//
// A request's allocation count is not a whole constant. Under the race
// detector sync.Pool drops a quarter of what is put back, at random, so a
// request through both stacks allocates some 64 to 79 times, about 69 on
// average, and the mean of 200 requests wanders by tenths either side of a
// whole number; testing.AllocsPerRun rounds that mean down, so two equal
// stacks could differ by one. The test therefore compares unrounded means
// over 1,500 requests each, measured in interleaved blocks so that both
// stacks see the same machine, with the garbage collector off while a
// block runs. One allocation more per request moves a mean by a whole one.
func TestNoopTracerAddsNoAllocation(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	stack := func(opts ...Option) func() {
		server := NewServer(app, ServerOptions(opts...)...)
		t.Cleanup(server.Close)
		addr := serveH2C(t, server)
		client := NewClient(ClientOptions(opts...)...)
		t.Cleanup(client.Close)
		hc := &http.Client{Transport: client}
		get := func() {
			resp, err := hc.Get("http://" + addr + "/")
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		get()
		return get
	}
	without := stack()
	with := stack(WithTracerProvider(noop.NewTracerProvider()))
	const blocks, runs = 5, 300
	var meanWithout, meanWith float64
	for range blocks {
		meanWithout += meanAllocs(runs, without) / blocks
		meanWith += meanAllocs(runs, with) / blocks
	}
	t.Logf("allocations per request: %.2f without a provider, %.2f with the no-op one", meanWithout, meanWith)
	assert.InDelta(t, meanWithout, meanWith, 0.5, "a whole allocation more is a real one")
}

// meanAllocs is the mean number of heap allocations of f over runs calls,
// measured as testing.AllocsPerRun measures it (one P, after a warm-up
// call) but not rounded down, and with the garbage collector off meanwhile.
func meanAllocs(runs int, f func()) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f()
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(runs)
}

// A hedged request: the client span has the first attempt and the hedge
// (to the other endpoint) as children, each the parent of the server span
// it made; the first, stalled, is cancelled once the hedge answers.
func TestTraceHedgedRequest(t *testing.T) {
	var n atomic.Int64
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			// The first attempt stalls until the hedge's answer cancels
			// it (bounded, so that a missing hedge fails the test, not
			// hangs it).
			select {
			case <-r.Context().Done():
			case <-time.After(testutil.Timeout / 2):
			}
			return
		}
		io.WriteString(w, "ok")
	})
	// The delay leaves the first attempt ample time to pick its endpoint
	// (no hedge goes out before it has), even on a loaded machine.
	m := newTraceMeshN(t, 2, app, policy.HTTPRule{Hedge: &hedge.Policy{Delay: 200 * time.Millisecond, MaxExtraLoad: 1}})
	status, root := m.get(t, "/books")
	require.Equal(t, http.StatusOK, status)

	top := tree(t, m.spans(t, 6), root)
	require.Len(t, top.children, 1)
	client := top.children[0]
	assert.Equal(t, int64(200), attr(client.span, "http.response.status_code").AsInt64())
	require.Len(t, client.children, 2, "the first attempt and the hedge")
	first, hedged := client.children[0], client.children[1]
	assert.Equal(t, "first", attr(first.span, "inmesh.attempt.kind").AsString())
	assert.Equal(t, "hedge", attr(hedged.span, "inmesh.attempt.kind").AsString())
	assert.Equal(t, int64(1), attr(hedged.span, "http.request.resend_count").AsInt64())
	assert.Equal(t, int64(200), attr(hedged.span, "http.response.status_code").AsInt64())
	assert.NotEqual(t, attr(first.span, "inmesh.endpoint").AsString(), attr(hedged.span, "inmesh.endpoint").AsString(),
		"the hedge went to the other endpoint")
	for _, a := range []*node{first, hedged} {
		require.Len(t, a.children, 1, "the server span of the %s attempt", attr(a.span, "inmesh.attempt.kind").AsString())
		assert.Equal(t, trace.SpanKindServer, a.children[0].span.SpanKind)
	}
}

// events returns the names of the span's events.
func events(s tracetest.SpanStub) []string {
	var names []string
	for _, e := range s.Events {
		names = append(names, e.Name)
	}
	return names
}

// An endpoint that outlier detection ejected: the spans of the requests
// picked while it is out carry the endpoint_skipped event with the number
// of ejected endpoints, and name the other endpoint; the spans before the
// ejection carry no event at all (a span gets events only when something
// happened).
func TestTraceEjectedEndpointSkipped(t *testing.T) {
	var bad atomic.Pointer[string]
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && bad.Load() != nil && a.String() == *bad.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "ok")
	})
	od := &policy.OutlierDetection{Interval: 100 * time.Millisecond, BaseEjectionTime: time.Hour, MaxEjectionTime: time.Hour,
		MaxEjectionPercent: 50, FailurePercentage: &policy.FailurePercentageEjection{Threshold: 50, EnforcementPercentage: 100,
			MinimumHosts: 2, RequestVolume: 2}}
	m := newTraceMeshOutlier(t, 2, app, policy.HTTPRule{}, od)
	bad.Store(&m.addrs[0])

	// Requests until one's span says the balancer skipped an ejected
	// endpoint; a route that never retries: the client span is the
	// attempt's, under the application's root.
	var client tracetest.SpanStub
	deadline := time.Now().Add(testutil.Timeout)
	for sent := 0; client.Name == ""; {
		require.True(t, time.Now().Before(deadline), "no span has the event after %d requests", sent)
		_, root := m.get(t, "/books")
		sent++
		// The root, the client span and the server span.
		for _, s := range m.spans(t, 3*sent) {
			if s.SpanKind != trace.SpanKindClient || s.Parent.SpanID() != root.SpanID() {
				continue
			}
			switch ev := events(s); {
			case len(ev) == 0:
			case slices.Equal(ev, []string{"inmesh.balancer.endpoint_skipped"}):
				client = s
			default:
				t.Fatalf("events %v on the span of request %d", ev, sent)
			}
		}
	}
	require.Len(t, client.Events, 1)
	ev := client.Events[0]
	require.Len(t, ev.Attributes, 1)
	assert.Equal(t, attribute.Int64("inmesh.balancer.ejected", 1), ev.Attributes[0])
	assert.Equal(t, m.addrs[1], attr(client, "inmesh.endpoint").AsString(), "the pick went to the endpoint in rotation")

	// Every request from now on skips it, and says so.
	m.exp.Reset()
	for range 5 {
		status, _ := m.get(t, "/books")
		assert.Equal(t, http.StatusOK, status)
	}
	for _, s := range m.spans(t, 15) {
		if s.SpanKind == trace.SpanKindClient {
			assert.Equal(t, []string{"inmesh.balancer.endpoint_skipped"}, events(s))
			assert.Equal(t, m.addrs[1], attr(s, "inmesh.endpoint").AsString())
		}
	}
}

// A mirrored request: the mirror's copy is an attempt of the request
// (README "Tracing": inmesh.attempt.kind mirror) under its client span,
// whose trace context the copy carries, so that the server span the copy
// made at the mirror is its child; the primary's server span is the
// client span's other child.
func TestTraceMirroredRequest(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	mirrored := make(chan http.Header, 1)
	mirror := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mirrored <- r.Header.Clone()
	}), WithTracerProvider(tp), WithLogger(quiet))
	t.Cleanup(mirror.Close)
	maddr := serveH2C(t, mirror)
	rule := policy.HTTPRule{Mirrors: []policy.Mirror{{Meta: policy.Metadata{Kind: "Service", Namespace: "ns", Name: "shadow", Port: 80},
		Forward: &endpoint.Endpoint{Addr: netip.MustParseAddrPort(maddr)}}}}
	m := newTraceMesh(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), rule,
		WithTracerProvider(tp))
	m.tp, m.exp = tp, exp // the stacks' provider, the mirror's too
	status, root := m.get(t, "/books")
	require.Equal(t, http.StatusOK, status)
	var h http.Header
	select {
	case h = <-mirrored:
	case <-time.After(testutil.Timeout):
		t.Fatal("no copy reached the mirror")
	}

	// The application's span, the client span, the primary's server span,
	// the copy's span and the mirror's server span.
	top := tree(t, m.spans(t, 5), root)
	require.Len(t, top.children, 1)
	client := top.children[0]
	require.Len(t, client.children, 2, "the primary's server span and the copy's span")
	var primary, copied *node
	for _, c := range client.children {
		if c.span.SpanKind == trace.SpanKindServer {
			primary = c
		} else {
			copied = c
		}
	}
	require.NotNil(t, primary, "the primary's server span")
	require.NotNil(t, copied, "the copy's span")
	assert.Equal(t, trace.SpanKindClient, copied.span.SpanKind)
	assert.Equal(t, "mirror", attr(copied.span, "inmesh.attempt.kind").AsString())
	// The copy keeps the request's Host, which names the URL as Linkerd's
	// proxy names it (linkerd/trace-context/src/service.rs: url.full from
	// the request's URI, whose authority is its Host).
	assert.Equal(t, "http://"+traceSvc+"/books", attr(copied.span, "url.full").AsString())
	assert.Equal(t, int64(200), attr(copied.span, "http.response.status_code").AsInt64())
	require.Len(t, copied.children, 1, "the mirror's server span")
	assert.Equal(t, trace.SpanKindServer, copied.children[0].span.SpanKind)
	sc := copied.span.SpanContext
	assert.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", h.Get("Traceparent"),
		"the copy carries its own span's context")
}

// A request on the default route of a name without a profile: its client
// span names the route "default" of kind ServiceProfile, for every name.
func TestTraceDefaultRoute(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	app := testutil.NewServer(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	addr := netip.MustParseAddrPort(app.Listener.Addr().String())
	names := []string{"books.trace.test:80", "authors.trace.test:80"}
	eps, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{names[0]: {{Addr: addr}}, names[1]: {{Addr: addr}}})
	require.NoError(t, err)
	client := NewClient(WithTracerProvider(tp), WithEndpoints(eps), WithLogger(quiet))
	t.Cleanup(client.Close)
	for _, name := range names {
		ctx, root := tp.Tracer("test").Start(context.Background(), "app")
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+name+"/", nil)
		require.NoError(t, err)
		resp, err := client.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		root.End()
	}
	var clients int
	for _, s := range exp.GetSpans() {
		if s.SpanKind != trace.SpanKindClient || s.Parent.SpanID() == (trace.SpanID{}) {
			continue
		}
		if attr(s, "inmesh.route").Type() == attribute.EMPTY {
			continue // an attempt's span
		}
		clients++
		assert.Equal(t, "default", attr(s, "inmesh.route").AsString(), "%s", s.Name)
		assert.Equal(t, "ServiceProfile", attr(s, "inmesh.route.kind").AsString(), "%s", s.Name)
	}
	assert.Equal(t, len(names), clients, "a span with the route for each request")
}
