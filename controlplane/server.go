package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/inmesh/inmesh/proxyapi/registrationpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Server is an embedded Destination control plane serving a [Store]. It
// answers as Linkerd's controller does (controller/api/destination): the
// first message of a stream that has something to say is sent at once and
// describes the whole state; a Service that does not exist, a name outside
// the cluster and an IP address get Linkerd's errors (see [Server.Get] and
// [Server.GetProfile]); an authority without a port means port 80. Every
// later change of the Store is pushed at once.
//
// [Server.Shutdown] ends every open stream, so that clients re-subscribe
// elsewhere at once: grpc's GracefulStop alone waits for these endless
// streams forever. A replica whose Store lost its source while another
// replica follows it goes on [Standby] ([Server.SetHealth]): served on
// [Server.Listener], it then drops its clients so that they connect to
// that replica. A Server is safe for concurrent use.
type Server struct {
	pb.UnimplementedDestinationServer
	store *Store
	log   *slog.Logger

	reg *registrationServer
	// maxSubscriptions bounds the subscriptions of a Watches stream.
	maxSubscriptions int
	// noHealth: Register leaves the health service out (WithoutHealthService).
	noHealth bool

	// mu guards the Server's health (health.go) and shutdown.
	mu      sync.Mutex
	health  Health
	down    bool                      // Shutdown was called
	stop    *latch                    // closed by Shutdown, or on Standby
	changed chan struct{}             // closed and replaced at every change of health
	conns   map[*servingConn]struct{} // of the listeners of Listener
	streams sync.WaitGroup
	// wakes counts the wake-ups of streams by a change of the store.
	wakes atomic.Int64

	// What each peer holds (peers.go): Linkerd streams, Watches streams,
	// and the subscriptions of its Watches streams.
	peerStreams, peerWatches, peerSubscriptions *peerCounts
	refused                                     metric.Int64Counter // stream_refused_total
	refusals                                    map[string]metric.AddOption
	rlog                                        *ratelog.Logger
}

var _ pb.DestinationServer = (*Server)(nil)

// errShuttingDown ends the streams of a Server that is shutting down; the
// client reconnects, to this control plane's replacement.
var errShuttingDown = status.Error(codes.Unavailable, "controlplane: server shutting down")

// NewServer returns a Server for store. Of the package's options it uses
// [WithLogger], [WithLogInterval], [WithMeterProvider], [WithoutHealthService], the bounds
// ([WithMaxSubscriptions], [WithMaxStreamsPerPeer], [WithWatchesPerPeer])
// and the registration options ([WithRegistry], [WithInsecureRegistration],
// [WithRegistrationLimits]).
func NewServer(store *Store, opts ...Option) *Server {
	cfg := newConfig(opts)
	s := &Server{store: store, log: cfg.logger, maxSubscriptions: cfg.maxSubscriptions, noHealth: cfg.noHealth,
		stop: newLatch(), changed: make(chan struct{}), conns: make(map[*servingConn]struct{}),
		peerStreams: newPeerCounts(cfg.maxStreamsPerPeer), peerWatches: newPeerCounts(cfg.maxWatchesPerPeer),
		peerSubscriptions: newPeerCounts(cfg.maxSubscriptionsPerPeer),
		refusals:          make(map[string]metric.AddOption), rlog: ratelog.New(cfg.logger, cfg.logInterval)}
	var err error
	if s.refused, err = metrics.Meter(cfg.reg.mp, ScopeName).Int64Counter("stream_refused_total",
		metric.WithDescription("Watch streams and Watches subscriptions refused at a bound, by reason: peer_streams, peer_watches, peer_subscriptions or stream_subscriptions.")); err != nil {
		otel.Handle(err)
	}
	for _, reason := range []string{RefusedPeerStreams, RefusedPeerWatches, RefusedPeerSubscriptions, RefusedStreamSubscriptions} {
		s.refusals[reason] = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", reason)))
	}
	s.reg = newRegistrationServer(s, cfg)
	return s
}

// refuse counts and logs a refusal at a bound, and returns err.
func (s *Server) refuse(ctx context.Context, reason string, err error) error {
	if s.refused != nil {
		s.refused.Add(ctx, 1, s.refusals[reason])
	}
	s.rlog.WarnErr("stream refused "+reason, "controlplane: refused a watch at a bound", err, "reason", reason)
	return err
}

