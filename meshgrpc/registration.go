package meshgrpc

import (
	"context"
	"net"

	"google.golang.org/grpc"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/registration"
)

// Register registers the grpc-go server listening on lis with the control
// plane on conn (registration.Dial) as an endpoint of each of eps'
// authorities, in the background (see registration.Register): an endpoint
// without an address gets lis's, and every one the h2 hint. With local,
// the first attempt waits for its first certificate. Stop the server with
// [GracefulStop], which deregisters first.
func Register(lis net.Listener, local *identity.Local, conn grpc.ClientConnInterface, eps []registration.Endpoint, opts ...registration.Option) (*registration.Registration, error) {
	if local != nil {
		opts = append([]registration.Option{registration.WithReady(local.Ready())}, opts...)
	}
	return registration.Register(context.Background(), conn, registration.AtListener(eps, lis.Addr()), opts...)
}

// GracefulStop deregisters reg (nil: none), waits registration's
// DefaultDrainDelay for peers to stop picking the server, then stops srv
// gracefully; past ctx it stops srv at once. Peers thus stop sending
// before the listener closes.
func GracefulStop(ctx context.Context, srv *grpc.Server, reg *registration.Registration) {
	if reg != nil {
		_ = reg.Drain(ctx, registration.DefaultDrainDelay)
	}
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		srv.Stop()
		<-stopped
	}
}
