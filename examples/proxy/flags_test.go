package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/internal/testutil"
)

// A -workload that is not NS:POD (nor Linkerd's JSON) stops the proxy at
// start with a line that names the flag and the expected form, before it
// listens, instead of a quiet line once a watch is refused.
func TestWorkloadFlagIsChecked(t *testing.T) {
	f := flags{destination: "127.0.0.1:1", outbound: "127.0.0.1:0", inbound: "127.0.0.1:0", app: "127.0.0.1:8080",
		metrics: "127.0.0.1:0", workload: "books-0"}
	done := make(chan error, 1)
	go func() { done <- run(f, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), `-workload (or $LINKERD2_PROXY_POLICY_WORKLOAD): workload "books-0" is not of the form NS:POD (such as default:web-0)`)
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy started with -workload books-0")
	}
}

// A -trace-sampling outside 0..1 stops the proxy at start, naming the flag.
func TestTraceSamplingFlagIsChecked(t *testing.T) {
	_, _, err := startTracing(t.Context(), traceFlags{endpoint: "127.0.0.1:4317", sampling: 2, batch: time.Second})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-trace-sampling 2: not between 0 and 1")
}

// The pod's default inbound policy ($LINKERD2_PROXY_INBOUND_DEFAULT_POLICY,
// as a Linkerd proxy reads it, or -default-inbound-policy) decides the app
// port's requests while its control plane has not answered within
// -policy-wait: with deny, a request is refused rather than served under
// all-unauthenticated.
func TestDefaultInboundPolicy(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "app") }))
	defer app.Close()
	cp := testutil.ServeInbound(t, testutil.SilentInbound{})

	get := func(t *testing.T, f flags) int {
		f.destination, f.outbound, f.inbound, f.metrics = cp, "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		f.app, f.workload, f.policyWait, f.appIdleTimeout = app.Listener.Addr().String(), "default:app-0", testutil.ShortTimeout, time.Second
		addr := make(chan string, 1)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- runContext(ctx, f, slog.New(listenHandler{inbound: addr})) }()
		defer func() { cancel(); <-done }()
		var inbound string
		select {
		case inbound = <-addr:
		case err := <-done:
			t.Fatalf("the proxy stopped: %v", err)
		case <-time.After(testutil.Timeout):
			t.Fatal("the proxy never listened")
		}
		resp, err := http.Get("http://" + inbound + "/")
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	t.Run("environment", func(t *testing.T) {
		t.Setenv(envDefaultPolicy, "deny")
		assert.Equal(t, http.StatusForbidden, get(t, flags{defaultPolicy: os.Getenv(envDefaultPolicy)}))
	})
	t.Run("flag", func(t *testing.T) {
		assert.Equal(t, http.StatusForbidden, get(t, flags{defaultPolicy: "cluster-authenticated", clusterNetworks: "127.0.0.0/8"}),
			"a plaintext client of the cluster network")
		assert.Equal(t, http.StatusOK, get(t, flags{defaultPolicy: "cluster-unauthenticated", clusterNetworks: "127.0.0.0/8"}))
		assert.Equal(t, http.StatusForbidden, get(t, flags{defaultPolicy: "cluster-unauthenticated", clusterNetworks: "10.0.0.0/8"}))
	})
	t.Run("unset", func(t *testing.T) {
		assert.Equal(t, http.StatusOK, get(t, flags{}), "all-unauthenticated")
	})
	t.Run("checked at start", func(t *testing.T) {
		f := flags{destination: cp, outbound: "127.0.0.1:0", inbound: "127.0.0.1:0", app: "127.0.0.1:8080",
			metrics: "127.0.0.1:0", workload: "default:app-0", defaultPolicy: "open"}
		err := runContext(t.Context(), f, slog.New(slog.DiscardHandler))
		assert.ErrorContains(t, err, `-default-inbound-policy (or $LINKERD2_PROXY_INBOUND_DEFAULT_POLICY): default inbound policy: "open" is not one of`)
		f.defaultPolicy, f.clusterNetworks = "cluster-authenticated", "10.0.0.0/33"
		err = runContext(t.Context(), f, slog.New(slog.DiscardHandler))
		assert.ErrorContains(t, err, `-cluster-networks (or $LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS)`)
	})
}

// listenHandler sends the address of the proxy's inbound listener once it
// listens.
type listenHandler struct{ inbound chan<- string }

func (h listenHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h listenHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "listening" {
		return nil
	}
	var name, addr string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "listener":
			name = a.Value.String()
		case "addr":
			addr = a.Value.String()
		}
		return true
	})
	if name == "inbound" {
		h.inbound <- addr
	}
	return nil
}
func (h listenHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h listenHandler) WithGroup(string) slog.Handler      { return h }

// A control-plane address that cannot work stops the proxy at start with
// the flag named: a URL, an address without a port, an empty one in a
// list; a host:port, a list and a gRPC target pass.
func TestControlAddrIsChecked(t *testing.T) {
	for _, tc := range []struct{ v, want string }{
		{"127.0.0.1:8086", ""},
		{"127.0.0.1:8086,127.0.0.2:8086", ""},
		{"dns:///linkerd-dst-headless.linkerd.svc.cluster.local:8086", ""},
		{"http://127.0.0.1:8086", `-destination "http://127.0.0.1:8086": a host:port (or a gRPC target such as dns:///name:port), not a URL`},
		{"8086", `-destination: address 1 of "8086": address 8086: missing port in address`},
		{"127.0.0.1:8086,", `-destination: address 2 of "127.0.0.1:8086," is empty`},
	} {
		err := checkControlAddr("destination", tc.v)
		if tc.want == "" {
			assert.NoError(t, err, tc.v)
		} else {
			assert.EqualError(t, err, tc.want, tc.v)
		}
	}
	f := flags{destination: "http://127.0.0.1:8086", outbound: "127.0.0.1:0", inbound: "127.0.0.1:0", app: "127.0.0.1:8080", metrics: "127.0.0.1:0"}
	assert.ErrorContains(t, runContext(t.Context(), f, slog.New(slog.DiscardHandler)), "not a URL")
}
