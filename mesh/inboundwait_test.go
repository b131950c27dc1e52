package mesh

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// callersManifests are the policy of the books pod's port: one Server
// whose only authorization admits clients from 127.0.0.3.
func callersManifests(port uint16) string {
	return fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: default, labels: {app: books}}
spec:
  containers: [{name: books, ports: [{name: http, containerPort: %d}]}]
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: books-http, namespace: default}
spec:
  podSelector: {matchLabels: {app: books}}
  port: http
---
apiVersion: policy.linkerd.io/v1alpha1
kind: NetworkAuthentication
metadata: {name: callers, namespace: default}
spec:
  networks: [{cidr: 127.0.0.3/32}]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: books-callers, namespace: default}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: books-http}
  requiredAuthenticationRefs: [{group: policy.linkerd.io, kind: NetworkAuthentication, name: callers}]
`, port)
}

// heldInboundControlPlane is the embedded control plane serving manifests
// whose InboundServerPolicies streams start answering only once release
// is closed: a control plane slower than a server's first client.
func heldInboundControlPlane(t *testing.T, manifests string, release <-chan struct{}) string {
	t.Helper()
	store := controlplane.NewStore()
	r, err := manifest.Parse([]byte(manifests))
	require.NoError(t, err)
	store.SetManifests(r)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if strings.HasSuffix(info.FullMethod, "/WatchPort") {
			select {
			case <-release:
			case <-ss.Context().Done():
				return ss.Context().Err()
			}
		}
		return h(srv, ss)
	}))
	controlplane.NewServer(store, controlplane.WithLogger(quiet)).Register(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// getFrom sends one GET to addr from the loopback address from and
// returns its status.
func getFrom(t *testing.T, from, addr string) int {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: testutil.Timeout}
	resp, err := c.Get("http://" + addr + "/")
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestInboundPolicyFirstRequestWaitsForThePolicy: a fresh server whose
// control plane answers only after the server has begun reading its first
// request judges that request by the port's policy, never by the default:
// with the open default, a client the policy refuses gets 403 on its
// first request (not 200), and with a deny default the client the policy
// admits gets 200 on its first (not 403). Over real sockets, plaintext,
// from distinct loopback addresses.
func TestInboundPolicyFirstRequestWaitsForThePolicy(t *testing.T) {
	deny, err := authz.DefaultServer(authz.Deny, authz.DefaultOptions{})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		def  *authz.Server
		from string
		want int
	}{
		{"refused client, open default", nil, "127.0.0.2", http.StatusForbidden},
		{"admitted client, deny default", deny, "127.0.0.3", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			port := netip.MustParseAddrPort(lis.Addr().String()).Port()
			release := make(chan struct{})
			var once sync.Once
			cp := heldInboundControlPlane(t, callersManifests(port), release)
			dst, err := destination.Dial(cp, destination.WithLogger(quiet), destination.WithWorkload("default:books-0"))
			require.NoError(t, err)
			defer dst.Close()
			srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
				WithLogger(quiet), WithInboundPolicy(authz.WithSource(dst.InboundPolicies()), authz.WithoutLocalhost(),
					authz.WithDefault(tc.def), authz.WithPolicyWait(testutil.Timeout)))
			defer srv.Close()
			hs := origproto.NewServer(srv)
			hs.ErrorLog = quietLog
			// The control plane answers once the first request is being
			// read.
			hs.ConnState = func(_ net.Conn, st http.ConnState) {
				if st == http.StateActive {
					once.Do(func() { close(release) })
				}
			}
			go hs.Serve(srv.Listener(lis))
			defer hs.Close()

			assert.Equal(t, tc.want, getFrom(t, tc.from, lis.Addr().String()), "the first request")
			assert.Equal(t, tc.want, getFrom(t, tc.from, lis.Addr().String()), "the second request")
		})
	}
}

// TestInboundPolicyWaitBound: against a control plane that accepts the
// InboundServerPolicies stream and never answers, the first request waits
// the bound, then the default policy decides it, which a warning in the
// log and inbound_http_policy_unavailable_total say; later requests are
// decided by the default at once, each counted.
func TestInboundPolicyWaitBound(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := netip.MustParseAddrPort(lis.Addr().String()).Port()
	dst, err := destination.Dial(testutil.ServeInbound(t, testutil.SilentInbound{}), destination.WithLogger(quiet), destination.WithWorkload("default:books-0"))
	require.NoError(t, err)
	defer dst.Close()

	var logs testutil.LogLines
	m := testutil.NewMetrics(t)
	const wait = 300 * time.Millisecond
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		WithLogger(logs.Logger()), WithMeterProvider(m.Provider),
		WithInboundPolicy(authz.WithSource(dst.InboundPolicies()), authz.WithPolicyWait(wait)))
	defer srv.Close()
	hs := origproto.NewServer(srv)
	hs.ErrorLog = quietLog
	started := time.Now()
	go hs.Serve(srv.Listener(lis))
	defer hs.Close()

	assert.Equal(t, http.StatusOK, getFrom(t, "127.0.0.2", lis.Addr().String()), "the default (all-unauthenticated) decides")
	assert.GreaterOrEqual(t, time.Since(started), wait, "the first request waited the bound")
	assert.Equal(t, 1, logs.Count("no inbound policy from the control plane within the wait", fmt.Sprintf("port=%d", port)), "%s", logs.String())
	assert.Equal(t, "1", m.Value(t, authz.MetricPolicyUnavailable, fmt.Sprintf(`target_port="%d"`, port)))

	assert.Equal(t, http.StatusOK, getFrom(t, "127.0.0.2", lis.Addr().String()))
	assert.Equal(t, "2", m.Value(t, authz.MetricPolicyUnavailable, fmt.Sprintf(`target_port="%d"`, port)))
	assert.Equal(t, 1, logs.Count("no inbound policy from the control plane within the wait"), "one line, not one per request")
}
