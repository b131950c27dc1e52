package meshtrace

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	w3cTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	w3cSpan  = "00f067aa0ba902b7"
	b3Trace  = "463ac35c9f6413ad48485a3953bb6124"
	b3Span   = "a2fb4a1d1a96d312"
)

// The default propagator's extraction reads only the headers a request
// carries, and finds what the composite propagator finds: W3C wins over
// B3, an invalid traceparent leaves B3 to decide, baggage comes with
// either (the header sets of contrib/propagators/b3's and otel's
// propagation tests: b3_integration_test.go, trace_context_test.go).
func TestExtractAsThePropagators(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    string // trace ID, "" for none
	}{
		{"none", nil, ""},
		{"unrelated", map[string]string{"Accept": "*/*"}, ""},
		{"w3c", map[string]string{"Traceparent": "00-" + w3cTrace + "-" + w3cSpan + "-01"}, w3cTrace},
		{"w3c with state", map[string]string{"Traceparent": "00-" + w3cTrace + "-" + w3cSpan + "-01", "Tracestate": "a=1,b=2"}, w3cTrace},
		{"b3 multi", map[string]string{"X-B3-Traceid": b3Trace, "X-B3-Spanid": b3Span, "X-B3-Sampled": "1"}, b3Trace},
		{"b3 single", map[string]string{"B3": b3Trace + "-" + b3Span + "-1"}, b3Trace},
		{"both: w3c wins", map[string]string{"Traceparent": "00-" + w3cTrace + "-" + w3cSpan + "-00",
			"X-B3-Traceid": b3Trace, "X-B3-Spanid": b3Span, "X-B3-Sampled": "1"}, w3cTrace},
		{"invalid traceparent, b3", map[string]string{"Traceparent": "00-zz-" + w3cSpan + "-01",
			"X-B3-Traceid": b3Trace, "X-B3-Spanid": b3Span}, b3Trace},
		{"invalid traceparent alone", map[string]string{"Traceparent": "garbage"}, ""},
		{"baggage alone", map[string]string{"Baggage": "k=v"}, ""},
		{"w3c and baggage", map[string]string{"Traceparent": "00-" + w3cTrace + "-" + w3cSpan + "-01", "Baggage": "k=v,l=w"}, w3cTrace},
		{"b3 sampling only", map[string]string{"X-B3-Sampled": "0"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.headers {
				h.Set(k, v)
			}
			tr := New(sdktrace.NewTracerProvider(), nil, "")
			got := tr.extract(context.Background(), h)
			want := DefaultPropagator().Extract(context.Background(), propagation.HeaderCarrier(h))
			gsc, wsc := trace.SpanContextFromContext(got), trace.SpanContextFromContext(want)
			assert.Equal(t, wsc, gsc)
			assert.Equal(t, tc.want != "", gsc.IsValid())
			if tc.want != "" {
				assert.Equal(t, tc.want, gsc.TraceID().String())
			}
			assert.ElementsMatch(t, baggage.FromContext(want).Members(), baggage.FromContext(got).Members())
		})
	}
}

// With no trace header, extraction returns the context it was given: no
// context is made for nothing.
func TestExtractWithoutHeadersAllocatesNothing(t *testing.T) {
	tr := New(sdktrace.NewTracerProvider(), nil, "")
	h := http.Header{"Accept": {"*/*"}, "User-Agent": {"x"}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() { _ = tr.extract(ctx, h) })
	assert.Zero(t, allocs)
}

// inject replaces the trace headers a request came with (a stale single
// B3 header among them) and copies the others, leaving the caller's
// request and header map as they were.
func TestInjectReplacesTraceHeaders(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	tr := New(tp, nil, "")
	ctx, s := tp.Tracer("test").Start(tr.with(context.Background()), "x")
	defer s.End()
	req := httptest.NewRequest(http.MethodGet, "http://svc/", nil).WithContext(ctx)
	req.Header = http.Header{"Accept": {"a", "b"}, "B3": {b3Trace + "-" + b3Span}, "Traceparent": {"old"}, "X-Empty": nil}
	before := req.Header.Clone()

	out := tr.inject(req)
	assert.Equal(t, before, req.Header, "the caller's headers are untouched")
	assert.Equal(t, []string{"a", "b"}, out.Header["Accept"])
	assert.Contains(t, out.Header, "X-Empty")
	assert.NotContains(t, out.Header, "B3")
	sc := s.SpanContext()
	assert.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", out.Header.Get("Traceparent"))
	assert.Equal(t, sc.TraceID().String(), out.Header.Get("X-B3-Traceid"))
	assert.Equal(t, sc.SpanID().String(), out.Header.Get("X-B3-Spanid"))
	assert.Equal(t, "1", out.Header.Get("X-B3-Sampled"))
	out.Header["Accept"][0] = "changed"
	assert.Equal(t, "a", req.Header["Accept"][0], "the copy shares no values with the caller's")
}