// Register adds the Destination, OutboundPolicies, InboundServerPolicies,
// Registration and Watches services to r, such as a *grpc.Server, and
// gRPC's health service (grpc.health.v1.Health), which answers the
// Server's [Health] (see [CurrentHealthService]). When r already has a
// health service (r has grpc.Server's GetServiceInfo, which lists it),
// Register keeps that one and says so in the log, rather than register a
// second one, which grpc-go answers by ending the process (a fatal log); with [WithoutHealthService] it
// registers none, for a program that registers its own later. Either way
// the replicas' hand-over asks r's health service for
// [CurrentHealthService]: let it answer that name and "" from
// [Server.HealthServer]. Watches (proto/watches.proto) carries a client's
// profile, endpoint and policy watches over one stream, each answered as
// the Linkerd stream of its kind would be; package destination's client
// uses it when it is served. Registration needs the caller's verified
// mTLS identity: serve it (also) over TLS that verifies client
// certificates against the trust anchors, as identity.Local's
// ServerConfig does; on a plaintext server it accepts only with
// [WithInsecureRegistration]. Build the gRPC server with
// [KeepaliveOptions]: registrants ping their connection every 10 s, which
// a gRPC server's default enforcement answers by closing it (their
// registrations would break and start again), and silent registrants are
// found by the server's own pings. Serve it on [Server.Listener], so that
// [Standby] moves the clients to another replica.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	pb.RegisterDestinationServer(r, s)
	outboundpb.RegisterOutboundPoliciesServer(r, &policyServer{s: s})
	inboundpb.RegisterInboundServerPoliciesServer(r, &inboundServer{s: s})
	registrationpb.RegisterRegistrationServer(r, s.reg)
	watchespb.RegisterWatchesServer(r, &watchesServer{s: s, max: s.maxSubscriptions})
	if s.noHealth {
		return
	}
	if si, ok := r.(interface {
		GetServiceInfo() map[string]grpc.ServiceInfo
	}); ok {
		if _, has := si.GetServiceInfo()[healthpb.Health_ServiceDesc.ServiceName]; has {
			s.log.Info("controlplane: the gRPC server has a health service already; keeping it rather than the Server's own, which should answer "+
				CurrentHealthService+" and \"\" for replicas' hand-over (Server.HealthServer)",
				"service", healthpb.Health_ServiceDesc.ServiceName)
			return
		}
	}
	healthpb.RegisterHealthServer(r, s.HealthServer())
}

// HealthServer returns the Server's gRPC health service, the one
// [Server.Register] registers: "" answers SERVING unless the Server is on
// [Standby] or shut down, and [CurrentHealthService] SERVING only while it
// is [Current]; Watch follows the changes. A program with a health service
// of its own ([WithoutHealthService]) passes those two names to it.
func (s *Server) HealthServer() healthpb.HealthServer {
	return &healthServer{s: s}
}

// Shutdown ends every open stream with Unavailable and refuses new ones
// from now on, then waits until every stream handler has returned or ctx is
// done (returning ctx.Err()). Call it before grpc.Server.GracefulStop, which
// then returns as soon as the remaining unary work (none) is done. It is
// safe to call more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.down {
		s.down = true
		s.stop.close()
		close(s.changed)
		s.changed = make(chan struct{})
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.streams.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// GetProfile streams the profile of the requested authority, with the
// answers of Linkerd's controller (controller/api/destination/server.go
// GetProfile): a Service's name gets its profile (see
// Store.serviceProfile), an unknown Service Unknown `service "name" not
// found`, a name outside the cluster InvalidArgument; an IP address gets
// the profile of the Service whose clusterIP it is, or else that of the
// workload at that address (its endpoint). An address that several
// Services (by clusterIP) or several workloads (endpoints of different
// identities at that ip:port) claim is FailedPrecondition, as Linkerd's
// controller answers a conflicting IP. A pod's DNS name
// (pod.name.ns.svc.cluster.local) gets its Service's profile: the
// endpoints file knows no pod hostnames, where Linkerd's controller
// answers the pod's endpoint.
func (s *Server) GetProfile(req *pb.GetDestination, stream grpc.ServerStreamingServer[pb.DestinationProfile]) error {
	f, err := s.profileFeed(req)
	if err != nil {
		return err
	}
	return serveFeed(s, stream, f)
}

