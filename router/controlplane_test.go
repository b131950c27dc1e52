package router_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/router"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

const booksAuthority = "books.default.svc.cluster.local:7000"

const booksYAML = `
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec:
  ports: [{port: 7000}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: books-get, namespace: default}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /books}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-routed, value: books-get}]}
    backendRefs: [{name: books, port: 7000}]
`

// The policy comes from the embedded control plane over a real gRPC
// stream, the backend resolves through the Destination API and the
// balancer, and the request reaches the upstream with the route's filter
// applied and the outbound metrics labelled by the HTTPRoute.
func TestEmbeddedControlPlane(t *testing.T) {
	up := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.Header.Get("X-Routed"))
	}))
	res, err := manifest.Parse([]byte(booksYAML))
	require.NoError(t, err)
	store := controlplane.NewStore()
	store.SetManifests(res)
	store.SetEndpoints(map[string][]endpoint.Endpoint{
		booksAuthority: {{Addr: netip.MustParseAddrPort(up.Listener.Addr().String())}},
	})
	dst := serveStore(t, store)
	bal := balancer.New(dst)
	t.Cleanup(bal.Close)
	m := testutil.NewMetrics(t)
	r := router.New(router.WithPolicies(dst.Policies()), router.WithMeterProvider(m.Provider))
	t.Cleanup(r.Close)

	probe := httptest.NewRequest("GET", "http://"+booksAuthority+"/books/1", nil)
	require.Eventually(t, func() bool { return r.Explain(probe).Route == "books-get" }, testutil.Timeout, 10*time.Millisecond)

	client := &http.Client{Transport: r.Transport(bal.Transport(testutil.NewTransport(t, testutil.H1)))}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+booksAuthority+"/books/1", nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "books-get", string(body), "the route's request header modifier applied")
	assert.Equal(t, "1", m.Value(t, "outbound_http_route_request_statuses_total",
		`route_kind="HTTPRoute"`, `route_name="books-get"`, `parent_name="books"`, `http_status="200"`))
}

// The Service's failure-accrual annotations travel from the embedded
// control plane over OutboundPolicies to the balancer of the route's
// backend: of three endpoints, the one failing every request trips after
// its three consecutive failures and receives nothing more.
func TestEmbeddedControlPlaneFailureAccrual(t *testing.T) {
	var bad atomic.Int64
	var eps []endpoint.Endpoint
	for i := range 3 {
		srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if i == 2 {
				bad.Add(1)
				w.WriteHeader(http.StatusInternalServerError)
			}
		}))
		eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(srv.Listener.Addr().String())})
	}
	res, err := manifest.Parse([]byte(`
apiVersion: v1
kind: Service
metadata:
  name: books
  namespace: default
  annotations:
    balancer.linkerd.io/failure-accrual: consecutive
    balancer.linkerd.io/failure-accrual-consecutive-max-failures: "3"
    balancer.linkerd.io/failure-accrual-consecutive-min-penalty: 1h
    balancer.linkerd.io/failure-accrual-consecutive-max-penalty: 1h
spec:
  ports: [{port: 7000}]
`))
	require.NoError(t, err)
	store := controlplane.NewStore()
	store.SetManifests(res)
	store.SetEndpoints(map[string][]endpoint.Endpoint{booksAuthority: eps})
	dst := serveStore(t, store)
	bal := balancer.New(dst)
	t.Cleanup(bal.Close)
	r := router.New(router.WithPolicies(dst.Policies()), router.WithBalancer(bal))
	t.Cleanup(r.Close)
	probe := httptest.NewRequest("GET", "http://"+booksAuthority+"/", nil)
	require.Eventually(t, func() bool { return r.Explain(probe).Model == router.ModelPolicy }, testutil.Timeout, 10*time.Millisecond)

	client := &http.Client{Transport: r.Transport(bal.Transport(testutil.NewTransport(t, testutil.H1)))}
	get := func() int {
		resp, err := client.Get("http://" + booksAuthority + "/")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for bad.Load() < 3 {
		get()
	}
	for range 300 {
		assert.Equal(t, 200, get())
	}
	assert.Equal(t, int64(3), bad.Load(), "requests reached the tripped endpoint")
}

