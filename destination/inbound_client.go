package destination

import (
	"context"
	"strconv"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
	"google.golang.org/grpc"
)

// InboundUpdate is one state of an inbound policy watch: the port's
// Server, or an error saying why there is none (the control plane
// rejected the workload or the port).
type InboundUpdate struct {
	Server *authz.Server
	Err    error
}

func (c *Client) initInbound(cc grpc.ClientConnInterface) {
	api := inboundpb.NewInboundServerPoliciesClient(cc)
	rl := ratelog.New(c.cfg.logger, 10*time.Second)
	c.inbound = &watches[*inboundpb.Server, InboundUpdate]{
		c: c,
		kind: &kind[*inboundpb.Server, InboundUpdate]{
			name: "InboundServerPolicies.WatchPort",
			open: func(ctx context.Context, key string, _ sink[*inboundpb.Server], opts ...grpc.CallOption) (recvStream[*inboundpb.Server], error) {
				port, _ := strconv.ParseUint(key, 10, 16)
				return api.WatchPort(ctx, &inboundpb.PortSpec{Workload: c.workload(), Port: uint32(port)}, opts...)
			},
			decode: func(key string, _ InboundUpdate, _ bool, m *inboundpb.Server) (InboundUpdate, bool) {
				s, err := ServerFromProto(m)
				if err == nil {
					_, err = authz.Compile(s)
				}
				if err != nil {
					// As Linkerd's proxy (linkerd/app/inbound/src/policy/api.rs):
					// a Server that cannot be used puts the invalid one in
					// force, which refuses every request, rather than
					// keeping an older policy or, on a fresh port, leaving
					// it to the default once the wait ends.
					rl.WarnErr("inbound "+key, "rejected an inbound policy; every request to the port is denied until a valid one arrives", err, "port", key)
					return InboundUpdate{Server: authz.InvalidServer()}, true
				}
				return InboundUpdate{Server: s}, true
			},
			rejected: func(err error) InboundUpdate { return InboundUpdate{Err: err} },
			// Until a port's first answer, gRPC is asked why the control
			// plane cannot be reached, for the warning at the end of
			// authz's wait (inboundSource.Pending).
			probe: true,
		},
		m: make(map[string]*watch[*inboundpb.Server, InboundUpdate]),
	}
}

// workload is the source workload sent with policy watches: the one
// [WithWorkload] set, or the default.
func (c *Client) workload() string {
	if c.cfg.workload != "" {
		return c.cfg.workload
	}
	return defaultWorkload()
}

// WatchInboundPort streams the inbound policy of a port of this client's
// workload ([WithWorkload]) from the InboundServerPolicies API, with the
// semantics of the other watches: one stream per port however many watch
// it, re-established with backoff, the last good Server in force
// meanwhile; a Server that fails to convert or compile is logged
// (rate-limited) and replaced by [authz.InvalidServer], which refuses
// every request until a valid one arrives; a rejected watch ends with an
// Err.
func (c *Client) WatchInboundPort(ctx context.Context, port uint16, update func(InboundUpdate)) (func(), error) {
	return c.inbound.subscribe(c, ctx, strconv.Itoa(int(port)), update)
}

// InboundPolicies returns the client as an [authz.Source] of the Servers
// of this workload's ports, for mesh.WithInboundPolicy. A port whose
// watch cannot start, or that the control plane refuses
// (INVALID_ARGUMENT, FAILED_PRECONDITION), is answered with no Server
// (nil): the handler's default applies at once, or the last Server stays,
// rather than its requests waiting for an answer that will not come.
// It is an [authz.PendingCause]: when a port's wait ends without its
// policy, the warning names the last error met on the way to the control
// plane (a refused connection, a failed TLS handshake, a broken stream).
func (c *Client) InboundPolicies() authz.Source { return inboundSource{c} }

type inboundSource struct{ c *Client }

var _ authz.PendingCause = inboundSource{}

// Pending is the last error met on the way to the control plane, since
// its last message: why the port's policy has not come, as far as the
// client knows.
func (s inboundSource) Pending(uint16) error { return s.c.reach.get() }

func (s inboundSource) Watch(port uint16, update func(*authz.Server)) func() {
	stop, err := s.c.WatchInboundPort(s.c.ctx, port, func(u InboundUpdate) {
		update(u.Server) // nil with Err: a refused watch
	})
	if err != nil {
		s.c.log.WarnErr("inbound "+strconv.Itoa(int(port)), "cannot watch the inbound policy; keeping the default", err, "port", port)
		update(nil)
		return func() {}
	}
	return stop
}
