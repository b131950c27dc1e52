// Package rw observes an http.ResponseWriter: the status code, the bytes
// written and the header map at the time the head went out, without hiding
// any optional interface of the writer (Flusher, Hijacker, ReaderFrom,
// Pusher) and with Unwrap for http.ResponseController, and with WriteString,
// which writes through the writer's own when it has one (net/http's do), so
// that a handler's io.WriteString copies nothing. Wrapping allocates
// nothing: states are pooled and each wrapper type is a single pointer.
package rw

//go:generate go run gen.go

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
)

// State is what a wrapped writer has seen. It is owned by the handler that
// called [Wrap] and must not be used after [State.Release].
type State struct {
	w http.ResponseWriter
	// Status is the first non-1xx status written (200 when the handler
	// wrote a body or flushed first); 0 while none was written.
	Status int
	// Written counts body bytes.
	Written int64
	// Hijacked is set when the connection was taken over.
	Hijacked bool
	// GRPCStatusInHead is set when grpc-status was among the headers
	// sent with the status (a trailers-only gRPC response).
	GRPCStatusInHead bool
	// OnHead, when set, is called once with the header map just before
	// the head goes out: at the first non-1xx WriteHeader, or the first
	// Write, ReadFrom or Flush. It may edit the map.
	OnHead func(http.Header)
	// Ctx, when set, is the request's context: the head notes whether it
	// was done already when the head went out (DoneAtHead).
	Ctx context.Context
	// DoneAtHead is set when Ctx was done as the head went out: the
	// head of a request whose client had gone, or given up.
	DoneAtHead bool
}

var pool = sync.Pool{New: func() any { return new(State) }}

// Wrap returns a writer that records into a pooled State and forwards to w.
func Wrap(w http.ResponseWriter) (http.ResponseWriter, *State) {
	s := pool.Get().(*State)
	*s = State{w: w}
	return wrap(s), s
}

// Release returns s to the pool. The wrapper must no longer be used.
func (s *State) Release() {
	*s = State{}
	pool.Put(s)
}

// Header returns the header map of the underlying writer; after the
// handler returned, it holds the trailers that were set.
func (s *State) Header() http.Header { return s.w.Header() }

// WrittenHead reports the status the handler wrote (0: none), whether it
// hijacked the connection, and its header when that carries a grpc-status
// (nil otherwise). It satisfies classify.Written.
func (s *State) WrittenHead() (status int, hijacked bool, grpcHead http.Header) {
	if s.GRPCStatusInHead {
		grpcHead = s.w.Header()
	}
	return s.Status, s.Hijacked, grpcHead
}

// Unanswered reports whether no head went out before Ctx was done: none
// was written, or one was written after. A hijacked connection is
// answered.
func (s *State) Unanswered() bool { return !s.Hijacked && (s.Status == 0 || s.DoneAtHead) }

func (s *State) writeHeader(code int) {
	if s.Status == 0 && code >= 200 {
		s.Status = code
		s.DoneAtHead = s.Ctx != nil && s.Ctx.Err() != nil
		if s.OnHead != nil {
			s.OnHead(s.w.Header())
		}
		_, s.GRPCStatusInHead = s.w.Header()["Grpc-Status"]
	}
	s.w.WriteHeader(code)
}

func (s *State) implicitHeader() {
	if s.Status == 0 {
		s.Status = http.StatusOK
		s.DoneAtHead = s.Ctx != nil && s.Ctx.Err() != nil
		if s.OnHead != nil {
			s.OnHead(s.w.Header())
		}
		_, s.GRPCStatusInHead = s.w.Header()["Grpc-Status"]
	}
}

func (s *State) write(p []byte) (int, error) {
	s.implicitHeader()
	n, err := s.w.Write(p)
	s.Written += int64(n)
	return n, err
}

// writeString writes str without a copy into a byte slice when the writer
// below is an io.StringWriter (net/http's are): a handler's io.WriteString
// through a wrapper without WriteString allocates that copy.
func (s *State) writeString(str string) (int, error) {
	s.implicitHeader()
	n, err := io.WriteString(s.w, str)
	s.Written += int64(n)
	return n, err
}

func (s *State) flush() {
	s.implicitHeader()
	s.w.(http.Flusher).Flush()
}

func (s *State) hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, b, err := s.w.(http.Hijacker).Hijack()
	if err == nil {
		s.Hijacked = true
	}
	return c, b, err
}

func (s *State) readFrom(r io.Reader) (int64, error) {
	s.implicitHeader()
	n, err := s.w.(io.ReaderFrom).ReadFrom(r)
	s.Written += n
	return n, err
}

func (s *State) push(target string, opts *http.PushOptions) error {
	return s.w.(http.Pusher).Push(target, opts)
}

// Trailer returns the value of trailer name as set by the handler: a
// declared trailer (set in the header map after the head) or one set with
// [http.TrailerPrefix]. Call it after the handler returned.
func (s *State) Trailer(name string) (string, bool) {
	h := s.w.Header()
	if len(h) == 0 {
		return "", false
	}
	if v, ok := h[http.TrailerPrefix+name]; ok && len(v) > 0 {
		return v[0], true
	}
	if v, ok := h[name]; ok && len(v) > 0 {
		return v[0], true
	}
	return "", false
}
