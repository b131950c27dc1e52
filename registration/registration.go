// Package registration registers a workload's own endpoints with inmesh's
// embedded control plane (package controlplane), so that peers find it by
// its Service's name without an endpoints file.
//
// [Register] opens a stream to the control plane's Registration API and
// keeps it open: the endpoints stay in every answer while it lives. It
// waits for neither the control plane nor etcd: the stream is opened, and
// opened again after any failure, in the background with backoff
// (package backoff's default). [Registration.Deregister] removes the
// endpoints at once; call it before the server's listener closes, so that
// peers stop sending first (mesh.WithRegistration and
// meshgrpc.WithRegistration do). When the process dies, the control plane
// removes them when it sees the stream break, or by the expiry of its
// lease (etcdstore.DefaultRegistrationTTL, 30 s) at the latest.
//
// # Replicas
//
// [Dial] takes several replicas; a registration's stream lives on one
// (gRPC's pick_first) and moves to the next live one when that replica
// dies, shuts down, freezes (noticed within [LeaveLostReplicaWithin]) or
// stands by because it lost etcd while another replica reads it. The
// lease it leaves behind keeps the endpoints in the answers until the
// registration is in again, through the other replica.
//
// # Security
//
// The control plane authenticates a registration by the workload's mTLS
// identity ([Dial] with an identity.Local): each endpoint carries that
// identity, and only for a Service the manifests let it serve: the
// Service's selector matches Pods whose spec.serviceAccountName gives that
// identity (SA.NS.serviceaccount.identity.linkerd.TRUSTDOMAIN), or its
// inmesh.io/registration-identities annotation lists it. Anything else is
// refused (PermissionDenied naming the identity and the Service) and
// retried with backoff, since the manifests may change; so is an address
// that another workload holds (FailedPrecondition), which its end may
// free. A request the control plane finds invalid (InvalidArgument: an
// authority outside the cluster's names, an endpoint listed twice) is not
// retried: the registration ends, [Registration.Err] says why, and
// [Registration.Done] is closed. A plaintext registrant is refused unless
// the control plane runs with insecure registration, for development.
package registration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/cpaddr"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/proxyapi/registrationpb"
)

// Endpoint is one endpoint a workload registers.
type Endpoint struct {
	// Authority is the Service port, name.ns.svc.cluster.local:port.
	Authority string
	// Addr is the workload's address for it, ip:port.
	Addr netip.AddrPort
	// H2 hints that the endpoint is a mesh peer accepting HTTP/2
	// (orig-proto), as mesh.Server and meshgrpc servers are.
	H2 bool
	// Opaque hints that the port takes opaque traffic.
	Opaque bool
	// Weight is the endpoint's share of traffic; 0 means the default.
	Weight uint32
	// Labels are metric labels, such as zone.
	Labels map[string]string
}

// Option configures [Register].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	logger *slog.Logger
	retry  backoff.Policy
	ready  <-chan struct{}
}

// WithReady makes the registration wait until ready is closed before its
// first attempt, such as identity.Local's Ready: a workload's certificate,
// without which the control plane refuses it. Nil changes nothing.
func WithReady(ready <-chan struct{}) Option {
	return optionFunc(func(c *config) {
		if ready != nil {
			c.ready = ready
		}
	})
}

// WithLogger sets the logger of refusals and broken streams (default
// slog.Default()); nil changes nothing.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithRetry sets the backoff between attempts (default
// backoff.DefaultPolicy()); a policy that does not validate changes
// nothing.
func WithRetry(p backoff.Policy) Option {
	return optionFunc(func(c *config) {
		if p.Validate() == nil {
			c.retry = p
		}
	})
}

// Dial returns a connection to the control plane's Registration API at
// addr (host:port, or several replicas comma-separated). With local, the
// connection is mTLS presenting local's certificate, and the control plane
// must prove serverName (its identity service's name, such as
// linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local);
// with nil, it is plaintext, which only a control plane with insecure
// registration accepts. It does not wait for the control plane. The
// connection pings the control plane after 10 s of silence and gives up
// on it when no answer comes within [KeepaliveTimeout], so that a
// registration leaves a replica lost without a reset (its host gone, its
// process frozen) for a live one within [LeaveLostReplicaWithin], before
// the lease that replica kept alive expires (etcdstore's default TTL
// leaves it two thirds of its 30 s at least): the control plane's gRPC
// server must allow the pings, as controlplane.KeepaliveOptions does.
func Dial(addr string, local *identity.Local, serverName string) (*grpc.ClientConn, error) {
	target, opts := addr, []grpc.DialOption{}
	if cpaddr.IsList(addr) {
		t, o, err := cpaddr.Target(addr)
		if err != nil {
			return nil, fmt.Errorf("registration: control-plane addresses %q: %w", addr, err)
		}
		target, opts = t, append(opts, o)
	} else {
		target = "passthrough:///" + addr
	}
	if local != nil {
		if serverName == "" {
			return nil, errors.New("registration: Dial with an identity needs the control plane's identity (serverName)")
		}
		opts = append(opts, grpc.WithTransportCredentials(local.TransportCredentials(serverName)))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	// A replica lost without closing the connection (its host gone, a
	// frozen process) is noticed by its silence, and the registration
	// moves to the next live one; the control plane's KeepaliveOptions
	// allow pings this often.
	opts = append(opts, grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: cpaddr.MinPing, Timeout: KeepaliveTimeout}))
	return grpc.NewClient(target, opts...)
}

