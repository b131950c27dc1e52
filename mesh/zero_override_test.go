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
)

// Linkerd's profile_dst_overrides cases
// (linkerd/app/integration/src/tests/profile_dst_overrides.rs), against a
// Service whose HTTPRoute sends its traffic to another: the apex Service
// front (clusterIP 127.0.0.82) routed to back, and the leaf Services
// leaf-a and leaf-b. While the ServiceProfile of front has dst overrides
// of a weight above 0, they split the traffic; overrides of weight 0 take
// none, and a profile whose overrides all have weight 0 and which has no
// routes does not win over the HTTPRoute, as Linkerd's proxy drops them
// when it reads the profile (linkerd/service-profiles/src/proto.rs,
// convert_dst_override) and lets a profile override the policy only when
// it has routes or targets (linkerd/app/outbound/src/http/logical/profile.rs,
// should_override_policy). Linkerd's test sends the requests of that
// stage to the apex, the backend of the default policy; here the policy
// is the HTTPRoute, so they go to back, never to front itself.
func TestServiceProfileDstOverridesAgainstAnHTTPRoute(t *testing.T) {
	docs := []string{fmt.Sprintf(serviceDoc, "back"), fmt.Sprintf(serviceDoc, "leaf-a"), fmt.Sprintf(serviceDoc, "leaf-b"),
		"apiVersion: v1\nkind: Service\nmetadata: {name: front, namespace: default}\nspec: {clusterIP: 127.0.0.82, ports: [{port: 80}]}\n",
		routeDoc("front", "back"),
	}
	cp := startControlPlane(t)
	res, err := manifest.Parse([]byte(strings.Join(docs, "---\n")))
	require.NoError(t, err)
	cp.store.SetManifests(res)
	cp.store.SetEndpoints(map[string][]endpoint.Endpoint{
		svcName("front"): {namedApp(t, "front")}, svcName("back"): {namedApp(t, "back")},
		svcName("leaf-a"): {namedApp(t, "leaf-a")}, svcName("leaf-b"): {namedApp(t, "leaf-b")},
	})
	// setOverrides sets the ServiceProfile of front to the overrides
	// (none: a profile without overrides or routes).
	setOverrides := func(t *testing.T, overrides ...string) {
		t.Helper()
		doc := "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: front.default.svc.cluster.local, namespace: default}\nspec:\n"
		if len(overrides) > 0 {
			doc += "  dstOverrides: [" + strings.Join(overrides, ", ") + "]\n"
		} else {
			doc += "  routes: []\n"
		}
		res, err := manifest.Parse([]byte(doc))
		require.NoError(t, err)
		cp.store.SetServiceProfiles(res.ServiceProfiles)
	}
	override := func(name string, weight int) string {
		return fmt.Sprintf("{authority: %q, weight: %d}", svcName(name), weight)
	}

	for _, target := range []struct{ name, url string }{
		{"name", "http://" + svcName("front") + "/"},
		{"clusterIP", "http://127.0.0.82/"},
	} {
		t.Run(target.name, func(t *testing.T) {
			client := loopbackClient(t, dialLoopback(t, cp.addr), nil)
			hc := &http.Client{Transport: client, Timeout: testutil.Timeout}
			// count sends n requests and counts the apps that answered.
			count := func(t *testing.T, n int) map[string]int {
				t.Helper()
				got := map[string]int{}
				for range n {
					resp, err := hc.Get(target.url)
					require.NoError(t, err)
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					got[string(body)]++
				}
				return got
			}
			for _, stage := range []struct {
				name      string // the case of profile_dst_overrides.rs
				overrides []string
				want      []string // the apps that answer, each at least once
			}{
				{"add_a_dst_override", []string{override("leaf-a", 10000)}, []string{"leaf-a"}},
				{"add_multiple_dst_overrides", []string{override("leaf-a", 5000), override("leaf-b", 5000)}, []string{"leaf-a", "leaf-b"}},
				{"set_a_dst_override_weight_to_zero", []string{override("leaf-a", 0), override("leaf-b", 5000)}, []string{"leaf-b"}},
				{"set_all_dst_override_weights_to_zero", []string{override("leaf-a", 0), override("leaf-b", 0)}, []string{"back"}},
				{"add_a_dst_override again", []string{override("leaf-a", 10000)}, []string{"leaf-a"}},
				{"remove_a_dst_override", nil, []string{"back"}},
			} {
				setOverrides(t, stage.overrides...)
				want := map[string]bool{}
				for _, w := range stage.want {
					want[w] = true
				}
				// The profile reaches the client in its own time: wait
				// until the wanted apps, and only they, answer; then count.
				settled := func(got map[string]int) bool {
					for app := range got {
						if !want[app] {
							return false
						}
					}
					return len(got) == len(want)
				}
				last := count(t, 20)
				for deadline := time.Now().Add(testutil.Timeout); !settled(last) && time.Now().Before(deadline); {
					last = count(t, 20)
				}
				require.True(t, settled(last), "%s: the apps that answered: %v", stage.name, last)
				got := count(t, 40)
				for app := range got {
					assert.True(t, want[app], "%s: %s answered (%v)", stage.name, app, got)
				}
				for app := range want {
					assert.Positive(t, got[app], "%s: %s never answered (%v)", stage.name, app, got)
				}
			}
		})
	}
}
