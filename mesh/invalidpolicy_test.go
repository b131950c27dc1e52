package mesh

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/proxyapi/inboundpb"
)

// queuedInbound is an InboundServerPolicies server that sends each port
// watch the Servers put on its channel, in order.
type queuedInbound struct {
	inboundpb.UnimplementedInboundServerPoliciesServer
	servers chan *inboundpb.Server
}

func (q queuedInbound) WatchPort(_ *inboundpb.PortSpec, s grpc.ServerStreamingServer[inboundpb.Server]) error {
	for {
		select {
		case m := <-q.servers:
			if err := s.Send(m); err != nil {
				return err
			}
		case <-s.Context().Done():
			return s.Context().Err()
		}
	}
}

// unusableServer is a Server no proxy can use: an authorization without
// networks, which Linkerd's proxy refuses too (InvalidAuthz::MissingNetworks).
func unusableServer() *inboundpb.Server {
	return &inboundpb.Server{
		Protocol: &inboundpb.ProxyProtocol{Kind: &inboundpb.ProxyProtocol_Detect_{Detect: &inboundpb.ProxyProtocol_Detect{
			Timeout: durationpb.New(10 * time.Second)}}},
		Authorizations: []*inboundpb.Authz{{
			Labels:         map[string]string{"group": "policy.linkerd.io", "kind": "authorizationpolicy", "name": "everyone"},
			Authentication: &inboundpb.Authn{Permit: &inboundpb.Authn_Unauthenticated{Unauthenticated: &inboundpb.Authn_PermitUnauthenticated{}}},
		}},
		Labels: map[string]string{"group": "policy.linkerd.io", "kind": "server", "name": "app"},
	}
}

// serveInboundFrom starts a server of the inbound policy the control plane
// q sends (with the pod's own loopback admitted, as by default) and
// returns its address.
func serveInboundFrom(t *testing.T, q queuedInbound) string {
	t.Helper()
	dst, err := destination.Dial(testutil.ServeInbound(t, q), destination.WithLogger(quiet), destination.WithWorkload("default:app-0"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Close() })

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "served") }),
		WithLogger(quiet), WithInboundPolicy(authz.WithSource(dst.InboundPolicies()), authz.WithPolicyWait(testutil.Timeout)))
	t.Cleanup(srv.Close)
	hs := origproto.NewServer(srv)
	hs.ErrorLog = quietLog
	go hs.Serve(srv.Listener(lis))
	t.Cleanup(func() { _ = hs.Close() })
	return lis.Addr().String()
}

// A Server the control plane sends that cannot be used closes the port, as
// Linkerd's proxy puts its invalid policy in force
// (linkerd/app/inbound/src/policy/api.rs): every request is refused 403,
// the pod's own loopback's too, rather than waiting out the policy wait
// and serving under the default (a fresh port), or keeping an older,
// more open policy (a live one).
func TestUnusableServerRefusesEveryRequest(t *testing.T) {
	t.Run("first answer", func(t *testing.T) {
		q := queuedInbound{servers: make(chan *inboundpb.Server, 1)}
		q.servers <- unusableServer()
		addr := serveInboundFrom(t, q)
		assert.Equal(t, http.StatusForbidden, getFrom(t, "127.0.0.2", addr))
		assert.Equal(t, http.StatusForbidden, getFrom(t, "127.0.0.1", addr), "the pod's own loopback")
	})
	t.Run("update", func(t *testing.T) {
		open, err := authz.DefaultServer(authz.AllUnauthenticated, authz.DefaultOptions{})
		require.NoError(t, err)
		q := queuedInbound{servers: make(chan *inboundpb.Server, 2)}
		q.servers <- destination.ServerToProto(open)
		addr := serveInboundFrom(t, q)
		require.Equal(t, http.StatusOK, getFrom(t, "127.0.0.2", addr), "the open policy")
		q.servers <- unusableServer()
		require.Eventually(t, func() bool { return getFrom(t, "127.0.0.2", addr) == http.StatusForbidden },
			testutil.Timeout, 10*time.Millisecond, "the open policy stayed in force")
		assert.Equal(t, http.StatusForbidden, getFrom(t, "127.0.0.1", addr), "the pod's own loopback")
		q.servers <- destination.ServerToProto(open)
		require.Eventually(t, func() bool { return getFrom(t, "127.0.0.2", addr) == http.StatusOK },
			testutil.Timeout, 10*time.Millisecond, "a valid Server after the unusable one")
	})
}
