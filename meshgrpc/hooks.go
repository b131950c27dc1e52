package meshgrpc

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// callHooks are the CallOptions by which a caller asks grpc-go for what
// its call ended with: the response header, trailer and peer (grpc.Header,
// grpc.Trailer and grpc.Peer, or their option structs, values or
// pointers), written as the call ends, and the grpc.OnFinish callbacks,
// called as it ends. grpc-go runs them once a call: its own retries run
// them for the committed attempt only (clientStream.finish in stream.go),
// and it writes the header, trailer and peer only for an attempt that
// opened a transport stream. A call the mesh makes as several attempts (a
// route's retries, a hedge) must not hand them to each attempt: every
// attempt would write the caller's variables and call its callbacks, and
// a hedge that lost would do so on a goroutine of its own, after the call
// returned. So the mesh takes them out of the call's options
// ([takeHooks]), gives each attempt destinations of its own
// ([callHooks.attempt]), and hands the caller those of the attempt whose
// answer is the call's, once ([callHooks.end]).
type callHooks struct {
	header, trailer []*metadata.MD
	peer            []*peer.Peer
	onFinish        []func(error)
}

// takeHooks returns opts without the caller's hooks, and the hooks; opts
// itself, and nil, when it has none. An option grpc-go would fail on (a
// nil destination or callback) is left in opts, to fail as it would.
// grpc-go calls an OnFinishCallOption only as a value: a pointer to one is
// left too, as grpc-go ignores it.
func takeHooks(opts []grpc.CallOption) ([]grpc.CallOption, *callHooks) {
	var h *callHooks
	var rest []grpc.CallOption
	for i, o := range opts {
		var (
			md    *metadata.MD
			isHdr bool
			p     *peer.Peer
			fin   func(error)
		)
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			md, isHdr = o.HeaderAddr, true
		case *grpc.HeaderCallOption:
			if o != nil {
				md, isHdr = o.HeaderAddr, true
			}
		case grpc.TrailerCallOption:
			md = o.TrailerAddr
		case *grpc.TrailerCallOption:
			if o != nil {
				md = o.TrailerAddr
			}
		case grpc.PeerCallOption:
			p = o.PeerAddr
		case *grpc.PeerCallOption:
			if o != nil {
				p = o.PeerAddr
			}
		case grpc.OnFinishCallOption:
			fin = o.OnFinish
		}
		if md == nil && p == nil && fin == nil {
			if h != nil {
				rest = append(rest, o)
			}
			continue
		}
		if h == nil {
			h = &callHooks{}
			rest = make([]grpc.CallOption, i, len(opts))
			copy(rest, opts[:i])
		}
		switch {
		case md != nil && isHdr:
			h.header = append(h.header, md)
		case md != nil:
			h.trailer = append(h.trailer, md)
		case p != nil:
			h.peer = append(h.peer, p)
		default:
			h.onFinish = append(h.onFinish, fin)
		}
	}
	if h == nil {
		return opts, nil
	}
	return rest, h
}

// attemptHooks are one attempt's own header, trailer and peer.
type attemptHooks struct {
	header, trailer metadata.MD
	peer            peer.Peer
}

// opened reports whether grpc-go wrote a's hooks: it does for an attempt
// that opened a transport stream, whose context always carries the peer
// (http2Client.NewStream), and for no other.
func (a *attemptHooks) opened() bool { return a.peer.Addr != nil }

// meta reports whether the caller asked for the header, trailer or peer:
// its attempts need destinations of their own.
func (h *callHooks) meta() bool {
	return h != nil && len(h.header)+len(h.trailer)+len(h.peer) > 0
}

// attempt returns opts with the hooks of one attempt, writing a: its
// header and trailer when the caller asked for them, and its peer always
// (it tells whether the hooks ran).
func (h *callHooks) attempt(opts []grpc.CallOption, a *attemptHooks) []grpc.CallOption {
	out := make([]grpc.CallOption, len(opts), len(opts)+3)
	copy(out, opts)
	if len(h.header) > 0 {
		out = append(out, grpc.Header(&a.header))
	}
	if len(h.trailer) > 0 {
		out = append(out, grpc.Trailer(&a.trailer))
	}
	return append(out, grpc.Peer(&a.peer))
}

// end hands the caller what the call ended with: the header, trailer and
// peer of a, the attempt whose answer is the call's (nil: none was made),
// when it opened a stream, and err to the OnFinish callbacks. It is
// called once, on the goroutine that returns the call.
func (h *callHooks) end(a *attemptHooks, err error) {
	if h == nil {
		return
	}
	if a != nil && a.opened() {
		h.set(a.header, a.trailer, &a.peer)
	}
	for _, f := range h.onFinish {
		f(err)
	}
}

// endStream is end for a stream: the header, trailer and peer are those
// of cs, the attempt the stream ended on (nil: none opened), read as
// grpc-go's hooks read them from the stream that ended.
func (h *callHooks) endStream(cs grpc.ClientStream, err error) {
	if h == nil {
		return
	}
	if cs != nil && h.meta() {
		// Header waits for the stream to be committed to an attempt (a
		// hedge's), which a stream that ended is, or soon is.
		header, _ := cs.Header()
		p, _ := peer.FromContext(cs.Context())
		h.set(header, cs.Trailer(), p)
	}
	h.end(nil, err)
}

// set writes the caller's destinations, the peer's only when p is known
// (as grpc-go's hook); a second destination of the same kind gets a copy,
// as grpc-go gives each hook a copy of its own.
func (h *callHooks) set(header, trailer metadata.MD, p *peer.Peer) {
	for i, dst := range h.header {
		*dst = copyMD(header, i > 0)
	}
	for i, dst := range h.trailer {
		*dst = copyMD(trailer, i > 0)
	}
	if p == nil {
		return
	}
	for _, dst := range h.peer {
		*dst = *p
	}
}

func copyMD(md metadata.MD, clone bool) metadata.MD {
	if !clone || md == nil {
		return md
	}
	return md.Copy()
}
