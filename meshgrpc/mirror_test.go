package meshgrpc_test

import (
	"context"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
)

const shadow = "shadow.default.svc.cluster.local:7001"

// mirrorRoute mirrors EmptyCall to the Service shadow (share: the
// requestMirror's percent or fraction YAML, empty for every call).
func mirrorRoute(share string) string {
	return `
---
apiVersion: v1
kind: Service
metadata: {name: shadow, namespace: default}
spec: {ports: [{port: 7001}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: mirrored, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: EmptyCall}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-mirrored-by, value: inmesh}]}
    - type: RequestMirror
      requestMirror: {backendRef: {name: shadow, port: 7001}` + share + `}
    backendRefs: [{name: books, port: 7000}]
`
}

// mirrorCount is outbound_grpc_route_mirror_requests_total of the
// mirrored route for result, 0 when absent.
func mirrorCount(t *testing.T, m *testutil.Metrics, result string) int {
	t.Helper()
	v := m.Value(t, "outbound_grpc_route_mirror_requests_total", `route_name="mirrored"`, `backend_name="shadow"`, `result="`+result+`"`)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err)
	return n
}

// mirrorCopies is the number of copies counted, whatever their result.
func mirrorCopies(t *testing.T, m *testutil.Metrics) int {
	t.Helper()
	n := 0
	for _, r := range []string{"success", "failure", "unavailable", "dropped"} {
		n += mirrorCount(t, m, r)
	}
	return n
}

// A GRPCRoute's RequestMirror copies a unary call to the mirror Service
// through the same channel: the mirror gets each call (with the rule's
// header modifiers), a share mirrors about that share, and the primary's
// answers are the caller's, whether the mirror answers, stalls or is
// down. Every copy is counted on outbound_grpc_route_mirror_requests_total
// by result.
func TestUnaryMirror(t *testing.T) {
	const calls = 200
	for _, tc := range []struct {
		name   string
		share  string
		mirror string // "up", "slow" or "down"
		// lockstep waits for the mirror to get each copy before the next
		// call: copies in flight stay far below the route's bound, so a
		// loaded machine that answers the mirror late drops none.
		lockstep bool
		// settle waits for each copy to be counted before the next call:
		// the first copy to a mirror that is down waits in the balancer's
		// queue for the failfast timeout, and the backoff it starts
		// decides the copies after it.
		settle bool
		check  func(t *testing.T, m *testutil.Metrics, mirror *app)
	}{
		{name: "every call", mirror: "up", lockstep: true, check: func(t *testing.T, m *testutil.Metrics, mirror *app) {
			if !assert.Eventually(t, func() bool { return mirrorCount(t, m, "success") == calls }, testutil.Timeout, 5*time.Millisecond) {
				t.Fatalf("success %d dropped %d failure %d unavailable %d, mirror saw %d", mirrorCount(t, m, "success"), mirrorCount(t, m, "dropped"),
					mirrorCount(t, m, "failure"), mirrorCount(t, m, "unavailable"), mirror.calls.Load())
			}
			assert.EqualValues(t, calls, mirror.calls.Load(), "the mirror gets every call")
		}},
		{name: "half the calls", share: ", percent: 50", mirror: "up", check: func(t *testing.T, m *testutil.Metrics, mirror *app) {
			require.Eventually(t, func() bool {
				return int64(mirrorCount(t, m, "success")) == mirror.calls.Load() && mirror.calls.Load() > 0
			},
				testutil.Timeout, 5*time.Millisecond)
			n := mirror.calls.Load()
			t.Logf("mirrored %d of %d", n, calls)
			assert.InDelta(t, calls/2, n, 30, "about half (more than 4 standard deviations allowed)")
		}},
		{name: "a stalled mirror: copies past the bound are dropped", mirror: "slow", check: func(t *testing.T, m *testutil.Metrics, mirror *app) {
			require.Eventually(t, func() bool { return mirrorCount(t, m, "dropped") > 0 }, testutil.Timeout, 5*time.Millisecond)
			t.Logf("dropped %d of %d", mirrorCount(t, m, "dropped"), calls)
		}},
		{name: "a mirror that is down is backed off", mirror: "down", settle: true, check: func(t *testing.T, m *testutil.Metrics, _ *app) {
			require.Eventually(t, func() bool { return mirrorCount(t, m, "failure") > 0 && mirrorCount(t, m, "unavailable") > 0 },
				testutil.Timeout, 5*time.Millisecond)
			t.Logf("failed %d, backed off %d of %d", mirrorCount(t, m, "failure"), mirrorCount(t, m, "unavailable"), calls)
			assert.Less(t, mirrorCount(t, m, "failure"), calls/2, "the backoff spares most calls a copy")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := startApp(t, &app{}, nil)
			stall := make(chan struct{})
			t.Cleanup(func() { close(stall) })
			mirror := &app{}
			if tc.mirror == "slow" {
				mirror.handle = func(ctx context.Context, _ int64) error {
					select {
					case <-ctx.Done():
					case <-stall:
					}
					return nil
				}
			}
			var mirrorAddr netip.AddrPort
			if tc.mirror == "down" {
				mirrorAddr = testutil.RefusedAddr(t)
			} else {
				mirrorAddr = startApp(t, mirror, nil).addr
			}
			c, m := policyChannel(t, mirrorRoute(tc.share), map[string][]endpoint.Endpoint{
				books: {{Addr: primary.addr}}, shadow: {{Addr: mirrorAddr}}})
			for i := range calls {
				_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
				require.NoError(t, err, "the primary answers")
				if tc.lockstep {
					require.Eventually(t, func() bool { return mirror.calls.Load() >= int64(i+1) }, testutil.Timeout, time.Millisecond,
						"the mirror gets call %d", i)
				}
				if tc.settle {
					require.Eventually(t, func() bool { return mirrorCopies(t, m) >= i+1 }, testutil.Timeout, time.Millisecond,
						"the copy of call %d is counted", i)
				}
			}
			assert.EqualValues(t, calls, primary.calls.Load(), "the primary gets every call once")
			assert.Equal(t, strconv.Itoa(calls), m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="mirrored"`, `grpc_status="OK"`))
			tc.check(t, m, mirror)
		})
	}
}
