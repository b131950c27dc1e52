package e2e

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/mesh"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

const hedgeProfileSvc = "books.default.svc.cluster.local:7004"

// hedgeProfileManifests are the Service books and its ServiceProfile,
// whose route "GET /" hedges after 10ms with a share of 10% extra load
// (the hedge.inmesh.io annotations, on the profile).
const hedgeProfileManifests = `apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec:
  ports: [{name: http, port: 7004}]
`

const hedgeProfile = `apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: books.default.svc.cluster.local
  namespace: default
  annotations:
    hedge.inmesh.io/delay: 10ms
    hedge.inmesh.io/max-extra-load: "10%"
    hedge.inmesh.io/routes: GET /
spec:
  routes:
  - name: GET /
    condition: {method: GET, pathRegex: /}
  - name: POST /
    condition: {method: POST, pathRegex: /}
`

// Acceptance of ServiceProfile hedging through mesh.NewClient: the embedded
// control plane reads the hedge.inmesh.io annotations of a ServiceProfile,
// serves them in field 1001 of the profile's route, and the client hedges
// that route as it hedges an HTTPRoute: the same p99 and share of extra
// load as TestHedgeThroughMeshClient, against the same plain route.
func TestProfileHedgeThroughMeshClient(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies")
	profilesDir := filepath.Join(dir, "profiles")
	require.NoError(t, os.Mkdir(policies, 0o755))
	require.NoError(t, os.Mkdir(profilesDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(policies, "hedge.yaml"), []byte(hedgeManifests+"---\n"+hedgeProfileManifests), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(profilesDir, "books.yaml"), []byte(hedgeProfile), 0o644))
	h := hedgeStartEndpoints(t)
	eps := hedgeEndpointsFile(h.addrs) + "- authority: " + hedgeProfileSvc + "\n  endpoints:\n"
	for _, a := range h.addrs {
		eps += "  - addr: " + a + "\n"
	}
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte(eps), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0",
		"-endpoints", endpoints, "-policies", policies, "-profiles", profilesDir, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)

	dc, err := destination.Dial(dstAddr, destination.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer dc.Close()
	client := mesh.NewClient(mesh.WithDestination(dc), mesh.WithMeterProvider(noop.NewMeterProvider()),
		mesh.WithLogger(slog.New(slog.DiscardHandler)), mesh.WithDiscoveryWait(timeout))
	defer client.Close()

	hedgeCompare(t, h, client, "http://"+hedgePlainSvc+"/", hedgePlainSvc, "http://"+hedgeProfileSvc+"/", hedgeProfileSvc, "profile")
	e := client.Router().Explain(httptest.NewRequest(http.MethodGet, "http://"+hedgeProfileSvc+"/", nil))
	assert.Equal(t, "serviceprofile", e.Model)
	assert.Equal(t, "GET /", e.Route)
	require.NotNil(t, e.Hedge)
	assert.Equal(t, "after 10ms, at most 10% extra load, idempotent methods", e.Hedge.Policy)
	assert.True(t, e.Hedge.Budget, "the profile's retry budget bounds the hedges")
	_, wantWon := h.hedgesWanted(t, "profile-hedged/")
	assert.GreaterOrEqual(t, e.Hedge.Won, uint64(wantWon), "and the hedge won")
	post := client.Router().Explain(httptest.NewRequest(http.MethodPost, "http://"+hedgeProfileSvc+"/", nil))
	assert.Equal(t, "POST /", post.Route)
	assert.Nil(t, post.Hedge, "a route hedge.inmesh.io/routes does not name")
}