// KeepaliveTimeout is how long a registration's connection waits for the
// answer to its ping before it moves to another replica.
const KeepaliveTimeout = 5 * time.Second

// LeaveLostReplicaWithin is the longest a registration's connection ([Dial])
// takes to notice a replica lost without a reset: gRPC's shortest ping
// interval (10 s of silence), then [KeepaliveTimeout]. A control plane's
// lease TTL must leave its leases more than that past their replica's
// last keep-alive, so that a live workload moves before its lease
// expires.
const LeaveLostReplicaWithin = cpaddr.MinPing + KeepaliveTimeout

// Registration is a workload's registration, kept while it lives. It is
// safe for concurrent use.
type Registration struct {
	client   registrationpb.RegistrationClient
	req      *registrationpb.RegisterRequest
	retry    backoff.Policy
	log      *ratelog.Logger
	cancel   context.CancelFunc
	done     chan struct{} // closed when run returns
	accepted chan struct{} // closed at the first acceptance

	mu            sync.Mutex
	stream        registrationpb.Registration_RegisterClient // open, nil between attempts
	deregistering bool
	// unconfirmed is why the control plane did not confirm a
	// deregistration sent on an open stream.
	unconfirmed  error
	err          error // the last failure, nil once accepted
	acceptedOnce sync.Once
}

// Register starts registering eps over conn (see [Dial]) and returns at
// once; the registration lasts until [Registration.Deregister] or until
// ctx is done (the endpoints then go as the stream ends). An endpoint
// without an authority or address, or listed twice (one authority, one
// address), is an error.
func Register(ctx context.Context, conn grpc.ClientConnInterface, eps []Endpoint, opts ...Option) (*Registration, error) {
	cfg := config{logger: slog.Default(), retry: backoff.DefaultPolicy()}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("registration: no endpoint to register")
	}
	msg := &registrationpb.Endpoints{}
	type listed struct {
		authority string
		addr      netip.AddrPort
	}
	seen := make(map[listed]int, len(eps))
	for i, e := range eps {
		if e.Authority == "" || !e.Addr.IsValid() {
			return nil, fmt.Errorf("registration: endpoint %d: an authority and an address are required", i)
		}
		k := listed{strings.ToLower(e.Authority), e.Addr}
		if first, dup := seen[k]; dup {
			return nil, fmt.Errorf("registration: endpoint %d repeats endpoint %d (%s of %s)", i, first, e.Addr, e.Authority)
		}
		seen[k] = i
		pe := &registrationpb.Endpoint{Authority: e.Authority, Addr: e.Addr.String(), Weight: e.Weight, Labels: e.Labels}
		switch {
		case e.H2 && e.Opaque:
			return nil, fmt.Errorf("registration: endpoint %d (%s): H2 and Opaque exclude each other", i, e.Addr)
		case e.H2:
			pe.Protocol = registrationpb.ProtocolHint_PROTOCOL_HINT_H2
		case e.Opaque:
			pe.Protocol = registrationpb.ProtocolHint_PROTOCOL_HINT_OPAQUE
		}
		msg.Endpoints = append(msg.Endpoints, pe)
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &Registration{
		client:   registrationpb.NewRegistrationClient(conn),
		req:      &registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Endpoints{Endpoints: msg}},
		retry:    cfg.retry,
		log:      ratelog.New(cfg.logger, 0),
		cancel:   cancel,
		done:     make(chan struct{}),
		accepted: make(chan struct{}),
		err:      ErrPending,
	}
	go r.run(ctx, cfg.ready)
	return r, nil
}

// ErrPending is [Registration.Err] until the control plane first answers:
// while it cannot be reached, is starting, or has not replied yet.
var ErrPending = errors.New("registration: not registered yet: no answer from the control plane")

// Accepted is closed once the control plane has accepted the endpoints
// for the first time.
func (r *Registration) Accepted() <-chan struct{} { return r.accepted }

// Done is closed once the registration has ended: after
// [Registration.Deregister], when Register's ctx is done, or when the
// control plane refused the endpoints as invalid (InvalidArgument, which
// no retry changes; [Registration.Err] has it).
func (r *Registration) Done() <-chan struct{} { return r.done }