// profileFeed is the answer of a GetProfile request (see
// [Server.GetProfile]), or the status that refuses it.
func (s *Server) profileFeed(req *pb.GetDestination) (feed, error) {
	host, port, err := hostAndPort(req.GetPath())
	if err != nil {
		return feed{}, status.Errorf(codes.InvalidArgument, "invalid authority: %q: %q", req.GetPath(), err.Error())
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		ref, ok, err := s.store.serviceOfIP(ip)
		if err != nil {
			return feed{}, err
		}
		if ok {
			return s.serviceProfileFeed(ref, ref.fqdn(), contextNamespace(req.GetContextToken()), port)
		}
		return feed{keys: []watchKey{addrKey(ip)}, next: latest(func() (proto.Message, error) {
			p, err := s.store.endpointProfile(ip, port)
			if err != nil {
				return nil, err
			}
			return destination.ProfileToProto(p), nil
		})}, nil
	}
	ref, _, err := clusterService(host)
	if err != nil {
		return feed{}, status.Errorf(codes.InvalidArgument, "invalid service %q: %q", host, err.Error())
	}
	return s.serviceProfileFeed(ref, host, contextNamespace(req.GetContextToken()), port)
}

// contextNamespace is the namespace a GetDestination's context token
// names, read as Linkerd's controller reads it
// (controller/api/destination/server.go parseContextToken): JSON with
// "ns", or the older form "ns:NAMESPACE"; "" for none or a token that is
// neither.
func contextNamespace(token string) string {
	if token == "" {
		return ""
	}
	var t struct {
		NS string `json:"ns"`
	}
	if err := json.Unmarshal([]byte(token), &t); err == nil {
		return t.NS
	}
	if ns, ok := strings.CutPrefix(token, "ns:"); ok && !strings.Contains(ns, ":") {
		return ns
	}
	return ""
}

// serviceProfileFeed is the profile of a Service port; a Service that does
// not exist is an error, as the Kubernetes lister's answer is in Linkerd's
// controller (code Unknown).
func (s *Server) serviceProfileFeed(ref serviceRef, fqn, clientNS string, port uint32) (feed, error) {
	if !s.store.serviceExists(ref) {
		return feed{}, status.Errorf(codes.Unknown, "service %q not found", ref.name)
	}
	sent := false
	return feed{keys: []watchKey{serviceKey(ref), profileKey(fqn)}, next: latest(func() (proto.Message, error) {
		p, sp, empty := s.store.serviceProfile(ref, fqn, clientNS, port)
		switch {
		case p == nil && sent:
			// The Service went away: its last profile stays, as a
			// subscription of Linkerd's controller keeps it.
			return nil, nil
		case p == nil:
			p = &profiles.Profile{}
			empty = true
		}
		msg := destination.ProfileToProto(p)
		if !empty {
			msg.ParentRef, msg.ProfileRef = profileRefs(fqn, port, sp)
		}
		sent = true
		return msg, nil
	})}, nil
}

// feed is the answer of one watch of the store, served by a Linkerd
// stream or by a subscription of the Watches service: the keys of the
// resources it is computed from, and next, which returns the messages
// that take the watcher from what it was sent to the current state (none
// when nothing changed for it), or the status that ends the watch. One
// goroutine at a time calls next.
type feed struct {
	keys []watchKey
	next func() ([]message, error)
}

// unshared is f with each message encoded by the stream that sends it.
func (f feed) unshared() feed {
	next := f.next
	f.next = func() ([]message, error) {
		msgs, err := next()
		out := make([]message, len(msgs))
		for i, m := range msgs {
			out[i] = message{Message: m.Message}
		}
		return out, err
	}
	return f
}

// message is an answer of a feed. enc, when set, is the encoding that
// every stream sending this very message shares: the updates of an
// endpoint set's change go to every stream of its authority, encoded
// once (see [sharedEncoding]).
type message struct {
	proto.Message
	enc *sharedEncoding
}

// sharedEncoding is the gRPC encoding of one message, made by the first
// stream that sends it and sent as is by the others.
type sharedEncoding struct {
	once sync.Once
	msg  *grpc.PreparedMsg // nil when encoding failed: each stream encodes
}

// get returns the encoding of m, made with stream's codec and compressor
// on the first call; nil when it could not be made.
func (e *sharedEncoding) get(stream grpc.ServerStream, m proto.Message) *grpc.PreparedMsg {
	e.once.Do(func() {
		p := new(grpc.PreparedMsg)
		if p.Encode(stream, m) == nil {
			e.msg = p
		}
	})
	return e.msg
}

// sharesEncoding reports whether a stream may send encodings that other
// streams made ([sharedEncoding]): it uses the default codec (proto) and
// compresses neither what it receives nor what it sends, as every stream
// whose encoding is shared. A stream of another transport than grpc's
// own HTTP/2 server does not.
func sharesEncoding(ctx context.Context) bool {
	st, ok := grpc.ServerTransportStreamFromContext(ctx).(interface {
		RecvCompress() string
		SendCompress() string
		ContentSubtype() string
	})
	if !ok {
		return false
	}
	plain := func(c string) bool { return c == "" || c == "identity" }
	sub := st.ContentSubtype()
	return plain(st.RecvCompress()) && plain(st.SendCompress()) && (sub == "" || sub == "proto")
}

