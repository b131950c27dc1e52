package mesh

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
)

// A request that its caller's own deadline ends is no failure of its
// endpoint, and neither is one a ServiceProfile route's timeout ends:
// Linkerd's proxy enforces that timeout above its balancer
// (linkerd2-proxy linkerd/app/outbound/src/http/logical/profile.rs,
// NewTimeout), and its breaker takes no class from a response future
// dropped before its response (linkerd/http/classify/src/channel.rs,
// ResponseFuture). An HTTPRoute's request, response, idle and retry
// timeouts are enforced in the endpoint's stack, under the breaker
// (linkerd/app/outbound/src/http/endpoint.rs, EnforceTimeouts; their
// error is Class::Error, a failure, linkerd/app/core/src/classify.rs),
// also on a response body after its head (channel.rs, ResponseBody). The
// rows of meshgrpc's TestDeadlineOfCallerIsNoFailure, over HTTP/1 and
// HTTP/2.
//
// One real server, an endpoint that one failure takes out of rotation for
// an hour; the first requests of a fresh client stall on the server
// (before their response head, or after it) until their deadline or a
// timeout ends them. Where the end is no failure, three such requests
// reach the server and the next is answered; where it is, the first trips
// the endpoint and the next never reaches it (nor does the retry of a
// retry timeout's attempt). Before, the balancer took
// every request whose context ended for given up, an HTTPRoute's timeouts
// included.
func TestRouteTimeoutIsFailureOfItsEndpoint(t *testing.T) {
	const short = 50 * time.Millisecond
	for _, tc := range []struct {
		name string
		// docs are the manifests beside books' Service.
		docs string
		// deadline is the caller's deadline of the first requests; the
		// app stalls them before their head, after it (headFirst), or
		// answers them 504 at once (serverFails).
		deadline    time.Duration
		headFirst   bool
		serverFails bool
		wantTripped bool
	}{
		{name: "the caller's deadline", deadline: short},
		{name: "the caller's deadline after the head", deadline: short, headFirst: true},
		{name: "a ServiceProfile route's timeout", deadline: testutil.Timeout, docs: `
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  routes: [{name: all, condition: {pathRegex: '/.*'}, timeout: 50ms}]
`},
		{name: "an HTTPRoute's request timeout", deadline: testutil.Timeout, wantTripped: true,
			docs: httpRouteDoc(`{timeout.linkerd.io/request: 50ms}`)},
		{name: "an HTTPRoute's request timeout after the head", deadline: testutil.Timeout, headFirst: true, wantTripped: true,
			docs: httpRouteDoc(`{timeout.linkerd.io/request: 50ms}`)},
		{name: "an HTTPRoute's response timeout after the head", deadline: testutil.Timeout, headFirst: true, wantTripped: true,
			docs: httpRouteDoc(`{timeout.linkerd.io/response: 50ms}`)},
		{name: "an HTTPRoute's idle timeout after the head", deadline: testutil.Timeout, headFirst: true, wantTripped: true,
			docs: httpRouteDoc(`{timeout.linkerd.io/idle: 50ms}`)},
		// The retry's timeout ends the first attempt; the retry finds the
		// endpoint out of rotation and waits until the caller gives up.
		{name: "an HTTPRoute's retry timeout", deadline: time.Second, wantTripped: true,
			docs: httpRouteDoc(`{retry.linkerd.io/http: 5xx, retry.linkerd.io/limit: "1", retry.linkerd.io/timeout: 50ms}`)},
		{name: "the server answers 504", deadline: testutil.Timeout, serverFails: true, wantTripped: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
				var stall atomic.Bool
				var calls atomic.Int64
				stall.Store(true)
				app := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					calls.Add(1)
					switch {
					case !stall.Load():
						_, _ = io.WriteString(w, "answered")
						return
					case tc.serverFails:
						w.WriteHeader(http.StatusGatewayTimeout)
						return
					case tc.headFirst:
						w.WriteHeader(http.StatusOK)
						w.(http.Flusher).Flush()
					}
					<-r.Context().Done()
				}))
				cp := startControlPlane(t)
				docs := fmt.Sprintf(serviceDoc, "books")
				if tc.docs != "" {
					docs += "---\n" + tc.docs
				}
				res, err := manifest.Parse([]byte(docs))
				require.NoError(t, err)
				cp.store.SetManifests(res)
				cp.store.SetServiceProfiles(res.ServiceProfiles)
				cp.store.SetEndpoints(map[string][]endpoint.Endpoint{
					svcName("books"): {{Addr: netip.MustParseAddrPort(app.Listener.Addr().String()), Weight: endpoint.DefaultWeight}},
				})
				client := loopbackClient(t, dialLoopback(t, cp.addr), nil,
					WithBalancerOptions(balancer.WithFailureAccrual(&balancer.FailureAccrual{ConsecutiveFailures: &balancer.ConsecutiveFailures{
						MaxFailures: 1, Backoff: balancer.Backoff{MinBackoff: time.Hour, MaxBackoff: time.Hour}}})))
				hc := &http.Client{Transport: client}
				// send sends a request under timeout and reports whether it
				// was answered in full with a 200.
				send := func(timeout time.Duration) bool {
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					defer cancel()
					req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+svcName("books")+"/", nil)
					require.NoError(t, err)
					if mode == testutil.H2C {
						req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/2.0", 2, 0
					}
					resp, err := hc.Do(req)
					if err != nil {
						return false
					}
					defer resp.Body.Close()
					b, err := io.ReadAll(resp.Body)
					return err == nil && resp.StatusCode == http.StatusOK && string(b) == "answered"
				}

				if tc.wantTripped {
					// The first request's end trips the endpoint, also
					// when a timeout ends it before the app has it (its
					// connection is dialled under the timeout).
					require.False(t, send(tc.deadline), "a request the app stalls is not answered")
					stall.Store(false)
					reached := calls.Load()
					require.LessOrEqual(t, reached, int64(1), "requests that reached the endpoint")
					assert.False(t, send(testutil.ShortTimeout), "the endpoint is out of rotation")
					assert.Equal(t, reached, calls.Load(), "requests that reached the endpoint")
					return
				}
				const want = 3
				start := time.Now()
				for calls.Load() < want {
					require.Less(t, time.Since(start), testutil.Timeout, "requests that reached the endpoint: %d of %d", calls.Load(), want)
					require.False(t, send(tc.deadline), "a request the app stalls is not answered")
				}
				stall.Store(false)
				assert.True(t, send(testutil.Timeout), "the endpoint is in rotation")
				assert.Equal(t, int64(want+1), calls.Load(), "requests that reached the endpoint")
			})
		})
	}
}

// httpRouteDoc is an HTTPRoute of books with annotations, sending
// everything to books.
func httpRouteDoc(annotations string) string {
	return `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: books-route, namespace: default, annotations: ` + annotations + `}
spec:
  parentRefs: [{group: core, kind: Service, name: books, port: 80}]
  rules: [{backendRefs: [{name: books, port: 80}]}]
`
}
