package meshgrpc

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/proxyerr"
)

// ServerOptions returns the options that bring a grpc-go server into the
// mesh, for grpc.NewServer:
//
//   - with [WithIdentity], transport credentials that serve meshed mTLS
//     and plaintext on one port, as the HTTP stack's listener does: a
//     client that opens with TLS must name the local identity as SNI, and
//     its certificate is verified when it shows one ([InboundAuthInfo]);
//   - with [WithIdentity] or [WithInboundPolicy], a stats handler that
//     puts a meshed client's verified identity in the context of its
//     calls, where identity.PeerFromContext finds it as in the HTTP stack
//     (a plaintext client has none), and reads each connection's
//     addresses for the policy once; without either, no stats handler
//     (grpc-go then makes no per-call stats events);
//   - unary and stream interceptors that give every call's handler (and
//     the policy) l5d-client-id as Linkerd's proxy gives it: every
//     l5d-client-id the client sent removed, and set to the client's
//     identity only when it proved one over mesh TLS, so that no client,
//     plaintext or meshed, can claim an identity in metadata; with
//     [WithInboundPolicy], they enforce the port's policy on every call
//     exactly as authz.Handler enforces it on HTTP requests (the call's
//     method is the request path, POST, its :authority the host, its
//     metadata the headers): no route
//     is NOT_FOUND, no authorization PERMISSION_DENIED, a rate limit
//     RESOURCE_EXHAUSTED, a full in-flight limit UNAVAILABLE, with
//     Linkerd's message to meshed clients only and the refusal counted in
//     the inbound_http_authz_* families; then count the calls let through
//     in Linkerd's inbound request_total, response_total (with
//     classification and grpc_status) and response_latency_ms, with
//     direction="inbound", the authority, the tls labels and the address
//     the connection was accepted on (target_*); the response when the
//     call ends, or without the stats handler when its handler returns,
//     with the status the handler returned.
//
// Give these options before the server's own interceptors
// (grpc.ChainUnaryInterceptor appends), so that the policy runs before
// them; an interceptor set with grpc.UnaryInterceptor or
// grpc.StreamInterceptor always runs before the chained ones, so before
// the policy, whatever the order, and sees the metadata as the client sent
// it (l5d-client-id included). A call to a method the server does not
// register is answered UNIMPLEMENTED by grpc-go before any interceptor
// runs: it is neither authorized nor counted. The policy's watches last as long as its
// authz.Source (for a destination.Client, until the client is closed).
// ServerOptions panics when the default Server of [WithInboundPolicy]
// (authz.WithDefault) does not compile.
func ServerOptions(opts ...Option) []grpc.ServerOption {
	c := newConfig(opts)
	s := newServer(c)
	out := make([]grpc.ServerOption, 0, 4)
	if s.meshTLS {
		out = append(out, grpc.Creds(s.creds))
	}
	if s.stats {
		out = append(out, grpc.StatsHandler(s))
	}
	out = append(out, serverTraceOptions(c)...)
	return append(out, grpc.ChainUnaryInterceptor(s.unary), grpc.ChainStreamInterceptor(s.stream))
}

// server is the mesh side of one grpc-go server: its stats handler and
// interceptors.
type server struct {
	meshTLS bool
	creds   *serverCreds
	policy  *authz.Handler // nil without an inbound policy
	rec     *classify.Recorder
	tls     *classify.TLSLabels
	// stats: the server's stats handler is installed, as the identity
	// and the policy need (what they read of a connection, once per
	// connection); it counts each call's response at its end. Without
	// it (neither configured: every client is plaintext, the connection
	// tells nothing) the interceptors count the response when the
	// handler returns, and grpc-go makes none of the per-call stats
	// events, which cost some twenty allocations per call.
	stats bool
}

func newServer(c *config) *server {
	s := &server{
		meshTLS: c.identity != nil,
		rec:     classify.NewInboundRecorder(classify.WithMeterProvider(c.mp)),
		tls:     classify.NewTLSLabels(c.identity != nil),
	}
	if s.meshTLS {
		s.creds = newServerCreds(c.identity)
	}
	s.stats = s.meshTLS || c.inbound != nil
	if c.inbound != nil {
		opts := append([]authz.Option{authz.WithMeterProvider(c.mp), authz.WithLogger(c.logger)}, c.inbound...)
		h, err := authz.New(nil, opts...)
		if err != nil {
			panic("meshgrpc: ServerOptions: WithInboundPolicy: " + err.Error())
		}
		s.policy = h
	}
	return s
}

// conn is what the server knows of a connection, once per connection.
type conn struct {
	authz authz.Conn
}

type connKey struct{}

// serverCall is the state of one served call, from TagRPC to End. It is
// the call's context too (one allocation where context.WithValue and the
// state would make two): its Value answers callKey with itself.
type serverCall struct {
	context.Context
	ex classify.Exchange
}

func (c *serverCall) Value(key any) any {
	if _, ok := key.(callKey); ok {
		return c
	}
	return c.Context.Value(key)
}

type callKey struct{}

var _ stats.Handler = (*server)(nil)

