package mesh

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const serviceDoc = "apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: default}\nspec: {ports: [{port: 80}]}\n"

// routeDoc is an HTTPRoute of Service parent sending everything to
// Service backend.
func routeDoc(parent, backend string) string {
	return fmt.Sprintf("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: %s-route, namespace: default}\n"+
		"spec:\n  parentRefs: [{group: core, kind: Service, name: %s, port: 80}]\n  rules: [{backendRefs: [{name: %s, port: 80}]}]\n", parent, parent, backend)
}

func svcName(s string) string { return s + ".default.svc.cluster.local:80" }

// serveManifests loads docs and endpoints into a control plane and returns
// a client of it with the watch bound n (0: the default).
func serveManifests(t *testing.T, docs []string, eps map[string][]endpoint.Endpoint, n int) *destination.Client {
	t.Helper()
	cp := startControlPlane(t)
	res, err := manifest.Parse([]byte(strings.Join(docs, "---\n")))
	require.NoError(t, err)
	cp.store.SetManifests(res)
	cp.store.SetServiceProfiles(res.ServiceProfiles)
	cp.store.SetEndpoints(eps)
	opts := []destination.Option{destination.WithLogger(quiet)}
	if n > 0 {
		opts = append(opts, destination.WithMaxWatches(n))
	}
	dst, err := destination.Dial(cp.addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { dst.Close() })
	return dst
}

// A policy route's backends are concrete, as in Linkerd's proxy: only
// their endpoints are resolved. A ServiceProfile's dstOverrides of the
// backend Service apply to requests that name it, not to those a route
// sends it.
func TestRouteBackendIsConcrete(t *testing.T) {
	docs := []string{fmt.Sprintf(serviceDoc, "front"), fmt.Sprintf(serviceDoc, "back"), fmt.Sprintf(serviceDoc, "canary"),
		routeDoc("front", "back"),
		"apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: back.default.svc.cluster.local, namespace: default}\n" +
			"spec:\n  dstOverrides: [{authority: \"" + svcName("canary") + "\", weight: 100}]\n"}
	dst := serveManifests(t, docs, map[string][]endpoint.Endpoint{
		svcName("back"):   {namedApp(t, "back")},
		svcName("canary"): {namedApp(t, "canary")},
	}, 0)
	client := NewClient(WithDestination(dst), WithLogger(quiet), WithDiscoveryWait(testutil.Timeout))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: testutil.Timeout}
	for _, tc := range []struct{ name, want string }{
		{"front", "back"},  // routed to back: back's split does not apply
		{"back", "canary"}, // named: back's split applies
		{"front", "back"},  // and still not, once back's split is watched
	} {
		resp, err := hc.Get("http://" + svcName(tc.name) + "/")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, tc.want, string(body), "a request to %s", tc.name)
	}
}

// The destination client's bound on profile watches (with its headroom)
// holds the names the router watches; a route's backends, other names,
// take none. At a bound of 4, two Services routed to two others and a
// third Service with a profile make three profile watches, not five: the
// third's profile is not refused, and its route's timeout answers.
func TestRouteBackendsTakeNoProfileWatch(t *testing.T) {
	const bound = 4
	app := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Host, "slow.") {
			<-r.Context().Done() // only the profile's timeout answers
		}
	}))
	ep := []endpoint.Endpoint{{Addr: netip.MustParseAddrPort(app.Listener.Addr().String())}}
	docs := []string{fmt.Sprintf(serviceDoc, "slow"),
		"apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\nmetadata: {name: slow.default.svc.cluster.local, namespace: default}\n" +
			"spec:\n  routes: [{name: all, condition: {method: GET, pathRegex: '/.*'}, timeout: 100ms}]\n"}
	eps := map[string][]endpoint.Endpoint{svcName("slow"): ep}
	for i := range 2 {
		front, back := fmt.Sprint("front", i), fmt.Sprint("back", i)
		docs = append(docs, fmt.Sprintf(serviceDoc, front), fmt.Sprintf(serviceDoc, back), routeDoc(front, back))
		eps[svcName(back)] = ep
	}
	dst := serveManifests(t, docs, eps, bound)
	client := NewClient(WithDestination(dst), WithLogger(quiet), WithMaxAuthorities(bound), WithDiscoveryWait(testutil.Timeout))
	defer client.Close()
	get := func(name string) *http.Response {
		req, err := http.NewRequestWithContext(context.Background(), "GET", "http://"+svcName(name)+"/", nil)
		require.NoError(t, err)
		resp, err := (&http.Client{Transport: client, Timeout: testutil.Timeout}).Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	for _, name := range []string{"front0", "front1"} {
		assert.Equal(t, http.StatusOK, get(name).StatusCode, name)
	}
	assert.Equal(t, http.StatusGatewayTimeout, get("slow").StatusCode, "the profile's timeout")
	s := dst.Stats()
	assert.Zero(t, s.RejectedWatches, "%+v", s)
	assert.Equal(t, 3, s.ProfileWatches, "%+v", s)
}
