package meshgrpc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
	"github.com/inmesh/inmesh/profiles"
)

// A call that its caller's own deadline ends is no failure of its
// endpoint, as an application's deadline is not one to Linkerd's proxy:
// the proxy does not enforce a grpc-timeout, the application resets the
// stream when its deadline passes, and the breaker takes no class from a
// response future dropped before its response (linkerd2-proxy
// linkerd/http/classify/src/channel.rs, ResponseFuture). A ServiceProfile
// route's timeout is enforced above the balancer
// (linkerd/app/outbound/src/http/logical/profile.rs, NewTimeout) and is
// no failure either; a GRPCRoute's request timeout is enforced in the
// endpoint's stack, under the breaker
// (linkerd/app/outbound/src/http/endpoint.rs, EnforceTimeouts), and a
// DEADLINE_EXCEEDED the server answers is a failure by the default gRPC
// codes (linkerd/app/core/src/classify.rs, grpc_response_trailer_error).
//
// One real gRPC server, an endpoint that one failure takes out of
// rotation for an hour; the first calls of a new channel stall on the
// server until their deadline ends them. Where the end is no failure,
// three such calls reach the server and the next call is answered; where
// it is, the first trips the endpoint and the next call never reaches it.
// Before, a call whose caller's deadline passed was a failure, and so was
// one a profile route's timeout ended.
func TestDeadlineOfCallerIsNoFailure(t *testing.T) {
	const short = 50 * time.Millisecond
	for _, tc := range []struct {
		name string
		// objects are the manifests beside books' Service; profile: a
		// ServiceProfile of books bounds EmptyCall by a 50ms timeout.
		objects string
		profile bool
		// deadline is the caller's deadline of the first calls; the app
		// answers them by stalling, or with DEADLINE_EXCEEDED at once.
		deadline    time.Duration
		serverDE    bool
		wantTripped bool
	}{
		{name: "the caller's deadline", deadline: short},
		{name: "a ServiceProfile route's timeout", profile: true, deadline: testutil.Timeout},
		{name: "a GRPCRoute's request timeout", objects: `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: all, namespace: default, annotations: {timeout.linkerd.io/request: 50ms}}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - backendRefs: [{name: books, port: 7000}]
`, deadline: testutil.Timeout, wantTripped: true},
		{name: "the server answers DEADLINE_EXCEEDED", deadline: testutil.Timeout, serverDE: true, wantTripped: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stall atomic.Bool
			stall.Store(true)
			a := startApp(t, &app{handle: func(ctx context.Context, _ int64) error {
				switch {
				case !stall.Load():
					return nil
				case tc.serverDE:
					return status.Error(codes.DeadlineExceeded, "the server's own deadline")
				}
				<-ctx.Done()
				return status.FromContextError(ctx.Err()).Err()
			}}, nil)
			store := controlplane.NewStore()
			manifests(t, store, booksService+tc.objects)
			if tc.profile {
				sps, err := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  routes:
  - name: EmptyCall
    condition: {method: POST, pathRegex: /grpc\.testing\.TestService/EmptyCall}
    timeout: 50ms
`))
				require.NoError(t, err)
				store.SetServiceProfiles(sps)
			}
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
			c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithFailureAccrual(&balancer.FailureAccrual{
				ConsecutiveFailures: &balancer.ConsecutiveFailures{MaxFailures: 1, Backoff: balancer.Backoff{MinBackoff: time.Hour, MaxBackoff: time.Hour}}})))
			call := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
				defer cancel()
				_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
				return err
			}

			want := int64(3)
			if tc.wantTripped {
				want = 1
			}
			start := time.Now()
			for a.calls.Load() < want {
				require.Less(t, time.Since(start), testutil.Timeout, "calls that reached the endpoint: %d of %d", a.calls.Load(), want)
				err := call()
				require.Error(t, err)
				require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
			}
			stall.Store(false)
			if !tc.wantTripped {
				_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
				assert.NoError(t, err, "the endpoint is in rotation")
				assert.Equal(t, want+1, a.calls.Load(), "calls that reached the endpoint")
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), testutil.ShortTimeout)
			defer cancel()
			_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
			assert.Error(t, err, "the endpoint is out of rotation")
			assert.Equal(t, want, a.calls.Load(), "calls that reached the endpoint")
		})
	}
}
