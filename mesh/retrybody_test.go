package mesh

import (
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// A retried route whose server answers before it has the request body (a
// 503 at once) retries at once over the meshed HTTP/2 connection. The
// transport closes the body of the first attempt it can no longer send and
// waits for the read under way, and discarding the 503 to retry waits for
// the transport: a read that waited on for its source held the request
// until the route's timeout. In the demo one request in a few hundred
// took the Service's 2 s; here every first attempt's body stalls after its
// first bytes, as a client's body does while it is still being sent.
func TestRetryOfAnEarlyAnswerDoesNotWaitForTheTimeout(t *testing.T) {
	const service = `apiVersion: v1
kind: Service
metadata: {name: flaky, namespace: default, annotations: {timeout.linkerd.io/request: 5s}}
spec: {ports: [{port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: flaky, namespace: default, annotations: {retry.linkerd.io/http: 5xx, retry.linkerd.io/limit: "3"}}
spec:
  parentRefs: [{group: core, kind: Service, name: flaky, port: 80}]
  rules: [{backendRefs: [{name: flaky, port: 80}]}]
`
	const body = `{"title":"dune"}`
	var mu sync.Mutex
	seen := map[string]bool{}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		first := !seen[r.Header.Get("X-Id")]
		seen[r.Header.Get("X-Id")] = true
		mu.Unlock()
		if first {
			w.WriteHeader(http.StatusServiceUnavailable) // before the body is read
			return
		}
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	})
	addr := netip.MustParseAddrPort(meshInbound(t, app))
	dst := serveManifests(t, []string{service}, map[string][]endpoint.Endpoint{svcName("flaky"): {{Addr: addr, H2: true}}}, 0)
	client := NewClient(WithDestination(dst), WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet), WithDiscoveryWait(testutil.Timeout))
	t.Cleanup(client.Close)

	stalled := make(chan struct{})
	defer close(stalled)
	for i := range 3 {
		req, err := http.NewRequest("POST", "http://"+svcName("flaky")+"/", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-Id", strconv.Itoa(i))
		// The first attempt's body: its first bytes, then nothing until
		// the test ends. Retries take a copy from GetBody.
		req.Body = io.NopCloser(io.MultiReader(strings.NewReader(body[:5]), stallReader(stalled)))
		resp, err := client.RoundTrip(req)
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d: %s", i, got)
		assert.Equal(t, body, string(got), "the retry sent the whole body")
	}
}

// stallReader blocks every read until ch is closed, then ends.
type stallReader chan struct{}

func (s stallReader) Read([]byte) (int, error) {
	<-s
	return 0, io.EOF
}
