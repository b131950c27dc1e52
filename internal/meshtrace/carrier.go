package meshtrace

import (
	"context"
	"encoding/hex"
	"net/http"
	"net/textproto"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// headerCarrier is http.Header as a propagation carrier that finds the
// propagators' own (lower-case) keys under their canonical names without
// canonicalizing them on every call, which allocates: a request's trace
// headers are read and written on every hop.
type headerCarrier http.Header

// canonical returns the canonical form of a propagator's key.
func canonical(key string) string {
	switch key {
	case "traceparent":
		return "Traceparent"
	case "tracestate":
		return "Tracestate"
	case "baggage":
		return "Baggage"
	case "b3":
		return "B3"
	case "x-b3-traceid":
		return "X-B3-Traceid"
	case "x-b3-spanid":
		return "X-B3-Spanid"
	case "x-b3-sampled":
		return "X-B3-Sampled"
	case "x-b3-parentspanid":
		return "X-B3-Parentspanid"
	case "x-b3-flags":
		return "X-B3-Flags"
	}
	return textproto.CanonicalMIMEHeaderKey(key)
}

func (c headerCarrier) Get(key string) string {
	if v := c[canonical(key)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c headerCarrier) Set(key, value string) { c[canonical(key)] = []string{value} }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// traceparentLen is the length of a version 00 traceparent.
const traceparentLen = 55

// encodeTraceparent writes sc as a version 00 traceparent into buf.
func encodeTraceparent(buf *[traceparentLen]byte, sc trace.SpanContext) {
	copy(buf[:], "00-")
	tid, sid := sc.TraceID(), sc.SpanID()
	hex.Encode(buf[3:35], tid[:])
	buf[35] = '-'
	hex.Encode(buf[36:52], sid[:])
	buf[52] = '-'
	flags := [1]byte{byte(sc.TraceFlags())}
	hex.Encode(buf[53:55], flags[:])
}

// traceValues is the number of values writeTraceHeaders writes.
const traceValues = 4

// writeTraceHeaders writes sc into h as the default propagator would (W3C
// traceparent and tracestate, B3's multi-header form), with vals (at least
// traceValues long) as the values' backing array: in one allocation, the
// traceparent string, whose parts are the B3 values.
func writeTraceHeaders(h http.Header, sc trace.SpanContext, vals []string) {
	var buf [traceparentLen]byte
	encodeTraceparent(&buf, sc)
	tp := string(buf[:])
	sampled := "0"
	if sc.IsSampled() {
		sampled = "1"
	}
	v := vals[:traceValues:traceValues]
	v[0], v[1], v[2], v[3] = tp, tp[3:35], tp[36:52], sampled
	h["Traceparent"] = v[0:1:1]
	h["X-B3-Traceid"] = v[1:2:2]
	h["X-B3-Spanid"] = v[2:3:3]
	h["X-B3-Sampled"] = v[3:4:4]
	if ts := sc.TraceState(); ts.Len() > 0 {
		h["Tracestate"] = []string{ts.String()}
	}
}

// extract returns ctx with the trace context of h, if any. With the
// default propagator it reads only what is there: nothing when h carries
// no trace header (the propagators' Extract allocates even then), and W3C
// alone when h carries a valid traceparent, which wins over B3 anyway.
// Another propagator reads h as it will.
func (t *Tracer) extract(ctx context.Context, h http.Header) context.Context {
	if !t.defaultProp {
		return t.prop.Extract(ctx, headerCarrier(h))
	}
	_, w3c := h["Traceparent"]
	_, bag := h["Baggage"]
	if !w3c && !bag && !hasB3(h) {
		return ctx
	}
	if w3c {
		if c := (propagation.TraceContext{}).Extract(ctx, headerCarrier(h)); c != ctx {
			if bag {
				c = propagation.Baggage{}.Extract(c, headerCarrier(h))
			}
			return c
		}
	}
	return t.prop.Extract(ctx, headerCarrier(h))
}

// hasB3 reports whether h carries a B3 trace context, in either form.
func hasB3(h http.Header) bool {
	if _, ok := h["B3"]; ok {
		return true
	}
	_, ok := h["X-B3-Traceid"]
	return ok
}
