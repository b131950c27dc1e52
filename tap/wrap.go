package tap

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/identity"
)

// Handler wraps an inbound stack: each request it serves while the hub is
// active becomes an inbound event, published when the handler returns, or
// when it panics (as it does to abort a response, with
// http.ErrAbortHandler: the event then carries the panic as its error, and
// the panic goes on). Mount it outermost, so that the event holds what the
// layers inside decided (the inbound policy's decision, the route).
func (h *Hub) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.Active() {
			next.ServeHTTP(w, r)
			return
		}
		// One allocation holds the request's slot, its recorder and its
		// event.
		t := &inbound{rec: recorder{ResponseWriter: w, start: time.Now()}}
		defer t.publish(h, w, r)
		next.ServeHTTP(&t.rec, r.WithContext(context.WithValue(r.Context(), slotKey{}, &t.s)))
	})
}

// publish publishes the event of a request whose handler returned or
// panicked, and panics on with the handler's panic.
func (t *inbound) publish(h *Hub, w http.ResponseWriter, r *http.Request) {
	p := recover()
	e := &t.e
	h.fill(e, r, "inbound", t.rec.start, &t.s)
	rw := &t.rec
	switch {
	case rw.wrote:
	case p == nil:
		rw.header(http.StatusOK)
	default:
		// No response head went out: the status stays 0.
		rw.latency = time.Since(rw.start)
	}
	e.Status = rw.status
	e.LatencyMillis = millis(rw.latency)
	e.GRPCStatus = grpcStatus(w.Header())
	if peer, ok := identity.PeerFromContext(r.Context()); ok {
		e.ClientID = peer.ID
	}
	if p != nil {
		e.Error = panicMessage(p)
	}
	h.Publish(e)
	if p != nil {
		panic(p)
	}
}

// panicMessage is the Error of an event whose handler panicked with p.
func panicMessage(p any) string {
	if err, ok := p.(error); ok {
		return err.Error()
	}
	return fmt.Sprint("panic: ", p)
}

// Transport wraps an outbound stack: each request it sends while the hub
// is active becomes an outbound event, published when the response ends:
// at the end of its body (with the grpc-status of its trailers), when the
// body fails or is closed before its end, at once for a response without
// a body, or with the error of a request that got no response. A body its
// caller never closes publishes nothing.
func (h *Hub) Transport(next http.RoundTripper) http.RoundTripper {
	return roundTripper{h: h, next: next}
}

type roundTripper struct {
	h    *Hub
	next http.RoundTripper
}

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.h.Active() {
		return t.next.RoundTrip(req)
	}
	start := time.Now()
	o := &outbound{}
	resp, err := t.next.RoundTrip(req.WithContext(context.WithValue(req.Context(), slotKey{}, &o.s)))
	e := &o.e
	t.h.fill(e, req, "outbound", start, &o.s)
	e.LatencyMillis = millis(time.Since(start))
	if err != nil {
		e.Error = err.Error()
		t.h.Publish(e)
		return resp, err
	}
	e.Status = resp.StatusCode
	e.GRPCStatus = grpcStatus(resp.Header)
	if resp.Body == nil || resp.Body == http.NoBody || resp.StatusCode == http.StatusSwitchingProtocols {
		// No body to wait for (a switched protocol's is the connection).
		t.h.Publish(e)
		return resp, nil
	}
	o.body = eventBody{ReadCloser: resp.Body, h: t.h, resp: resp, e: e}
	resp.Body = &o.body
	return resp, nil
}

// inbound and outbound are a tapped request's state in one allocation.
type inbound struct {
	rec recorder
	s   slot
	e   Event
}

type outbound struct {
	s    slot
	e    Event
	body eventBody
}

// eventBody publishes its response's event once, when the body ends: at
// EOF, with the grpc-status of the trailers (a trailers-only response has
// it in its head already); at a read error, which becomes the event's
// error; or when it is closed before either, as it is (Linkerd's tap
// reports such a stream's end without its trailers).
type eventBody struct {
	io.ReadCloser
	h    *Hub
	resp *http.Response
	e    *Event
	done atomic.Bool
}

func (b *eventBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.end(err)
	}
	return n, err
}

// Close publishes before it closes: a Read that the close interrupts fails
// with the close's error, which is no failure of the response.
func (b *eventBody) Close() error {
	b.end(nil)
	return b.ReadCloser.Close()
}

func (b *eventBody) end(err error) {
	if b.done.Swap(true) {
		return
	}
	switch {
	case err == io.EOF:
		if gs := grpcStatus(b.resp.Trailer); gs >= 0 {
			b.e.GRPCStatus = gs
		}
	case err != nil:
		b.e.Error = err.Error()
	}
	b.h.Publish(b.e)
}

// fill sets e from the request and what the layers inside noted in s.
func (h *Hub) fill(e *Event, r *http.Request, direction string, start time.Time, s *slot) {
	authority := r.Host
	if authority == "" && r.URL != nil {
		authority = r.URL.Host
	}
	*e = Event{
		Time: start, Direction: direction, Method: r.Method, Authority: authority, Path: r.URL.Path,
		Route: s.route, Retries: s.retries, Hedges: s.hedges, Decision: s.decision, GRPCStatus: -1,
		ServerID: s.server(),
	}
	for _, name := range h.headers {
		if v, ok := r.Header[name]; ok && len(v) > 0 {
			if e.Headers == nil {
				e.Headers = make(map[string]string, len(h.headers))
			}
			e.Headers[name] = v[0]
		}
	}
}

func grpcStatus(h http.Header) int {
	v := h.Get("Grpc-Status")
	if v == "" {
		v = h.Get(http.TrailerPrefix + "Grpc-Status")
	}
	if v == "" {
		return -1
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return -1
	}
	return n
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// recorder notes the status and the time of a response head. It keeps
// the writer's optional interfaces reachable: Flush and Hijack directly,
// the others through Unwrap (http.ResponseController).
type recorder struct {
	http.ResponseWriter
	start   time.Time
	status  int
	latency time.Duration
	wrote   bool
}

func (r *recorder) header(status int) {
	if !r.wrote {
		r.wrote, r.status, r.latency = true, status, time.Since(r.start)
	}
}

func (r *recorder) WriteHeader(status int) {
	if status >= 200 || status == http.StatusSwitchingProtocols {
		r.header(status)
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(p []byte) (int, error) {
	r.header(http.StatusOK)
	return r.ResponseWriter.Write(p)
}

func (r *recorder) Flush() {
	r.header(http.StatusOK)
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := r.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("tap: the response writer cannot be hijacked")
	}
	r.header(http.StatusSwitchingProtocols)
	return hj.Hijack()
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