// serveFeed serves f on a Linkerd stream: it sends what f has to send,
// then waits for a change of f's keys, the server's shutdown or the
// stream's end.
func serveFeed[T any, M interface {
	*T
	proto.Message
}](s *Server, stream grpc.ServerStreamingServer[T], f feed) error {
	stop, err := s.begin()
	if err != nil {
		return err
	}
	defer s.streams.Done()
	ctx := stream.Context()
	p := peerOf(ctx)
	if !s.peerStreams.acquire(p.key) {
		return s.refuse(ctx, RefusedPeerStreams, status.Errorf(codes.ResourceExhausted,
			"controlplane: %s has %d streams open, the most one peer may", p, s.peerStreams.max))
	}
	defer s.peerStreams.release(p.key, 1)
	w := s.store.subscribe(f.keys...)
	defer s.store.unsubscribe(w)
	share := sharesEncoding(ctx)
	for {
		msgs, err := f.next()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.enc != nil && share {
				if p := m.enc.get(stream, m.Message); p != nil {
					if err := stream.SendMsg(p); err != nil {
						return err
					}
					continue
				}
			}
			if err := stream.Send(m.Message.(M)); err != nil {
				return err
			}
		}
		if done, err := s.wait(ctx, w, stop); done {
			return err
		}
	}
}

// latest is the next of a feed that sends the message current returns
// whenever it differs from the last one sent (nil: keep the last one). An
// error from current ends the watch with it. What it keeps of the last
// message is its encoding, a fraction of the decoded message's size: a
// control plane holds one per open watch.
func latest(current func() (proto.Message, error)) func() ([]message, error) {
	var last []byte
	return func() ([]message, error) {
		msg, err := current()
		if err != nil || msg == nil {
			return nil, err
		}
		b, err := deterministic.Marshal(msg)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "encoding the answer: %v", err)
		}
		if last != nil && bytes.Equal(b, last) {
			return nil, nil
		}
		last = b
		return []message{{Message: msg}}, nil
	}
}

// deterministic encodes a message the same way every time, so that two
// encodings are equal when the messages are.
var deterministic = proto.MarshalOptions{Deterministic: true}

// wait waits for a wake-up of w, the stream's stop (from begin: the
// server's shutdown or standby) or the end of the stream's ctx; done says
// the stream is to end, with err (nil when the client went away).
func (s *Server) wait(ctx context.Context, w *waiter, stop <-chan struct{}) (done bool, err error) {
	select {
	case <-w.c:
		s.wakes.Add(1)
		return false, nil
	case <-stop:
		return true, s.stopErr()
	case <-ctx.Done():
		return true, nil
	}
}

// profileRefs are the parent_ref and profile_ref of the profile of a
// Service's name and port, as Linkerd's destination controller sends them
// (controller/api/destination/profile_translator.go): the Service port,
// and the ServiceProfile, or only its API group when there is none. Other
// names get neither.
func profileRefs(host string, port uint32, sp *profiles.ServiceProfile) (parent, profile *pb.Metadata) {
	ns, name, ok := serviceName(host)
	if !ok {
		return nil, nil
	}
	parent = &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: &pb.Resource{
		Group: "core", Kind: "Service", Name: name, Namespace: ns, Port: port}}}
	ref := &pb.Resource{Group: "linkerd.io"}
	if sp != nil {
		ref.Kind, ref.Name, ref.Namespace = "ServiceProfile", sp.Name, sp.Namespace
	}
	return parent, &pb.Metadata{Kind: &pb.Metadata_Resource{Resource: ref}}
}

// serviceName splits a Service's fully qualified name,
// name.ns.svc.cluster.local (with or without a trailing dot).
func serviceName(host string) (ns, name string, ok bool) {
	if !strings.HasSuffix(strings.TrimSuffix(strings.ToLower(host), "."), "."+manifest.ClusterDomain) {
		return "", "", false
	}
	ns, name, _, ok = manifest.ParseAuthority(net.JoinHostPort(host, "80"))
	return ns, name, ok
}

// endpointSetLabels are the set-level labels of the endpoints of a
// Service's name, as Linkerd's destination controller sends them
// (controller/api/destination/watcher/port_publisher.go metricLabels):
// namespace and service. Other names get none.
func endpointSetLabels(host string) map[string]string {
	ns, name, ok := serviceName(host)
	if !ok {
		return nil
	}
	return map[string]string{"namespace": ns, "service": name}
}

