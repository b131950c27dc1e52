package meshgrpc

import (
	"context"
	"sync"

	"google.golang.org/grpc"
)

// firstDataKey is the context key of a stream attempt's [firstData].
type firstDataKey struct{}

// firstData links one attempt of a server-streaming call to its pick, so
// that the call leaves its endpoint's load at its first response message
// rather than at its end, as Linkerd's balancer counts a request until
// the first data frame of its response (linkerd2-proxy
// hyper-balance/src/lib.rs, PendingUntilFirstData;
// linkerd/proxy/http/src/balance.rs). It is the attempt's context: the
// picker finds it there and binds the pick's [pickDone] to it; the
// attempt's stream fires it at its first read's return.
type firstData struct {
	context.Context
	method string // the call's, so that another call on this context does not bind

	mu    sync.Mutex
	d     *pickDone // the attempt's pick in flight; nil: none, or it ended
	fired bool
}

func (f *firstData) Value(key any) any {
	if _, ok := key.(firstDataKey); ok {
		return f
	}
	return f.Context.Value(key)
}

// bind makes d the attempt's pick, unless the attempt has one in flight
// or its first data came already.
func (f *firstData) bind(d *pickDone, method string) {
	if method != f.method {
		return
	}
	f.mu.Lock()
	if f.d == nil && !f.fired {
		f.d, d.fd = d, f
	}
	f.mu.Unlock()
}

// unbind lets d go before its Done: a pick grpc-go ends (the call ended,
// or the sub-channel was not ready and it picks again) is not the one
// the first data reports.
func (f *firstData) unbind(d *pickDone) {
	f.mu.Lock()
	if f.d == d {
		f.d = nil
	}
	f.mu.Unlock()
}

// fire reports the first response message (or the stream's end, if that
// comes first) to the pick in flight, once.
func (f *firstData) fire() {
	f.mu.Lock()
	if !f.fired {
		f.fired = true
		if d := f.d; d != nil {
			d.k = d.k.FirstData()
		}
	}
	f.mu.Unlock()
}

// firstDataStream is one attempt of a server-streaming call: its first
// read's return fires the attempt's [firstData].
type firstDataStream struct {
	grpc.ClientStream
	fd    firstData
	begun bool // RecvMsg returned once; only RecvMsg reads and writes it
}

func (s *firstDataStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if !s.begun {
		s.begun = true
		s.fd.fire()
	}
	return err
}

// firstDataStreamer returns streamer whose streams count as load on their
// endpoint until their first response message: each attempt of a
// server-streaming or bidi call (one allocation per attempt). A unary or
// client-streaming call's only response message comes with its end, so
// the pick's Done is its first data, and such a call needs none.
func firstDataStreamer(streamer grpc.Streamer) grpc.Streamer {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s := &firstDataStream{}
		s.fd.Context, s.fd.method = ctx, method
		cs, err := streamer(&s.fd, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		s.ClientStream = cs
		return s, nil
	}
}
