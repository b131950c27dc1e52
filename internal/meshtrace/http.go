package meshtrace

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/rw"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Handler returns next with a server span around each request: the
// request's trace context (W3C or B3 headers) is its parent, and the
// context the layers below see carries it. With a nil t it returns next.
func (t *Tracer) Handler(next http.Handler) http.Handler {
	if t == nil {
		return next
	}
	return &serverHandler{t: t, next: next}
}

type serverHandler struct {
	t    *Tracer
	next http.Handler
}

func (h *serverHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t := h.t
	ctx := t.with(t.extract(r.Context(), r.Header))
	sb := requestAttrs(r, true)
	if t.server != "" {
		sb.attrs = append(sb.attrs, AttrServerIdentity.String(t.server))
	}
	if p, ok := identity.PeerFromContext(r.Context()); ok && p.ID != "" {
		sb.attrs = append(sb.attrs, AttrClientIdentity.String(p.ID))
	}
	ctx, s := t.start(ctx, r.Method, serverKind, sb)
	if !s.IsRecording() {
		defer s.End()
		h.next.ServeHTTP(w, r.WithContext(ctx))
		return
	}
	ww, st := rw.Wrap(w)
	defer endServer(s, st, w)
	h.next.ServeHTTP(ww, r.WithContext(ctx))
}

// endServer ends the server span s of a request whose handler returned or
// panicked: with the response's status (none when the handler panicked
// before the head), its gRPC status, and the panic as the span's error
// (http.ErrAbortHandler, as httputil.ReverseProxy aborts a response whose
// upstream broke), and panics on with the handler's panic.
func endServer(s trace.Span, st *rw.State, w http.ResponseWriter) {
	p := recover()
	code := st.Status
	switch {
	case code == 0 && st.Hijacked:
		code = http.StatusSwitchingProtocols
	case code == 0 && p == nil:
		code = http.StatusOK
	}
	st.Release()
	if code != 0 {
		s.SetAttributes(statusAttr(code)...)
	}
	hdr := w.Header()
	if msg := hdr.Get(proxyErrorHeader); msg != "" {
		s.SetAttributes(AttrProxyError.String(msg))
	}
	gs := hdr.Get("Grpc-Status")
	if gs == "" {
		gs = hdr.Get(http.TrailerPrefix + "Grpc-Status")
	}
	if gs != "" {
		s.SetAttributes(semconv.RPCResponseStatusCode(grpcCodeName(gs)))
		if grpcServerError(gs) {
			failedStatus(s, "grpc-status "+gs)
		}
	}
	statusOf(s, code, true)
	if p != nil {
		err, ok := p.(error)
		if !ok {
			err = fmt.Errorf("panic: %v", p)
		}
		failed(s, err)
	}
	s.End()
	if p != nil {
		panic(p)
	}
}

// Transport returns next with a client span around each request: the
// logical request, whose attempts (retries, hedges, mirrors) are its
// children when a route runs them ([RoundTripAttempt]). Its parent is the
// span of the request's context or, when there is none, the trace context
// of the request's headers. The span ends with the response body. With a
// nil t it returns next.
func (t *Tracer) Transport(next http.RoundTripper) http.RoundTripper {
	if t == nil {
		return next
	}
	return &clientTransport{t: t, next: next}
}

type clientTransport struct {
	t    *Tracer
	next http.RoundTripper
}

func (c *clientTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !trace.SpanContextFromContext(req.Context()).IsValid() {
		// No span in the context: the trace context the request's headers
		// carry, if any, is the parent (a proxy forwarding its client's
		// request).
		ctx := c.t.extract(req.Context(), req.Header)
		if ctx != req.Context() && trace.SpanContextFromContext(ctx).IsValid() {
			req = req.WithContext(ctx)
		}
	}
	return c.t.roundTrip(c.next, req, "", 0)
}

// roundTrip sends req through next under a new client span; kind is the
// attempt's kind, empty for the logical request, and n its resend count.
func (t *Tracer) roundTrip(next http.RoundTripper, req *http.Request, kind AttemptKind, n int) (*http.Response, error) {
	ctx := t.with(req.Context())
	sb := requestAttrs(req, false)
	if kind != "" {
		sb.attrs = append(sb.attrs, AttrAttemptKind.String(string(kind)))
	}
	if n > 0 {
		sb.attrs = append(sb.attrs, semconv.HTTPRequestResendCount(n))
	}
	ctx, s := t.start(ctx, req.Method, clientKind, sb)
	out := req.WithContext(ctx)
	if kind != "" {
		// An attempt's span is the last before the wire: its copy
		// carries the span's trace headers.
		t.carryHeaders(out)
	}
	resp, err := next.RoundTrip(out)
	if err != nil {
		failed(s, err)
		s.End()
		return nil, err
	}
	if !s.IsRecording() {
		s.End()
		return resp, nil
	}
	responseAttrs(s, resp, false)
	if resp.Body == nil || resp.Body == http.NoBody || resp.StatusCode == http.StatusSwitchingProtocols {
		s.End()
		return resp, nil
	}
	resp.Body = &spanBody{ReadCloser: resp.Body, s: s, resp: resp}
	return resp, nil
}

