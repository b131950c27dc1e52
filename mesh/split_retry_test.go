package mesh

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// splitRetryDocs are the manifests of TestRetryOfASplitRequestDrawsItsBackendAgain:
// the Service cabinets (clusterIP 127.0.0.81, no endpoints of its own),
// whose ServiceProfile retries every request within a budget and splits
// its traffic evenly between the Services broken and working.
var splitRetryDocs = []string{
	fmt.Sprintf(serviceDoc, "broken"), fmt.Sprintf(serviceDoc, "working"),
	"apiVersion: v1\nkind: Service\nmetadata: {name: cabinets, namespace: default}\nspec: {clusterIP: 127.0.0.81, ports: [{port: 80}]}\n",
	"apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: cabinets.default.svc.cluster.local, namespace: default}\n" +
		"spec:\n" +
		"  routes: [{name: all, condition: {pathRegex: '/.*'}, isRetryable: true}]\n" +
		"  retryBudget: {retryRatio: 2, minRetriesPerSecond: 1, ttl: 10s}\n" +
		"  dstOverrides: [{authority: \"" + svcName("broken") + "\", weight: 50}, {authority: \"" + svcName("working") + "\", weight: 50}]\n",
}

// A retry of a request whose ServiceProfile splits its traffic draws its
// backend again, as Linkerd's proxy retries a profile route above the
// distribution over the profile's targets
// (linkerd/app/outbound/src/http/logical/profile.rs, RouteParams::layer:
// the retry layer wraps NewDistribute, whose random selection draws for
// each call). With one backend Service that always answers 503 and one
// that answers 200, evenly split, nearly every request succeeds: a
// request that drew the broken Service is retried, and its retries reach
// the working one. Were the backend drawn once per request, about half
// of them would fail, every retry going to the broken Service again.
func TestRetryOfASplitRequestDrawsItsBackendAgain(t *testing.T) {
	backend := func(status int) endpoint.Endpoint {
		server := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }),
			WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
		t.Cleanup(server.Close)
		return endpoint.Endpoint{Addr: serveMeshed(t, server), Weight: endpoint.DefaultWeight, H2: true}
	}
	cp := startControlPlane(t)
	res, err := manifest.Parse([]byte(strings.Join(splitRetryDocs, "---\n")))
	require.NoError(t, err)
	cp.store.SetManifests(res)
	cp.store.SetServiceProfiles(res.ServiceProfiles)
	cp.store.SetEndpoints(map[string][]endpoint.Endpoint{
		svcName("broken"): {backend(http.StatusServiceUnavailable)}, svcName("working"): {backend(http.StatusOK)},
	})

	const requests = 200
	for _, tc := range []struct {
		name string
		url  string
		h2   bool // the caller sends HTTP/2 (prior knowledge)
	}{
		{"clusterIP/HTTP/1", "http://127.0.0.81/", false},
		{"clusterIP/HTTP/2", "http://127.0.0.81/", true},
		{"name/HTTP/1", "http://" + svcName("cabinets") + "/", false},
		{"name/HTTP/2", "http://" + svcName("cabinets") + "/", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := loopbackClient(t, dialLoopback(t, cp.addr), nil)
			hc := &http.Client{Transport: client, Timeout: testutil.Timeout}
			ok := 0
			for range requests {
				req, err := http.NewRequest(http.MethodGet, tc.url, nil)
				require.NoError(t, err)
				if tc.h2 {
					req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/2.0", 2, 0
				}
				resp, err := hc.Do(req)
				require.NoError(t, err)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ok++
				}
			}
			// Drawn per attempt, a request fails only when its first
			// attempt and every retry the budget allows drew the broken
			// Service: a few in 200 at most. Drawn once, about 100 fail
			// (fewer than 180 succeed with a probability above 1-1e-20).
			assert.GreaterOrEqual(t, ok, requests*9/10, "requests that succeeded of %d", requests)
		})
	}
}