// serveStore serves store as the embedded control plane on loopback and
// returns a client of it.
func serveStore(t *testing.T, store *controlplane.Store) *destination.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	controlplane.NewServer(store).Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	dst, err := destination.Dial(lis.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })
	return dst
}

// TestEmbeddedControlPlaneRetryConditions: a route whose retry annotations
// set a limit or a timeout but no retry.linkerd.io/http (or /grpc) gets
// from the control plane a retry with no status ranges (no codes), as
// Linkerd's policy controller sends it
// (policy-controller/k8s/index/src/outbound/index/http.rs parse_http_retry;
// policy-controller/grpc/src/outbound/http.rs convert_retry), and such a
// retry retries no response status, as Linkerd's proxy
// (linkerd/app/outbound/src/http/logical/policy/route/retry.rs
// is_retryable): only errors are retried.
func TestEmbeddedControlPlaneRetryConditions(t *testing.T) {
	for _, tc := range []struct {
		name        string
		kind        string // HTTPRoute or GRPCRoute
		annotations string
		want        int64 // attempts
	}{
		{"limit only", "HTTPRoute", `{retry.linkerd.io/limit: "2"}`, 1},
		{"timeout only", "HTTPRoute", `{retry.linkerd.io/timeout: 5s}`, 1},
		{"5xx and a limit", "HTTPRoute", `{retry.linkerd.io/http: 5xx, retry.linkerd.io/limit: "2"}`, 3},
		{"gRPC: limit only", "GRPCRoute", `{retry.linkerd.io/limit: "2"}`, 1},
		{"gRPC: unavailable and a limit", "GRPCRoute", `{retry.linkerd.io/grpc: unavailable, retry.linkerd.io/limit: "2"}`, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			grpcRoute := tc.kind == "GRPCRoute"
			var n atomic.Int64
			up := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n.Add(1)
				if grpcRoute {
					w.Header().Set("Content-Type", "application/grpc")
					w.Header().Set("Grpc-Status", "14") // UNAVAILABLE
					return
				}
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			res, err := manifest.Parse([]byte(`
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec:
  ports: [{port: 7000}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: ` + tc.kind + `
metadata:
  name: books-route
  namespace: default
  annotations: ` + tc.annotations + `
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - backendRefs: [{name: books, port: 7000}]
`))
			require.NoError(t, err)
			store := controlplane.NewStore()
			store.SetManifests(res)
			store.SetEndpoints(map[string][]endpoint.Endpoint{
				booksAuthority: {{Addr: netip.MustParseAddrPort(up.Listener.Addr().String())}},
			})
			dst := serveStore(t, store)
			bal := balancer.New(dst)
			t.Cleanup(bal.Close)
			r := router.New(router.WithPolicies(dst.Policies()), router.WithBalancer(bal))
			t.Cleanup(r.Close)
			mode, method, path := testutil.H1, "GET", "/"
			if grpcRoute {
				mode, method, path = testutil.H2C, "POST", "/pkg.Svc/Call"
			}
			probe := httptest.NewRequest(method, "http://"+booksAuthority+path, nil)
			probe.Header.Set("Content-Type", "application/grpc")
			require.Eventually(t, func() bool { return r.Explain(probe).Route == "books-route" }, testutil.Timeout, 10*time.Millisecond)

			client := &http.Client{Transport: r.Transport(bal.Transport(testutil.NewTransport(t, mode)))}
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, method, "http://"+booksAuthority+path, nil)
			require.NoError(t, err)
			if grpcRoute {
				req.Header.Set("Content-Type", "application/grpc")
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if grpcRoute {
				assert.Equal(t, "14", resp.Header.Get("Grpc-Status"))
			} else {
				assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			}
			assert.Equal(t, tc.want, n.Load(), "attempts")
		})
	}
}
