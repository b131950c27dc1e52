package destination_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/outboundpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// wedged is a control plane that accepts every Destination and
// OutboundPolicies stream and never sends on it, counting the streams.
type wedged struct {
	pb.UnimplementedDestinationServer
	get, profile, policy atomic.Int32
	opened               chan struct{}
}

func (w *wedged) seen() {
	select {
	case w.opened <- struct{}{}:
	default:
	}
}

func (w *wedged) Get(_ *pb.GetDestination, st grpc.ServerStreamingServer[pb.Update]) error {
	w.get.Add(1)
	w.seen()
	return block(st.Context())
}

func (w *wedged) GetProfile(_ *pb.GetDestination, st grpc.ServerStreamingServer[pb.DestinationProfile]) error {
	w.profile.Add(1)
	w.seen()
	return block(st.Context())
}

// wedgedPolicies is the OutboundPolicies side of a wedged control plane.
type wedgedPolicies struct {
	outboundpb.UnimplementedOutboundPoliciesServer
	w *wedged
}

func (p wedgedPolicies) Watch(_ *outboundpb.TrafficSpec, st grpc.ServerStreamingServer[outboundpb.OutboundPolicy]) error {
	p.w.policy.Add(1)
	p.w.seen()
	return block(st.Context())
}

// A control plane that delivered endpoints, a profile and a policy goes
// away, and what answers on its port next accepts every stream and never
// sends (a wedged or rogue control plane). The streams that replace those
// which delivered stay silent past many first-message deadlines: the last
// good state stays in force (the endpoints, the profile, the policy) and
// every request still reaches the known endpoint. Only an authority never
// answered before is told "exists, no endpoints" after the deadline.
func TestSilentReconnectKeepsLastGoodState(t *testing.T) {
	const deadline = 50 * time.Millisecond
	_, ep := backend(t, "a")
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
	store.SetServiceProfiles([]*profiles.ServiceProfile{serviceProfile(books, "before")})
	store.PutEndpoints(books+":7000", []endpoint.Endpoint{ep})

	held := holdListener(t)
	good := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quietLogger)).Register(good)
	go good.Serve(held.generation())

	logs := &testutil.LogLines{}
	c := newTestClient(t, held.addr(), destination.WithFirstMessageTimeout(deadline), destination.WithLogger(logs.Logger()),
		destination.WithLogInterval(time.Nanosecond)) // every silence logged
	eps := newRecorder[endpoint.Update]()
	stop, err := c.WatchEndpoints(context.Background(), books+":7000", eps.update)
	require.NoError(t, err)
	defer stop()
	prof := newRecorder[profiles.Update]()
	stop, err = c.Watch(context.Background(), books+":7000", prof.update)
	require.NoError(t, err)
	defer stop()
	pol := newRecorder[policy.Update]()
	stop, err = c.Policies().Watch(context.Background(), books+":7000", pol.update)
	require.NoError(t, err)
	defer stop()
	eps.waitFor(t, "the endpoint", func(u endpoint.Update) bool { return len(addrs(u)) == 1 })
	// On a loaded machine the first stream's own silence may have come
	// first: the updates that count are those after the endpoint.
	known := len(eps.all()) - 1
	prof.waitFor(t, "the profile", hasRoute("before"))
	pol.waitFor(t, "the policy", func(u policy.Update) bool { return u.Policy != nil })
	_, hc := balancedClient(t, c, balancer.WithResolveTimeout(time.Hour), balancer.WithFallback(false))
	status, body, _ := fetch(t, hc, "http://"+books+":7000/")
	require.Equal(t, http.StatusOK, status)
	require.True(t, strings.HasPrefix(body, "a "), body)

	// The first stream's own silence, on a loaded machine, may have been
	// logged already: the silence that counts is the next one.
	silentGet := func() int { return logs.Count("rpc=Get ", "silent", "authority="+books+":7000") }
	silentBefore := silentGet()

	// The good control plane goes; the wedged one takes its port.
	w := &wedged{opened: make(chan struct{}, 1)}
	bad := grpc.NewServer()
	pb.RegisterDestinationServer(bad, w)
	outboundpb.RegisterOutboundPoliciesServer(bad, wedgedPolicies{w: w})
	good.Stop()
	go bad.Serve(held.generation())
	defer bad.Stop()

	// Every stream reconnected to the wedged control plane and its silence
	// outlasted the deadline: GetProfile and OutboundPolicies were cut and
	// opened again (twice each), and the Get stream's silence was noticed.
	require.Eventually(t, func() bool {
		return w.get.Load() >= 1 && w.profile.Load() >= 3 && w.policy.Load() >= 3 &&
			silentGet() > silentBefore
	}, defaultTestTimeout, 5*time.Millisecond, "streams reconnected to the silent control plane: %s", logs.String())

	for i, u := range eps.all()[known:] {
		assert.Equal(t, 1, len(addrs(u)), "endpoint update %d dropped the known endpoint: %+v", known+i, u)
	}
	for i, u := range prof.all() {
		assert.True(t, hasRoute("before")(u), "profile update %d replaced the last good profile: %+v", i, u)
	}
	for i, u := range pol.all() {
		assert.NotNil(t, u.Policy, "policy update %d replaced the last good policy: %+v", i, u)
	}
	failed := 0
	for range 50 {
		if status, _, _ := fetch(t, hc, "http://"+books+":7000/"); status != http.StatusOK {
			failed++
		}
	}
	assert.Zero(t, failed, "requests failed of 50 on the last known endpoint")

	// A new authority, never answered, is "exists, no endpoints" after the
	// deadline, as a silent Get stream always meant.
	fresh := newRecorder[endpoint.Update]()
	stop, err = c.WatchEndpoints(context.Background(), "authors.default.svc.cluster.local:7000", fresh.update)
	require.NoError(t, err)
	defer stop()
	u := fresh.waitFor(t, "no endpoints for the new authority", func(endpoint.Update) bool { return true })
	require.NotNil(t, u.Set)
	assert.True(t, u.Set.Exists)
	assert.Empty(t, u.Set.Endpoints)
}