// Get streams the endpoints of the requested authority as adds and removes
// against what the stream already sent, with the answers of Linkerd's
// controller (controller/api/destination/server.go Get,
// endpoint_translator.go, watcher/filtered_listener_group.go): an IP
// address is InvalidArgument "IP queries not supported by Get API", a name
// outside the cluster InvalidArgument "Invalid authority", a Service that
// does not exist NotFound "Service name.ns not found". A Service port with
// no endpoints, or one the Service does not define, gets no message at
// all until it has some; endpoints that go away are removed, never
// answered with no_endpoints. The streams of one authority share the
// encoding of each update (a [grpc.PreparedMsg]): a stream interceptor's
// SendMsg may be given one in place of a *pb.Update.
func (s *Server) Get(req *pb.GetDestination, stream grpc.ServerStreamingServer[pb.Update]) error {
	f, err := s.endpointsFeed(req)
	if err != nil {
		return err
	}
	// A shared encoding goes out through SendMsg, as grpc's own stream
	// sends a message; a stream of another type, one that wraps grpc's,
	// may do more in Send: it is sent each message.
	if _, ok := stream.(*grpc.GenericServerStream[pb.GetDestination, pb.Update]); !ok {
		f = f.unshared()
	}
	return serveFeed(s, stream, f)
}

// endpointsFeed is the answer of a Get request (see [Server.Get]), or the
// status that refuses it.
func (s *Server) endpointsFeed(req *pb.GetDestination) (feed, error) {
	host, port, err := hostAndPort(req.GetPath())
	if err != nil {
		return feed{}, errInvalidAuthority(req.GetPath())
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return feed{}, status.Errorf(codes.InvalidArgument, "IP queries not supported by Get API: host=%s", host)
	}
	ref, _, err := clusterService(host)
	if err != nil {
		return feed{}, errInvalidAuthority(req.GetPath())
	}
	if !s.store.serviceExists(ref) {
		return feed{}, status.Errorf(codes.NotFound, "Service %s.%s not found", ref.name, ref.ns)
	}
	authority := net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))
	// What the stream was sent: a version of the authority's set (0:
	// none) and that set.
	var (
		sentVersion uint64
		sent        []endpoint.Endpoint
	)
	return feed{keys: []watchKey{endpointsKey(authority)}, next: func() ([]message, error) {
		var msgs []message
		msgs, sentVersion, sent = s.store.endpointUpdates(authority, sentVersion, sent)
		return msgs, nil
	}}, nil
}

// endpointDiff returns the updates that take a stream from the endpoint
// set prev to cur, both sorted by address without duplicates (as the
// Store keeps them): the new or changed endpoints as one add, then the
// gone ones as one remove; nothing when nothing changed. Endpoints are
// compared as they are encoded (wireEndpoint).
func endpointDiff(prev, cur []endpoint.Endpoint, setLabels map[string]string) []*pb.Update {
	var (
		added   []*pb.WeightedAddr
		removed []*pb.TcpAddress
	)
	for i, j := 0, 0; i < len(prev) || j < len(cur); {
		switch {
		case j == len(cur) || i < len(prev) && prev[i].Addr.Compare(cur[j].Addr) < 0:
			removed = append(removed, destination.AddrToProto(prev[i].Addr))
			i++
		case i == len(prev) || cur[j].Addr.Compare(prev[i].Addr) < 0:
			added = append(added, destination.EndpointToProto(wireEndpoint(cur[j])))
			j++
		default:
			if we := wireEndpoint(cur[j]); !equalEndpoint(wireEndpoint(prev[i]), we) {
				added = append(added, destination.EndpointToProto(we))
			}
			i++
			j++
		}
	}
	var out []*pb.Update
	// Adds go first so that a stream never passes through an empty set
	// that did not exist.
	if len(added) > 0 {
		out = append(out, &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{Addrs: added, MetricLabels: setLabels}}})
	}
	if len(removed) > 0 {
		out = append(out, &pb.Update{Update: &pb.Update_Remove{Remove: &pb.AddrSet{Addrs: removed}}})
	}
	return out
}

// equalEndpoint reports whether a and b are the same endpoint in every
// field (a nil and an empty Labels alike).
func equalEndpoint(a, b endpoint.Endpoint) bool {
	return a.Addr == b.Addr && a.Weight == b.Weight && a.Identity == b.Identity && a.ServerName == b.ServerName &&
		a.H2 == b.H2 && a.Opaque == b.Opaque && a.OpaqueTransportPort == b.OpaqueTransportPort &&
		a.AuthorityOverride == b.AuthorityOverride && maps.Equal(a.Labels, b.Labels)
}