// RoundTripAttempt sends one attempt of a logical request through base:
// under a child span of the request's when the request is traced, whose
// attribute inmesh.attempt.kind is kind and http.request.resend_count n
// (the attempt's ordinal, 0 for the first). The router's exchange calls it
// for each attempt of a request it may retry (an empty kind: the request's
// one attempt, which is the request's own span); hedges and mirrors call it
// with their kinds. req is the caller's own copy for this attempt (its
// Header field, not the map, may be replaced): the attempt's trace headers
// are written into a copy of its header map here, so that [Outbound] need
// not copy the request again.
func RoundTripAttempt(base http.RoundTripper, req *http.Request, kind AttemptKind, n int) (*http.Response, error) {
	t := fromContext(req.Context())
	if t == nil {
		return base.RoundTrip(req)
	}
	if kind == "" {
		t.carryHeaders(req)
		return base.RoundTrip(req)
	}
	return t.roundTrip(base, req, kind, n)
}

// spanBody ends its span when the body ends: at EOF, at an error, or when
// it is closed.
type spanBody struct {
	io.ReadCloser
	s    trace.Span
	resp *http.Response
	once sync.Once
}

func (b *spanBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.end(err)
	}
	return n, err
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.end(nil)
	return err
}

func (b *spanBody) end(err error) {
	b.once.Do(func() {
		switch {
		case err != nil && err != io.EOF:
			failed(b.s, err)
		case err == io.EOF:
			if gs := b.resp.Trailer.Get("Grpc-Status"); gs != "" {
				b.s.SetAttributes(semconv.RPCResponseStatusCode(grpcCodeName(gs)))
				if gs != "0" {
					failedStatus(b.s, "grpc-status "+gs)
				}
			}
		}
		b.s.End()
	})
}

// Outbound returns next as the layer under the balancer: it writes the
// trace context of each traced request's span into a copy of its headers
// (W3C and B3), replacing the trace headers it came with, so that the
// next hop's spans are children of this attempt's.
func Outbound(next http.RoundTripper) http.RoundTripper { return &outbound{next: next} }

type outbound struct{ next http.RoundTripper }

// traceHeaders are the headers the propagators write, removed from a
// request before its own are written: a stale single-header b3 would
// otherwise win over the multi-header form at the next hop.
var traceHeaders = []string{"Traceparent", "Tracestate", "B3", "X-B3-Traceid", "X-B3-Spanid",
	"X-B3-Parentspanid", "X-B3-Sampled", "X-B3-Flags"}

func (o *outbound) RoundTrip(req *http.Request) (*http.Response, error) {
	t := fromContext(req.Context())
	if t == nil || t.carries(req) {
		return o.next.RoundTrip(req)
	}
	return o.next.RoundTrip(t.inject(req))
}

// inject returns a copy of req carrying its context's trace headers.
func (t *Tracer) inject(req *http.Request) *http.Request {
	out := req.WithContext(req.Context())
	if !t.defaultProp {
		out.Header, _ = cloneHeader(req.Header, 0)
		t.prop.Inject(req.Context(), headerCarrier(out.Header))
		return out
	}
	out.Header = tracedHeader(req.Context(), req.Header)
	return out
}

// carryHeaders replaces the header map of req, which its caller owns, by a
// copy carrying the trace headers of its context, when the propagator is
// the default one (whose headers [Tracer.carries] recognizes); another
// propagator's are written by [Outbound].
func (t *Tracer) carryHeaders(req *http.Request) {
	if t.defaultProp {
		req.Header = tracedHeader(req.Context(), req.Header)
	}
}

// tracedHeader returns a copy of h without its trace headers and with
// those of ctx, as the default propagator writes them.
func tracedHeader(ctx context.Context, h http.Header) http.Header {
	sc := trace.SpanContextFromContext(ctx)
	spare := 0
	if sc.IsValid() {
		spare = traceValues
	}
	out, vals := cloneHeader(h, spare)
	if sc.IsValid() {
		writeTraceHeaders(out, sc, vals)
	}
	if baggage.FromContext(ctx).Len() > 0 {
		propagation.Baggage{}.Inject(ctx, headerCarrier(out))
	}
	return out
}

// carries reports whether req's headers were written for the span of its
// context already ([Tracer.carryHeaders]): its traceparent names that
// span, whose ID no other writer of the request's headers can know.
func (t *Tracer) carries(req *http.Request) bool {
	if !t.defaultProp {
		return false
	}
	v := req.Header["Traceparent"]
	if len(v) != 1 || len(v[0]) != traceparentLen {
		return false
	}
	sc := trace.SpanContextFromContext(req.Context())
	if !sc.IsValid() {
		return false
	}
	var buf [traceparentLen]byte
	encodeTraceparent(&buf, sc)
	return string(buf[:]) == v[0]
}

// cloneHeader copies h without its trace headers, with room for the ones
// inject writes (a map that grows is one more allocation). The values
// share one backing array, as http.Header.Clone's do, with spare more
// slots at its end, returned for the trace headers' values.
func cloneHeader(h http.Header, spare int) (http.Header, []string) {
	nv := 0
	for _, vv := range h {
		nv += len(vv)
	}
	sv := make([]string, nv+spare)
	out := make(http.Header, len(h)+len(traceHeaders))
	for k, vv := range h {
		if isTraceHeader(k) {
			continue
		}
		if vv == nil {
			out[k] = nil
			continue
		}
		n := copy(sv, vv)
		out[k] = sv[:n:n]
		sv = sv[n:]
	}
	return out, sv[len(sv)-spare:]
}

func isTraceHeader(k string) bool {
	for _, h := range traceHeaders {
		if k == h {
			return true
		}
	}
	return false
}

// Inject writes the trace context of ctx into h when ctx is traced, for
// transports that build their own headers (gRPC metadata).
func Inject(ctx context.Context, carrier propagation.TextMapCarrier) {
	if t := fromContext(ctx); t != nil {
		t.prop.Inject(ctx, carrier)
	}
}
