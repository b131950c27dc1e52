//go:build unix

package mesh

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// closingListener holds a loopback port that accepts connections and
// closes them at once, before saying anything.
func closingListener(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { lis.Close(); <-done })
	return lis.Addr().String()
}

// TestInboundPolicyWaitNamesTheCause: when the inbound policy's control
// plane cannot be reached, the warning at the end of a port's wait names
// why, as gRPC or the dial said it: a refused connection (with the
// address), a peer that closed before its preface, a server that does not
// serve InboundServerPolicies, a TLS handshake with a plaintext control
// plane.
func TestInboundPolicyWaitNamesTheCause(t *testing.T) {
	for _, tc := range []struct {
		name string
		addr func(t *testing.T) string
		opts []destination.Option
		want []string
	}{
		{"refused", func(t *testing.T) string { return testutil.RefusedAddr(t).String() }, nil, []string{"connection refused"}},
		{"closed before answering", closingListener, nil, []string{"code = Unavailable"}},
		{"a control plane without the API", func(t *testing.T) string {
			g := grpc.NewServer()
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			go g.Serve(lis)
			t.Cleanup(g.Stop)
			return lis.Addr().String()
		}, nil, []string{"code = Unimplemented", "InboundServerPolicies"}},
		{"TLS with a plaintext control plane", func(t *testing.T) string { return testutil.ServeInbound(t, testutil.SilentInbound{}) },
			[]destination.Option{destination.WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{ServerName: "control.example"})))},
			[]string{"handshake"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := tc.addr(t)
			if tc.name == "refused" {
				tc.want = append(tc.want, cp)
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			port := netip.MustParseAddrPort(lis.Addr().String()).Port()
			dst, err := destination.Dial(cp, append(tc.opts, destination.WithLogger(quiet), destination.WithWorkload("default:books-0"))...)
			require.NoError(t, err)
			defer dst.Close()

			// The port's watch starts, and the client meets the error,
			// before the server's wait begins, so that the wait's bound
			// can be short.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, err = dst.WatchInboundPort(ctx, port, func(destination.InboundUpdate) {})
			require.NoError(t, err)
			src := dst.InboundPolicies()
			require.Eventually(t, func() bool { return src.(authz.PendingCause).Pending(port) != nil },
				testutil.Timeout, 10*time.Millisecond, "the client met no error")

			var logs testutil.LogLines
			srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
				WithLogger(logs.Logger()), WithInboundPolicy(authz.WithSource(src), authz.WithPolicyWait(testutil.ShortTimeout)))
			defer srv.Close()
			hs := origproto.NewServer(srv)
			hs.ErrorLog = quietLog
			go hs.Serve(srv.Listener(lis))
			defer hs.Close()

			assert.Equal(t, http.StatusOK, getFrom(t, "127.0.0.2", lis.Addr().String()), "the default decides past the wait")
			want := append([]string{"no inbound policy from the control plane within the wait", fmt.Sprintf("port=%d", port), "error="}, tc.want...)
			assert.Equal(t, 1, logs.Count(want...), "%s", logs.String())
		})
	}
}