// TagConn records the connection's addresses and client, and puts a
// meshed client's verified identity and the tls labels of its calls in
// the context their contexts derive from.
func (s *server) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	c := &conn{authz: authz.Conn{
		Local:   addrPort(info.LocalAddr),
		Remote:  addrPort(info.RemoteAddr),
		HasPeer: s.meshTLS,
	}}
	if s.policy != nil {
		// The port's policy is on its way while the client's first call
		// is: the call waits for it (authz.WithPolicyWait).
		s.policy.WatchPorts(c.authz.Local.Port())
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ai, ok := p.AuthInfo.(InboundAuthInfo); ok && ai.Peer.TLS {
			c.authz.Peer = ai.Peer
			ctx = identity.WithPeer(ctx, ai.Peer)
		}
	}
	ctx = classify.WithLabels(ctx, s.tls.ForTarget(c.authz.Peer.TLS, c.authz.Peer.ID, c.authz.Local))
	return context.WithValue(ctx, connKey{}, c)
}

func (s *server) HandleConn(context.Context, stats.ConnStats) {}

// TagRPC gives the call its state.
func (s *server) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return &serverCall{Context: ctx}
}

// HandleRPC counts the response of a call the interceptors let through,
// once it has ended.
func (s *server) HandleRPC(ctx context.Context, st stats.RPCStats) {
	end, ok := st.(*stats.End)
	if !ok {
		return
	}
	if c, _ := ctx.Value(callKey{}).(*serverCall); c != nil {
		c.ex.EndGRPC(ctx, int32(status.Code(end.Error)))
	}
}

