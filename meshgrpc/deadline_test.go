package meshgrpc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// A call that its caller's own deadline ends is no failure of its
// endpoint, as an application's deadline is not one to Linkerd's proxy:
// the proxy does not enforce a grpc-timeout, the application resets the
// stream when its deadline passes, and the breaker takes no class from a
// response future dropped before its response (linkerd2-proxy
// linkerd/http/classify/src/channel.rs, ResponseFuture). A ServiceProfile
// route's timeout is enforced above the balancer
// (linkerd/app/outbound/src/http/logical/profile.rs, NewTimeout) and is
// no failure either; a GRPCRoute's request timeout, and on a stream its
// response and idle timeouts, are enforced in the endpoint's stack, under
// the breaker (linkerd/app/outbound/src/http/endpoint.rs,
// EnforceTimeouts), whose class of their error is a failure
// (linkerd/app/core/src/classify.rs, Class::Error; on a stream's body
// after its headers too, linkerd/http/classify/src/channel.rs,
// ResponseBody), and a DEADLINE_EXCEEDED the server answers is a failure
// by the default gRPC codes (classify.rs, grpc_response_trailer_error).
//
// One real gRPC server, an endpoint that one failure takes out of
// rotation for an hour; the first calls of a new channel stall on the
// server until their deadline ends them. Where the end is no failure,
// three such calls reach the server and the next call is answered; where
// it is, the first trips the endpoint and the next call never reaches it.
// Before, a call whose caller's deadline passed was a failure, and so was
// one a profile route's timeout ended; a stream a GRPCRoute's response or
// idle timeout ended was none.
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
		// stream: the first calls are streams (StreamingOutputCall)
		// stalling before their response headers, or after them when
		// headers is set.
		stream, headers bool
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
		{name: "the caller's deadline on a stream", deadline: short, stream: true},
		{name: "a ServiceProfile route's timeout on a stream", profile: true, deadline: testutil.Timeout, stream: true},
		{name: "a GRPCRoute's response timeout on a stream", objects: grpcRouteAnnotated(`{timeout.linkerd.io/response: 50ms}`),
			deadline: testutil.Timeout, stream: true, wantTripped: true},
		{name: "a GRPCRoute's idle timeout on a stream", objects: grpcRouteAnnotated(`{timeout.linkerd.io/idle: 50ms}`),
			deadline: testutil.Timeout, stream: true, wantTripped: true},
		{name: "the caller's deadline on a stream after its headers", deadline: short, stream: true, headers: true},
		{name: "a GRPCRoute's response timeout on a stream after its headers", objects: grpcRouteAnnotated(`{timeout.linkerd.io/response: 50ms}`),
			deadline: testutil.Timeout, stream: true, headers: true, wantTripped: true},
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
				case tc.headers:
					if err := grpc.SendHeader(ctx, metadata.MD{}); err != nil {
						return err
					}
				}
				<-ctx.Done()
				return status.FromContextError(ctx.Err()).Err()
			}}, nil)
			store := controlplane.NewStore()
			manifests(t, store, booksService+tc.objects)
			if tc.profile {
				setProfiles(t, store, `
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  routes:
  - name: TestService
    condition: {method: POST, pathRegex: /grpc\.testing\.TestService/(EmptyCall|StreamingOutputCall)}
    timeout: 50ms
`)
			}
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {{Addr: a.addr}}})
			c := dial(t, serveStore(t, store), meshgrpc.WithBalancerOptions(balancer.WithFailureAccrual(&balancer.FailureAccrual{
				ConsecutiveFailures: &balancer.ConsecutiveFailures{MaxFailures: 1, Backoff: balancer.Backoff{MinBackoff: time.Hour, MaxBackoff: time.Hour}}})))
			call := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
				defer cancel()
				if tc.stream {
					s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
					if err != nil {
						return err
					}
					_, err = s.Recv()
					return err
				}
				_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
				return err
			}

			if tc.wantTripped {
				// One call trips the endpoint. On a loaded machine the
				// route's 50ms timer may end it before the server's
				// handler has seen it: a failure all the same.
				err := call()
				require.Error(t, err)
				require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
				stall.Store(false)
				ctx, cancel := context.WithTimeout(context.Background(), testutil.ShortTimeout)
				defer cancel()
				_, err = c.EmptyCall(ctx, &testgrpc.Empty{})
				assert.Error(t, err, "the endpoint is out of rotation")
				assert.LessOrEqual(t, a.calls.Load(), int64(1), "calls that reached the endpoint")
				return
			}
			const want = 3
			start := time.Now()
			for a.calls.Load() < want {
				require.Less(t, time.Since(start), testutil.Timeout, "calls that reached the endpoint: %d of %d", a.calls.Load(), want)
				err := call()
				require.Error(t, err)
				require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
			}
			stall.Store(false)
			_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
			assert.NoError(t, err, "the endpoint is in rotation")
			assert.Equal(t, int64(want+1), a.calls.Load(), "calls that reached the endpoint")
		})
	}
}

// grpcRouteAnnotated is a GRPCRoute of books with annotations, sending
// every call to books.
func grpcRouteAnnotated(annotations string) string {
	return `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: all, namespace: default, annotations: ` + annotations + `}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - backendRefs: [{name: books, port: 7000}]
`
}
