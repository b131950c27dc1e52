package controlplane

import (
	"context"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// Health is what a replica knows of the source of its [Store] (etcd, for a
// replica that package etcdstore feeds), and so whom its [Server] serves.
// etcdstore.WithReplica sets it; a Server fed from files stays Current.
type Health int

const (
	// Current: the Store follows its source. The Server serves; it
	// starts so.
	Current Health = iota
	// Stale: the Store lost its source and no other replica is known to
	// follow it. The Server serves what it last knew, as clients keep
	// what they last received from a control plane gone silent.
	Stale
	// Standby: the Store lost its source and another replica follows it.
	// The Server ends every stream with Unavailable and refuses new ones,
	// and the listeners of [Server.Listener] close their connections and
	// every new one, so that clients (gRPC's pick_first) connect to
	// another replica. Registrations are left to their leases, as at
	// [Server.Shutdown]: the workloads register again elsewhere.
	Standby
)

func (h Health) String() string {
	switch h {
	case Current:
		return "current"
	case Stale:
		return "stale"
	case Standby:
		return "standby"
	}
	return "unknown"
}

// CurrentHealthService is the service name for which the Server's gRPC
// health service (grpc.health.v1.Health, added by [Server.Register])
// answers SERVING only while the Server is [Current]: replicas ask each
// other this before one hands its clients over. The empty name is
// SERVING while the Server serves anyone ([Current] or [Stale]).
const CurrentHealthService = "inmesh.controlplane.Current"

// errStandby ends the streams of a Server on [Standby].
var errStandby = status.Error(codes.Unavailable,
	"controlplane: this replica lost its source (etcd) and another replica follows it: connect to another replica")

// SetHealth sets the Server's [Health]. Entering [Standby] ends every open
// stream with Unavailable and closes the connections of its listeners
// ([Server.Listener]); leaving it serves again, and the clients that moved
// stay where they are. It is safe for concurrent use.
func (s *Server) SetHealth(h Health) {
	if h < Current || h > Standby {
		return
	}
	s.mu.Lock()
	prev := s.health
	if prev == h {
		s.mu.Unlock()
		return
	}
	s.health = h
	close(s.changed)
	s.changed = make(chan struct{})
	var conns []*servingConn
	switch {
	case h == Standby:
		s.stop.close()
		for c := range s.conns {
			conns = append(conns, c)
		}
	case prev == Standby && !s.down:
		s.stop = newLatch()
	}
	s.mu.Unlock()
	switch h {
	case Standby:
		s.log.Warn("controlplane: standby: the store lost its source and another replica follows it; ending every stream and closing every connection so that clients move there",
			"connections", len(conns))
	case Stale:
		s.log.Warn("controlplane: the store lost its source and no other replica is known to follow it; serving the last state known")
	case Current:
		s.log.Info("controlplane: the store follows its source; serving", "was", prev.String())
	}
	// The streams were told first: a registration that sees its
	// connection close now leaves its lease to run.
	for _, c := range conns {
		_ = c.Close()
	}
}

// Health returns the Server's [Health].
func (s *Server) Health() Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.health
}

// Listener returns lis with its connections tied to the Server's
// [Health]: on [Standby] a connection is closed as soon as it is
// accepted, and the open ones are closed when the Server enters it. A
// gRPC client then fails to connect and tries its next address, where a
// status would leave it on this replica. Serve the Server's APIs on it:
// grpcServer.Serve(srv.Listener(lis)).
func (s *Server) Listener(lis net.Listener) net.Listener {
	return &servingListener{Listener: lis, s: s}
}

// servingListener is a listener of [Server.Listener].
type servingListener struct {
	net.Listener
	s *Server
}

func (l *servingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if sc := l.s.track(c); sc != nil {
			return sc, nil
		}
		// On standby: the client's connection attempt fails, and it
		// tries its next address.
		_ = c.Close()
	}
}

// servingConn is a connection of a [servingListener], closed by the
// Server when it enters [Standby].
type servingConn struct {
	net.Conn
	s    *Server
	once sync.Once
}

func (c *servingConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}

// track returns c as a connection of the Server, or nil on [Standby].
func (s *Server) track(c net.Conn) *servingConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.health == Standby {
		return nil
	}
	sc := &servingConn{Conn: c, s: s}
	s.conns[sc] = struct{}{}
	return sc
}

// latch is a channel closed at most once.
type latch struct {
	c      chan struct{}
	closed bool
}

func newLatch() *latch { return &latch{c: make(chan struct{})} }

func (l *latch) close() {
	if !l.closed {
		l.closed = true
		close(l.c)
	}
}

// begin registers a stream handler and returns the channel closed when it
// is to end (the Server shuts down or enters [Standby]); it fails once
// either happened.
func (s *Server) begin() (<-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop.closed {
		return nil, s.stopErrLocked()
	}
	s.streams.Add(1)
	return s.stop.c, nil
}

// stopErr is the status that ends a stream whose stop channel (from begin)
// closed.
func (s *Server) stopErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopErrLocked()
}

func (s *Server) stopErrLocked() error {
	if s.down {
		return errShuttingDown
	}
	return errStandby
}

// healthStatus answers a health check of service, false for a service
// the Server does not know.
func (s *Server) healthStatus(service string) (healthpb.HealthCheckResponse_ServingStatus, <-chan struct{}, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	serving := func(ok bool) healthpb.HealthCheckResponse_ServingStatus {
		if ok && !s.down {
			return healthpb.HealthCheckResponse_SERVING
		}
		return healthpb.HealthCheckResponse_NOT_SERVING
	}
	switch service {
	case "":
		return serving(s.health != Standby), s.changed, true
	case CurrentHealthService:
		return serving(s.health == Current), s.changed, true
	}
	return healthpb.HealthCheckResponse_SERVICE_UNKNOWN, s.changed, false
}

// healthServer serves grpc.health.v1.Health for a Server.
type healthServer struct {
	healthpb.UnimplementedHealthServer
	s *Server
}

func (h *healthServer) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st, _, ok := h.s.healthStatus(req.GetService())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "unknown service %q", req.GetService())
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// Watch sends the service's status, then every change, until the stream
// or the Server ends.
func (h *healthServer) Watch(req *healthpb.HealthCheckRequest, stream grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	stop, err := h.s.begin()
	if err != nil {
		return err
	}
	defer h.s.streams.Done()
	ctx := stream.Context()
	last := healthpb.HealthCheckResponse_ServingStatus(-1)
	for {
		st, changed, _ := h.s.healthStatus(req.GetService())
		if st != last {
			if err := stream.Send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
				return err
			}
			last = st
		}
		select {
		case <-changed:
		case <-stop:
			return h.s.stopErr()
		case <-ctx.Done():
			return nil
		}
	}
}