func (s *server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, d, ex, err := s.admit(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	defer d.Done()
	resp, err := handler(ctx, req)
	ex.EndGRPC(ctx, int32(status.Code(err)))
	return resp, err
}

func (s *server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	orig := ss.Context()
	ctx, d, ex, err := s.admit(orig, info.FullMethod)
	if err != nil {
		return err
	}
	defer d.Done()
	if ctx != orig {
		ss = &ctxStream{ServerStream: ss, ctx: ctx}
	}
	err = handler(srv, ss)
	ex.EndGRPC(ctx, int32(status.Code(err)))
	return err
}

// ctxStream is a stream whose context carries metadata a route's filter
// changed.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// admit enforces the port's policy on the call to method and, when it
// passes, counts its request. The caller must call Done on the decision
// once the call has ended, and count the response on the exchange (the
// zero Exchange, which records nothing, when the stats handler counts
// it).
func (s *server) admit(ctx context.Context, method string) (context.Context, authz.Decision, classify.Exchange, error) {
	var d authz.Decision
	var authority string
	var c *conn
	if s.stats {
		if c, _ = ctx.Value(connKey{}).(*conn); c == nil {
			c = s.connOf(ctx)
		}
	}
	if s.policy == nil {
		// Only the authority: reading the whole metadata would copy it.
		if v := metadata.ValueFromIncomingContext(ctx, ":authority"); len(v) > 0 {
			authority = v[0]
		}
		if id := c.clientID(); id != "" || metadata.ValueFromIncomingContext(ctx, clientIDKey) != nil {
			md, _ := metadata.FromIncomingContext(ctx)
			ctx = withClientID(ctx, md, id)
		}
	} else {
		md, _ := metadata.FromIncomingContext(ctx)
		authority = first(md, ":authority")
		// The policy sees the identity header as the handler will:
		// verified or absent.
		if _, sent := md[clientIDKey]; sent || c.clientID() != "" {
			ctx = withClientID(ctx, md, c.clientID())
		}
		// A call to a port whose first policy is pending waits for it
		// under its own context (Decide would wait under none).
		if err := s.policy.WaitPolicy(ctx, c.authz.Local); err != nil {
			if errors.Is(err, authz.ErrClosed) {
				return ctx, d, classify.Exchange{}, status.Error(codes.Unavailable, "inbound policy not yet known")
			}
			return ctx, d, classify.Exchange{}, status.FromContextError(err).Err()
		}
		v := getRequest(method, authority, md)
		d = s.policy.Decide(&v.r, c.authz)
		var err error
		if d.Status == 0 {
			ctx, err = s.filter(ctx, &d, v, md)
		}
		putRequest(v)
		if err != nil {
			return ctx, d, classify.Exchange{}, err
		}
		if d.Status != 0 || !s.policy.Admit(&d) {
			return ctx, d, classify.Exchange{}, status.Error(codes.Code(proxyerr.GRPCCode(d.Status)), d.Message())
		}
		// The call's metrics carry its Server, route and authorization,
		// as the HTTP stack's do.
		ctx = classify.WithLabels(ctx, d.Labels())
	}
	if !s.stats {
		// Neither identity nor policy: the connection's tls labels are
		// the plaintext ones, with the address it was accepted on.
		var local netip.AddrPort
		if p, ok := peer.FromContext(ctx); ok {
			local = addrPort(p.LocalAddr)
		}
		return ctx, d, s.rec.Start(ctx, authority, s.tls.ForTarget(false, "", local)), nil
	}
	if c, _ := ctx.Value(callKey{}).(*serverCall); c != nil {
		c.ex = s.rec.Start(ctx, authority, nil)
	}
	return ctx, d, classify.Exchange{}, nil
}

// filter applies the filters of the route d selected to the call: request
// header modifiers change the metadata the handler sees; a gRPC failure
// injector fails the call with its status; an HTTP failure injector or a
// redirect refuses it (a redirect is NOT_FOUND to gRPC, as Linkerd's
// proxy answers it).
func (s *server) filter(ctx context.Context, d *authz.Decision, v *request, md metadata.MD) (context.Context, error) {
	changed := false
	for i := range d.Route.Filters {
		f := &d.Route.Filters[i]
		switch {
		case f.RequestHeaders != nil:
			if !changed {
				// The header's values are the metadata's: edit a copy.
				v.r.Header = v.r.Header.Clone()
				changed = true
			}
			f.RequestHeaders.Apply(v.r.Header)
		case f.Redirect != nil:
			loc, same, err := f.Redirect.Location(&v.r, d.Match)
			if err != nil {
				d.Refuse(http.StatusInternalServerError, err.Error())
				return ctx, nil
			}
			if !same {
				d.Refuse(f.Redirect.StatusCode(), "redirected to "+loc)
				return ctx, nil
			}
		case f.GRPCFailureInjector != nil:
			fi := f.GRPCFailureInjector
			if prob := fi.Ratio.Probability(); prob >= 1 || rand.Float64() < prob {
				return ctx, status.Error(fi.Code, fi.Message)
			}
		case f.FailureInjector != nil:
			fi := f.FailureInjector
			if prob := fi.Ratio.Probability(); prob >= 1 || rand.Float64() < prob {
				d.Refuse(fi.Status, fi.Message)
				return ctx, nil
			}
		}
	}
	if !changed {
		return ctx, nil
	}
	out := make(metadata.MD, len(v.r.Header)+1)
	for k, vals := range md {
		if strings.HasPrefix(k, ":") {
			out[k] = vals
		}
	}
	for k, vals := range v.r.Header {
		out[strings.ToLower(k)] = vals
	}
	return metadata.NewIncomingContext(ctx, out), nil
}

// clientIDKey is the metadata key in which the server gives the handler
// its client's verified identity, as the HTTP stack gives it in
// origproto.ClientIDHeader.
const clientIDKey = "l5d-client-id"

// clientID is the identity the connection's client proved over mesh TLS,
// empty for plaintext, TLS without a certificate, or no connection.
func (c *conn) clientID() string {
	if c == nil || !c.authz.Peer.TLS {
		return ""
	}
	return c.authz.Peer.ID
}

// withClientID returns ctx with md, the call's incoming metadata (a copy
// the caller owns), as its incoming metadata, in which every
// l5d-client-id the client sent is removed and, for a client that proved
// an identity id over mesh TLS, l5d-client-id is id alone: as Linkerd's
// proxy sets the header on every inbound request (replacing what the
// client sent) or strips it, no client can claim an identity of its own.
func withClientID(ctx context.Context, md metadata.MD, id string) context.Context {
	if md == nil {
		md = metadata.MD{}
	}
	delete(md, clientIDKey)
	if id != "" {
		md[clientIDKey] = []string{id}
	}
	return metadata.NewIncomingContext(ctx, md)
}

// connOf is the connection of ctx read from its peer, for a call whose
// connection TagConn did not see.
func (s *server) connOf(ctx context.Context) *conn {
	c := &conn{authz: authz.Conn{HasPeer: s.meshTLS}}
	if p, ok := peer.FromContext(ctx); ok {
		c.authz.Local, c.authz.Remote = addrPort(p.LocalAddr), addrPort(p.Addr)
		if ai, ok := p.AuthInfo.(InboundAuthInfo); ok && ai.Peer.TLS {
			c.authz.Peer = ai.Peer
		}
	}
	return c
}

func addrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		ap := t.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	if a != nil {
		ap, _ := netip.ParseAddrPort(a.String())
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

func first(md metadata.MD, key string) string {
	if v := md[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// request is a call as the policy reads it: an HTTP/2 POST to the method's
// path, for the call's authority, with its metadata as headers. Requests
// are pooled.
type request struct {
	r http.Request
	u url.URL
}

var requests = sync.Pool{New: func() any { return &request{r: http.Request{Header: make(http.Header)}} }}

func getRequest(method, authority string, md metadata.MD) *request {
	v := requests.Get().(*request)
	v.u = url.URL{Path: method}
	h := v.r.Header
	v.r = http.Request{Method: http.MethodPost, URL: &v.u, Host: authority, Header: h,
		Proto: "HTTP/2.0", ProtoMajor: 2, RequestURI: method}
	for k, vals := range md {
		if len(k) > 0 && k[0] != ':' {
			h[http.CanonicalHeaderKey(k)] = vals
		}
	}
	return v
}

func putRequest(v *request) {
	clear(v.r.Header)
	requests.Put(v)
}
