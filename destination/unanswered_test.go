package destination_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A profile and a policy watch whose control plane cannot be reached are
// told at once that no answer can come (an update with no profile or
// policy, not a rejection), and keep trying: once the control plane
// answers, its profile and policy apply.
func TestUnreachableControlPlaneAnswersNoneThenRecovers(t *testing.T) {
	res, err := manifest.Parse([]byte(`
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec:
  ports: [{port: 7000}]
`))
	require.NoError(t, err)
	store := controlplane.NewStore()
	store.SetManifests(res)
	store.SetServiceProfiles([]*profiles.ServiceProfile{serviceProfile(books, "later")})
	held := holdListener(t)
	var down atomic.Bool
	down.Store(true)
	refuse := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if down.Load() {
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	c := newTestClient(t, held.addr(), destination.WithDialFunc(refuse))
	prof := newRecorder[profiles.Update]()
	stop, err := c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	defer stop()
	pol := newRecorder[policy.Update]()
	stop, err = c.Policies().Watch(context.Background(), books+":7000", pol.update)
	require.NoError(t, err)
	defer stop()

	u := prof.waitFor(t, "no profile yet", func(profiles.Update) bool { return true })
	assert.Nil(t, u.Profile)
	assert.Equal(t, codes.Unavailable, status.Code(u.Err), "%v", u.Err)
	assert.False(t, errors.Is(u.Err, profiles.ErrNoProfile), "not a rejection: the watch goes on")
	p := pol.waitFor(t, "no policy yet", func(policy.Update) bool { return true })
	assert.Nil(t, p.Policy)
	assert.Equal(t, codes.Unavailable, status.Code(p.Err), "%v", p.Err)

	srv := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quietLogger)).Register(srv)
	go srv.Serve(held.generation())
	defer srv.Stop()
	down.Store(false)
	prof.waitFor(t, "the profile once the control plane answers", hasRoute("later"))
	pol.waitFor(t, "the policy once the control plane answers", func(u policy.Update) bool { return u.Policy != nil })
}

// A control plane that serves Destination alone (OutboundPolicies answered
// Unimplemented, as by Linkerd's destination controller): the policy watch
// is told at once that no answer can come, the profile watch gets its
// profile.
func TestOutboundPoliciesUnimplementedAnswersNone(t *testing.T) {
	store := controlplane.NewStore()
	store.SetServiceProfiles([]*profiles.ServiceProfile{serviceProfile(books, "r")})
	store.PutEndpoints(books+":7000", nil) // the Service exists
	held := holdListener(t)
	srv := grpc.NewServer()
	pb.RegisterDestinationServer(srv, controlplane.NewServer(store, controlplane.WithLogger(quietLogger)))
	go srv.Serve(held.generation())
	defer srv.Stop()
	c := newTestClient(t, held.addr())
	pol := newRecorder[policy.Update]()
	stop, err := c.Policies().Watch(context.Background(), books+":7000", pol.update)
	require.NoError(t, err)
	defer stop()
	prof := newRecorder[profiles.Update]()
	stop, err = c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	defer stop()
	p := pol.waitFor(t, "no policy", func(policy.Update) bool { return true })
	assert.Nil(t, p.Policy)
	assert.Equal(t, codes.Unimplemented, status.Code(p.Err), "%v", p.Err)
	prof.waitFor(t, "the profile", hasRoute("r"))
}
