package mesh

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/inmesh/inmesh/registration"
)

// DefaultDrainDelay is how long [Server.Drain] waits, after the control
// plane confirmed the deregistration, for peers to receive it before the
// listener may close.
const DefaultDrainDelay = registration.DefaultDrainDelay

type registrationConfig struct {
	conn       grpc.ClientConnInterface
	endpoints  []registration.Endpoint
	opts       []registration.Option
	drainDelay time.Duration
}

// WithRegistration makes the server register itself with the control
// plane on conn (registration.Dial) as an endpoint of each of eps'
// authorities once [Server.Listener] wraps its listener, in the
// background, without waiting for the control plane; an endpoint whose Addr
// is the zero value gets the listener's address (which must then be a
// specific IP, not 0.0.0.0), and every endpoint the h2 hint (a mesh server
// accepts HTTP/2). [Server.Drain] (or [Server.Close]) deregisters them.
// With [WithIdentity], the first attempt waits for the identity's first
// certificate. A nil conn changes nothing.
func WithRegistration(conn grpc.ClientConnInterface, eps []registration.Endpoint, opts ...registration.Option) ServerOption {
	return serverOption(func(c *config) {
		if conn == nil {
			return
		}
		c.reg = &registrationConfig{conn: conn, endpoints: eps, opts: opts}
	})
}

// WithDrainDelay sets how long [Server.Drain] waits for peers after the
// deregistration (default [DefaultDrainDelay]); d < 0 changes nothing.
func WithDrainDelay(d time.Duration) ServerOption {
	return serverOption(func(c *config) {
		if d >= 0 {
			c.drainDelay = &d
		}
	})
}

// registrations are a Server's registrations, one per listener.
type registrations struct {
	cfg    registrationConfig
	log    *slog.Logger
	mu     sync.Mutex
	active []*registration.Registration
}

func newRegistrations(c config) *registrations {
	cfg := *c.reg
	cfg.drainDelay = DefaultDrainDelay
	if c.drainDelay != nil {
		cfg.drainDelay = *c.drainDelay
	}
	log := c.logger
	if log == nil {
		log = slog.Default()
	} else {
		cfg.opts = append([]registration.Option{registration.WithLogger(log)}, cfg.opts...)
	}
	if c.identity != nil {
		// The control plane refuses a registrant without its certificate.
		cfg.opts = append([]registration.Option{registration.WithReady(c.identity.Ready())}, cfg.opts...)
	}
	return &registrations{cfg: cfg, log: log}
}

// start registers the endpoints at addr.
func (r *registrations) start(addr net.Addr) {
	reg, err := registration.Register(context.Background(), r.cfg.conn, registration.AtListener(r.cfg.endpoints, addr), r.cfg.opts...)
	if err != nil {
		r.log.Error("mesh: cannot register the server's endpoints", "addr", addr.String(), "err", err)
		return
	}
	r.mu.Lock()
	r.active = append(r.active, reg)
	r.mu.Unlock()
}

// deregister removes every registration; it reports whether there was
// one.
func (r *registrations) deregister(ctx context.Context) bool {
	r.mu.Lock()
	active := r.active
	r.active = nil
	r.mu.Unlock()
	for _, reg := range active {
		if err := reg.Deregister(ctx); err != nil {
			r.log.Warn("mesh: deregistration unconfirmed; the endpoints may stay in the answers until the control plane sees the stream end, or until the registration's lease expires", "err", err)
		}
	}
	return len(active) > 0
}

// Registrations returns the server's current registrations
// ([WithRegistration]), one per listener; nil without it.
func (s *Server) Registrations() []*registration.Registration {
	if s.reg == nil {
		return nil
	}
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	return append([]*registration.Registration(nil), s.reg.active...)
}

// Drain deregisters the server's endpoints ([WithRegistration]), then waits
// the drain delay ([WithDrainDelay]) for peers to stop picking them, or
// until ctx is done: call it before http.Server.Shutdown, so that peers
// stop sending before the listener closes. Without registrations it
// returns at once.
func (s *Server) Drain(ctx context.Context) error {
	if s.reg == nil || !s.reg.deregister(ctx) {
		return ctx.Err()
	}
	t := time.NewTimer(s.reg.cfg.drainDelay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