// Err returns why the endpoints are not registered now: [ErrPending]
// before the control plane's first answer, then the last refusal or
// broken stream; nil while they are registered.
func (r *Registration) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Deregister removes the endpoints from the control plane's answers and
// waits until it confirms, the registration ends, or ctx is done; the
// registration then ends either way. It returns an error when the control
// plane did not confirm: it could not remove them (its etcd out of
// reach), or the stream broke meanwhile. The endpoints may then stay in
// the answers until the registration's lease expires (the control plane's
// TTL), and a server that can wait that long keeps its listener open. It
// is safe to call more than once.
func (r *Registration) Deregister(ctx context.Context) error {
	r.mu.Lock()
	r.deregistering = true
	st := r.stream
	var err error
	if st != nil {
		err = st.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Deregister{Deregister: &registrationpb.Deregister{}}})
	}
	r.mu.Unlock()
	if st == nil || err != nil {
		// Nothing is registered (or the stream is gone, which removes
		// it): end at once.
		r.cancel()
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		r.cancel()
		<-r.done
		return fmt.Errorf("registration: deregistering: %w", ctx.Err())
	}
	r.cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unconfirmed != nil {
		return fmt.Errorf("registration: deregistering: the control plane did not confirm: %w", r.unconfirmed)
	}
	return nil
}

// run keeps a registration stream open until ctx is done or Deregister.
func (r *Registration) run(ctx context.Context, ready <-chan struct{}) {
	defer close(r.done)
	if ready != nil {
		select {
		case <-ready:
		case <-ctx.Done():
			return
		}
	}
	seq := backoff.NewSequence(r.retry)
	for ctx.Err() == nil {
		progressed, deregistered, err := r.attempt(ctx)
		if deregistered || ctx.Err() != nil {
			return
		}
		if r.isDeregistering() {
			// The stream ended after Deregister sent its request, without
			// the confirmation.
			r.mu.Lock()
			r.unconfirmed = err
			r.mu.Unlock()
			return
		}
		if progressed {
			seq.Reset()
		}
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
		switch status.Code(err) {
		case codes.InvalidArgument:
			// A request the control plane cannot read the same way
			// every time: retrying would only repeat the refusal.
			r.log.Error("invalid", "registration: the control plane refused the endpoints as invalid; not retrying", "err", err)
			return
		case codes.PermissionDenied, codes.FailedPrecondition, codes.ResourceExhausted:
			r.log.WarnErr("refused", "registration: the control plane refused the endpoints; retrying with backoff", err)
		default:
			r.log.WarnErr("broken", "registration: the registration stream broke; registering again", err)
		}
		if backoff.Wait(ctx, seq.Next()) != nil {
			return
		}
	}
}

func (r *Registration) isDeregistering() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deregistering
}

// attempt opens one stream, registers, and reads its answers until it
// ends.
func (r *Registration) attempt(ctx context.Context) (progressed, deregistered bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := r.client.Register(sctx, grpc.WaitForReady(true))
	if err != nil {
		return false, false, err
	}
	r.mu.Lock()
	if r.deregistering {
		r.mu.Unlock()
		return false, true, nil
	}
	r.stream = st
	err = st.Send(r.req)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.stream = nil
		r.mu.Unlock()
	}()
	if err != nil {
		_, err = st.Recv() // the stream's status
		return false, false, err
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return progressed, false, err
		}
		switch resp.GetKind().(type) {
		case *registrationpb.RegisterResponse_Accepted:
			progressed = true
			r.mu.Lock()
			r.err = nil
			r.mu.Unlock()
			r.acceptedOnce.Do(func() { close(r.accepted) })
			// Confirms a registration that was pending, refused or
			// broken before.
			r.log.Info("accepted", "registration: the control plane accepted the endpoints",
				"endpoints", len(r.req.GetEndpoints().GetEndpoints()))
		case *registrationpb.RegisterResponse_Deregistered:
			return progressed, true, nil
		}
	}
}

// DefaultDrainDelay is how long [Registration.Drain] waits, after the
// control plane confirmed the deregistration, for peers to receive it.
const DefaultDrainDelay = time.Second

// Drain deregisters (see [Registration.Deregister]), then waits delay for
// the peers' watches to receive the removal, or until ctx is done: call it
// before the server's listener closes, so that peers stop sending first.
func (r *Registration) Drain(ctx context.Context, delay time.Duration) error {
	if err := r.Deregister(ctx); err != nil {
		return err
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// AtListener returns eps for a server listening at addr: an endpoint
// without an address gets addr's (which must then be a specific IP, not
// 0.0.0.0), and every endpoint not marked Opaque the h2 hint, since a mesh
// server (mesh.Server, a meshgrpc server) accepts HTTP/2.
func AtListener(eps []Endpoint, addr net.Addr) []Endpoint {
	var ap netip.AddrPort
	if a, ok := addr.(*net.TCPAddr); ok {
		ap = a.AddrPort()
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	out := make([]Endpoint, len(eps))
	for i, e := range eps {
		if !e.Addr.IsValid() {
			e.Addr = ap
		}
		e.H2 = !e.Opaque
		out[i] = e
	}
	return out
}