// The server span's writer keeps the optional interfaces of the writer
// below (io.ReaderFrom among them, which net/http's writer has, so that
// io.Copy into it can use sendfile), and records the status the handler
// answered with.
func TestHandlerKeepsWriterInterfaces(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	var readerFrom, flusher, hijacker bool
	h := New(tp, nil, "").Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, readerFrom = w.(io.ReaderFrom)
		_, flusher = w.(http.Flusher)
		_, hijacker = w.(http.Hijacker)
		w.WriteHeader(http.StatusTeapot)
		_, _ = io.Copy(w, strings.NewReader("short and stout"))
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/pot")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "short and stout", string(body))
	assert.True(t, readerFrom, "io.ReaderFrom")
	assert.True(t, flusher, "http.Flusher")
	assert.True(t, hijacker, "http.Hijacker")
	spans := exp.GetSpans()
	require.Len(t, spans, 1)
	var code int64
	for _, kv := range spans[0].Attributes {
		if kv.Key == "http.response.status_code" {
			code = kv.Value.AsInt64()
		}
	}
	assert.Equal(t, int64(http.StatusTeapot), code)
}

// attrSampler samples everything and keeps the attributes each span was
// started with, as an attribute-based sampler would see them.
type attrSampler struct{ seen [][]attribute.KeyValue }

func (s *attrSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	s.seen = append(s.seen, append([]attribute.KeyValue(nil), p.Attributes...))
	return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample}
}

func (s *attrSampler) Description() string { return "attrSampler" }

// Spans start with their attributes from a pooled buffer whose options are
// made once: the sampler sees them at the start, each span has exactly its
// own (none left from the buffer's last span), and a caller that appends
// beyond the buffer's room loses none.
func TestStartAttributes(t *testing.T) {
	sampler := &attrSampler{}
	rec := tracetest.NewSpanRecorder()
	tr := New(sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(rec)), nil, "")
	startWith := func(kv ...attribute.KeyValue) {
		b := startBufs.Get().(*startBuf)
		b.attrs = append(b.attrs, kv...)
		_, s := tr.start(context.Background(), "op", clientKind, b)
		s.End()
	}
	many := make([]attribute.KeyValue, startAttrsCap+4)
	for i := range many {
		many[i] = attribute.Int("k"+strconv.Itoa(i), i)
	}
	cases := [][]attribute.KeyValue{
		many[:3], many[:1], nil, many[:startAttrsCap], many, many[:2],
	}
	for _, kv := range cases {
		startWith(kv...)
	}
	spans := rec.Ended()
	require.Len(t, spans, len(cases))
	require.Len(t, sampler.seen, len(cases))
	for i, kv := range cases {
		assert.ElementsMatch(t, kv, spans[i].Attributes(), "span %d", i)
		assert.ElementsMatch(t, kv, sampler.seen[i], "sampler, span %d", i)
		assert.Equal(t, trace.SpanKindClient, spans[i].SpanKind())
	}
}

// roundTripFunc is a RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// An attempt's trace headers are written into its own copy where the
// attempt is sent (RoundTripAttempt), and the outbound layer below then
// passes that request as it is; a request whose traceparent names another
// span (a proxy's inbound one, a stale one) is copied and given this
// span's headers as before, and the caller's headers stay untouched.
func TestOutboundPassesCarriedHeaders(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	tr := New(tp, nil, "")
	ctx, s := tp.Tracer("test").Start(tr.with(context.Background()), "x")
	defer s.End()
	sc := s.SpanContext()
	want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"

	var got *http.Request
	out := Outbound(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = r
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	}))
	orig := http.Header{"Accept": {"a"}, "Traceparent": {"00-" + w3cTrace + "-" + w3cSpan + "-01"}}
	before := orig.Clone()

	// Another span's traceparent: replaced in a copy.
	req := httptest.NewRequest(http.MethodGet, "http://svc/", nil).WithContext(ctx)
	req.Header = orig
	_, err := out.RoundTrip(req)
	require.NoError(t, err)
	assert.NotSame(t, req, got, "a copy")
	assert.Equal(t, want, got.Header.Get("Traceparent"))
	assert.Equal(t, sc.SpanID().String(), got.Header.Get("X-B3-Spanid"))
	assert.Equal(t, before, orig, "the caller's headers are untouched")

	// The one attempt of a route that never retries: written where it is
	// sent, passed as it is below.
	_, err = RoundTripAttempt(out, httptest.NewRequest(http.MethodGet, "http://svc/", nil).WithContext(ctx), "", 0)
	require.NoError(t, err)
	assert.Equal(t, want, got.Header.Get("Traceparent"))
	assert.Equal(t, sc.TraceID().String(), got.Header.Get("X-B3-Traceid"))
	req = got
	_, err = out.RoundTrip(req)
	require.NoError(t, err)
	assert.Same(t, req, got, "headers already carried: no copy")

	// An attempt with its own span: its copy carries that span's headers.
	_, err = RoundTripAttempt(out, httptest.NewRequest(http.MethodGet, "http://svc/", nil).WithContext(ctx), AttemptRetry, 1)
	require.NoError(t, err)
	asc := trace.SpanContextFromContext(got.Context())
	require.NotEqual(t, sc.SpanID(), asc.SpanID(), "the attempt's own span")
	assert.Equal(t, asc.SpanID().String(), got.Header.Get("X-B3-Spanid"))
	assert.Equal(t, "00-"+asc.TraceID().String()+"-"+asc.SpanID().String()+"-01", got.Header.Get("Traceparent"))
}

