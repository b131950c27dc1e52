package meshgrpc_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// slowSource answers every port with srv a delay after its watch
// starts: a control plane slower than a server's first client.
type slowSource struct {
	srv   *authz.Server
	delay time.Duration
	wg    *sync.WaitGroup
}

func (s slowSource) Watch(_ uint16, update func(*authz.Server)) func() {
	stop := make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-time.After(s.delay):
			update(s.srv)
		case <-stop:
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(stop) }) }
}

// TestInboundPolicyFirstCallWaitsForThePolicy: on a fresh gRPC server
// whose port's policy arrives 200ms after its watch starts, the first
// call is judged by the policy, not the default: with the open default, a
// meshed client the policy refuses gets PERMISSION_DENIED on its first
// call, never OK; with a deny default, the client it admits gets OK, not
// PERMISSION_DENIED. Over real mTLS connections.
func TestInboundPolicyFirstCallWaitsForThePolicy(t *testing.T) {
	p := newPKI(t)
	deny, err := authz.DefaultServer(authz.Deny, authz.DefaultOptions{})
	require.NoError(t, err)
	for _, tc := range []struct {
		name, id string
		def      *authz.Server
		want     codes.Code
	}{{"refused, open default", reviewsID, nil, codes.PermissionDenied}, {"admitted, deny default", webID, deny, codes.OK}} {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			srv := grpc.NewServer(meshgrpc.ServerOptions(meshgrpc.WithIdentity(p.certify(t, booksID)), meshgrpc.WithLogger(quiet),
				meshgrpc.WithInboundPolicy(authz.WithSource(slowSource{srv: booksGRPC(), delay: 200 * time.Millisecond, wg: &wg}),
					authz.WithoutLocalhost(), authz.WithDefault(tc.def), authz.WithPolicyWait(testutil.Timeout)))...)
			testgrpc.RegisterTestServiceServer(srv, peerApp{})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(ln) }()
			defer func() { srv.Stop(); <-done; wg.Wait() }()

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
