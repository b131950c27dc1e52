package mesh

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// splitDocs are the manifests of TestFirstRequestToAClusterIPTakesItsProfileSplit:
// the Services shelves (clusterIP 127.0.0.79) and racks (127.0.0.80), with
// no endpoints of their own, whose ServiceProfiles override them to
// authors, and to authors and editors by equal weights; authors and
// editors have endpoints.
var splitDocs = []string{
	fmt.Sprintf(serviceDoc, "authors"), fmt.Sprintf(serviceDoc, "editors"),
	"apiVersion: v1\nkind: Service\nmetadata: {name: shelves, namespace: default}\nspec: {clusterIP: 127.0.0.79, ports: [{port: 80}]}\n",
	"apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: shelves.default.svc.cluster.local, namespace: default}\n" +
		"spec:\n  dstOverrides: [{authority: \"" + svcName("authors") + "\", weight: 100}]\n",
	"apiVersion: v1\nkind: Service\nmetadata: {name: racks, namespace: default}\nspec: {clusterIP: 127.0.0.80, ports: [{port: 80}]}\n",
	"apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: racks.default.svc.cluster.local, namespace: default}\n" +
		"spec:\n  dstOverrides: [{authority: \"" + svcName("authors") + "\", weight: 50}, {authority: \"" + svcName("editors") + "\", weight: 50}]\n",
}

// The first request of a fresh client to a Service's clusterIP whose
// ServiceProfile overrides it to other Services goes to those Services'
// endpoints, as Linkerd's proxy builds the backends of a clusterIP's
// logical stack from the dst overrides of the profile it got for the
// clusterIP (linkerd/app/outbound/src/http/logical/profile.rs, Params
// from Routes), never to the clusterIP's Service, which has no endpoints:
// the client's discovery wait for the clusterIP's profile is all it waits
// for. A split of two weighted overrides sends to both.
func TestFirstRequestToAClusterIPTakesItsProfileSplit(t *testing.T) {
	seen := make(chan string, 8)
	backend := func(name string) endpoint.Endpoint {
		server := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen <- r.Proto + " " + name }),
			WithMeterProvider(noop.NewMeterProvider()), WithLogger(quiet))
		t.Cleanup(server.Close)
		return endpoint.Endpoint{Addr: serveMeshed(t, server), Weight: endpoint.DefaultWeight, H2: true}
	}
	cp := startControlPlane(t)
	res, err := manifest.Parse([]byte(strings.Join(splitDocs, "---\n")))
	require.NoError(t, err)
	cp.store.SetManifests(res)
	cp.store.SetServiceProfiles(res.ServiceProfiles)
	cp.store.SetEndpoints(map[string][]endpoint.Endpoint{
		svcName("authors"): {backend("authors")}, svcName("editors"): {backend("editors")},
	})

	for _, proto := range []struct {
		name string
		h2   bool // the caller sends HTTP/2 (prior knowledge)
		want string
	}{
		{"HTTP/1", false, "HTTP/1.1"},
		{"HTTP/2", true, "HTTP/2.0"},
	} {
		t.Run(proto.name, func(t *testing.T) {
			// get sends GET url through client and returns the status, and
			// the backend the app told of when it answered.
			get := func(t *testing.T, client *Client, url string) (int, string) {
				t.Helper()
				req, err := http.NewRequest(http.MethodGet, url, nil)
				require.NoError(t, err)
				if proto.h2 {
					req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/2.0", 2, 0
				}
				resp, err := (&http.Client{Transport: client, Timeout: testutil.Timeout}).Do(req)
				require.NoError(t, err)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return resp.StatusCode, string(body)
				}
				return resp.StatusCode, receive(t, seen)
			}

			t.Run("one override", func(t *testing.T) {
				client := loopbackClient(t, dialLoopback(t, cp.addr), nil)
				code, got := get(t, client, "http://127.0.0.79/")
				require.Equal(t, http.StatusOK, code, "the first request: %s", got)
				assert.Equal(t, proto.want+" authors", got)
			})

			t.Run("two weighted overrides", func(t *testing.T) {
				client := loopbackClient(t, dialLoopback(t, cp.addr), nil)
				got := map[string]bool{}
				for n, deadline := 1, time.Now().Add(testutil.Timeout); len(got) < 2 && time.Now().Before(deadline); n++ {
					code, backend := get(t, client, "http://127.0.0.80/")
					require.Equal(t, http.StatusOK, code, "request %d: %s", n, backend)
					got[backend] = true
				}
				assert.Equal(t, map[string]bool{proto.want + " authors": true, proto.want + " editors": true}, got)
			})
		})
	}
}