// The server span's status follows the semantic conventions: an error for
// a 5xx; for a gRPC call (its status in the trailers, as grpc-go writes
// it, declared or not, or in the head of a trailers-only answer) an error
// for the server's failures (UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED,
// INTERNAL, UNAVAILABLE, DATA_LOSS) and not for the client's (NOT_FOUND);
// and an error for a response its handler aborted
// (panic(http.ErrAbortHandler), as httputil.ReverseProxy does when its
// upstream breaks mid-body), with the status that went out, if any. The
// abort still reaches net/http, which breaks the response off.
func TestServerSpanStatus(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		switch r.URL.Path {
		case "/ok":
			_, _ = io.WriteString(w, "ok")
		case "/unavailable":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/grpc/internal", "/grpc/not-found":
			h.Set("Content-Type", "application/grpc")
			h.Set("Trailer", "Grpc-Status")
			_, _ = io.WriteString(w, "message")
			h.Set("Grpc-Status", map[string]string{"/grpc/internal": "13", "/grpc/not-found": "5"}[r.URL.Path])
		case "/grpc/data-loss-undeclared":
			h.Set("Content-Type", "application/grpc")
			_, _ = io.WriteString(w, "message")
			h.Set(http.TrailerPrefix+"Grpc-Status", "15")
		case "/grpc/trailers-only":
			h.Set("Content-Type", "application/grpc")
			h.Set("Grpc-Status", "14")
		case "/aborted-after-head":
			_, _ = io.WriteString(w, "partial")
			_ = http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		case "/aborted-before-head":
			panic(http.ErrAbortHandler)
		}
	})
	cases := []struct {
		path      string
		wantError bool
		// wantStatus is http.response.status_code, 0 for none;
		// wantGRPC rpc.response.status_code, "" for none.
		wantStatus int64
		wantGRPC   string
	}{
		{"/ok", false, 200, ""},
		{"/unavailable", true, 503, ""},
		{"/grpc/internal", true, 200, "INTERNAL"},
		{"/grpc/not-found", false, 200, "NOT_FOUND"},
		{"/grpc/data-loss-undeclared", true, 200, "DATA_LOSS"},
		{"/grpc/trailers-only", true, 200, "UNAVAILABLE"},
		{"/aborted-after-head", true, 200, ""},
		{"/aborted-before-head", true, 0, ""},
	}
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		defer tp.Shutdown(context.Background())
		srv := testutil.NewServer(t, New(tp, nil, "").Handler(app))
		c := &http.Client{Transport: testutil.NewTransport(t, mode), Timeout: testutil.Timeout}
		for _, tc := range cases {
			exp.Reset()
			resp, err := c.Get(srv.URL + tc.path)
			aborted := strings.HasPrefix(tc.path, "/aborted")
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			assert.Equal(t, aborted, err != nil, "%s: the response broken off: %v", tc.path, err)

			spans := exp.GetSpans()
			require.Len(t, spans, 1, "%s: the span ended before the response did", tc.path)
			s := spans[0]
			var status int64
			var grpcStatus string
			for _, kv := range s.Attributes {
				switch kv.Key {
				case "http.response.status_code":
					status = kv.Value.AsInt64()
				case "rpc.response.status_code":
					grpcStatus = kv.Value.AsString()
				}
			}
			assert.Equal(t, tc.wantStatus, status, "%s: http.response.status_code", tc.path)
			assert.Equal(t, tc.wantGRPC, grpcStatus, "%s: rpc.response.status_code", tc.path)
			want := codes.Unset
			if tc.wantError {
				want = codes.Error
			}
			assert.Equal(t, want, s.Status.Code, "%s: status %q", tc.path, s.Status.Description)
			if aborted {
				assert.Equal(t, http.ErrAbortHandler.Error(), s.Status.Description, tc.path)
			}
		}
	})
}

// WithTraceOf gives a context the trace of a request's and nothing else
// of it: the request's span is the parent of the spans under it, and
// neither the request's cancellation nor its other values reach it.
func TestWithTraceOfKeepsOnlyTheTrace(t *testing.T) {
	tr := New(sdktrace.NewTracerProvider(), nil, "")
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "request's"))
	parent, s := tr.Start(parent, "GET", trace.SpanKindClient)
	defer s.End()
	cancel()

	ctx := WithTraceOf(context.Background(), parent)
	assert.True(t, Enabled(ctx), "traced by the request's tracer")
	assert.Equal(t, s.SpanContext(), trace.SpanContextFromContext(ctx))
	assert.NoError(t, ctx.Err(), "not cancelled with the request")
	assert.Nil(t, ctx.Value(key{}))

	untraced := context.WithValue(context.Background(), key{}, "request's")
	base := context.WithValue(context.Background(), key{}, "base's")
	assert.Equal(t, base, WithTraceOf(base, untraced), "an untraced request's: the context as it is")
}
