package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// frontRoutes are two Services and front's HTTPRoute, which sends every
// request to back.
const frontRoutes = `apiVersion: v1
kind: Service
metadata: {name: front, namespace: default}
spec:
  ports: [{port: 7002}]
---
apiVersion: v1
kind: Service
metadata: {name: back, namespace: default}
spec:
  ports: [{port: 7002}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: front-route, namespace: default}
spec:
  parentRefs: [{group: core, kind: Service, name: front, port: 7002}]
  rules: [{backendRefs: [{name: back, port: 7002}]}]
`

// Through two sidecars, the application behind the second gets the Host
// its caller sent to the first, not the name of the backend the HTTPRoute
// sent the request to, as Linkerd's proxy leaves the authority to the
// application (linkerd/app/outbound/src/http/logical/policy/router.rs sets
// none): over HTTP/1, upgraded between the sidecars, and over HTTP/2 with
// prior knowledge.
func TestSidecarKeepsTheCallersHost(t *testing.T) {
	needCurl(t)
	bin := build(t)
	dir := t.TempDir()
	profiles, policies := filepath.Join(dir, "profiles"), filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.Mkdir(policies, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(policies, "front.yaml"), []byte(frontRoutes), 0o644))

	// The application speaks HTTP/1 and h2c, as one that receives the
	// requests that arrive as HTTP/2 must.
	seen := make(chan string, 64)
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Proto + " " + r.Host
		_, _ = io.WriteString(w, "ok")
	}))
	app.Config.Protocols = new(http.Protocols)
	app.Config.Protocols.SetHTTP1(true)
	app.Config.Protocols.SetUnencryptedHTTP2(true)
	app.Start()
	defer app.Close()
	appAddr := strings.TrimPrefix(app.URL, "http://")
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0",
		"-profiles", profiles, "-endpoints", endpoints, "-policies", policies, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)
	_, _, bIn, _ := startProxy(t, bin, dstAddr, appAddr)
	const back = "back.default.svc.cluster.local:7002"
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n", back, bIn)), 0o644))
	dst.waitLog(t, loadedEndpointsRe)
	_, aOut, _, _ := startProxy(t, bin, dstAddr, appAddr)

	for _, tc := range []struct {
		name  string
		args  []string
		proto string // as the application gets it
	}{
		{"HTTP/1", nil, "HTTP/1.1"},
		{"HTTP/2 with prior knowledge", []string{"--http2-prior-knowledge"}, "HTTP/2.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const host = "front.default.svc.cluster.local:7002"
			args := append([]string{"-H", "Host: " + host}, tc.args...)
			// Only a request the route sent to back reaches the app: front
			// has no endpoints.
			require.Eventually(t, func() bool {
				status, _, _ := curl(t, append(args, "http://"+aOut+"/")...)
				return status == http.StatusOK
			}, timeout, 50*time.Millisecond, "the HTTPRoute never routed")
			select {
			case got := <-seen:
				assert.Equal(t, tc.proto+" "+host, got)
			case <-time.After(timeout):
				t.Fatal("nothing reached the application")
			}
		})
	}
}
