package meshgrpc_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// heldSource answers every port with srv, once release is closed: a
// control plane slower than a server's first client.
type heldSource struct {
	srv     *authz.Server
	release <-chan struct{}
	wg      *sync.WaitGroup
}

func (s heldSource) Watch(_ uint16, update func(*authz.Server)) func() {
	stop := make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-s.release:
			update(s.srv)
		case <-stop:
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(stop) }) }
}

// TestInboundPolicyFirstCallWaitsForThePolicy: on a fresh gRPC server
// whose port's policy arrives only once the first call has reached the
// server, that call is judged by the policy, not the open default: a
// meshed client the policy refuses gets PERMISSION_DENIED on its first
// call, never OK, and the client it admits gets OK. Over real mTLS
// connections.
func TestInboundPolicyFirstCallWaitsForThePolicy(t *testing.T) {
	p := newPKI(t)
	for _, tc := range []struct {
		name, id string
		want     codes.Code
	}{{"refused", reviewsID, codes.PermissionDenied}, {"admitted", webID, codes.OK}} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var once sync.Once
			var wg sync.WaitGroup
			opts := meshgrpc.ServerOptions(meshgrpc.WithIdentity(p.certify(t, booksID)), meshgrpc.WithLogger(quiet),
				meshgrpc.WithInboundPolicy(authz.WithSource(heldSource{srv: booksGRPC(), release: release, wg: &wg}),
					authz.WithoutLocalhost(), authz.WithPolicyWait(testutil.Timeout)))
			// The policy arrives once the first call's stream exists.
			opts = append(opts, grpc.InTapHandle(func(ctx context.Context, _ *tap.Info) (context.Context, error) {
				once.Do(func() { close(release) })
				return ctx, nil
			}))
			srv := grpc.NewServer(opts...)
			testgrpc.RegisterTestServiceServer(srv, peerApp{})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(ln) }()
			defer func() { srv.Stop(); <-done; once.Do(func() { close(release) }); wg.Wait() }()

			cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(p.certify(t, tc.id).ClientConfig(booksID))))
			require.NoError(t, err)
			defer cc.Close()
			client := testgrpc.NewTestServiceClient(cc)
			_, err = client.UnaryCall(ctxT(t), &testgrpc.SimpleRequest{})
			assert.Equal(t, tc.want, status.Code(err), "the first call: %v", err)
			_, err = client.UnaryCall(ctxT(t), &testgrpc.SimpleRequest{})
			assert.Equal(t, tc.want, status.Code(err), "the second call: %v", err)
		})
	}
}
