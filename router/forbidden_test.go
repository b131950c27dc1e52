package router

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A target whose policy is opaque with a route that forbids the
// connection (what Linkerd's policy controller answers for a Service's
// clusterIP on a port the Service does not declare,
// policy-controller/grpc/src/outbound.rs undefined_port) has its requests
// refused unsent: no response, the error ErrForbiddenRoute, as Linkerd's
// proxy closes the connection (linkerd/app/outbound/src/opaq/logical/
// route/filters.rs). An opaque route that does not forbid leaves the
// request on the default route, to the target as it is. The target is a
// loopback server, so that a request the router let through would reach
// it.
func TestForbiddenOpaqueRouteRefusesUnsent(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		up := newUpstream(t, nil)
		target := up.srv.Listener.Addr().String()
		opaque := func(forbidden bool) *policy.Policy {
			return &policy.Policy{Parent: parentMeta, Protocol: policy.ProtocolOpaque,
				Opaque: policy.OpaqueProtocol{Routes: []policy.OpaqueRoute{{Meta: policy.DefaultMetadata("undefined-port"), Forbidden: forbidden}}}}
		}
		f := newFixture(t, mode, nil)
		f.pol.Set(target, opaque(true))
		f.waitModel(t, "http://"+target+"/", ModelPolicy)
		assert.Contains(t, f.r.Explain(httptest.NewRequest(http.MethodGet, "http://"+target+"/", nil)).Reason, "forbids")

		body := &closeTracker{Reader: strings.NewReader("payload")}
		req, err := http.NewRequest(http.MethodPost, "http://"+target+"/", body)
		require.NoError(t, err)
		resp, err := f.r.Transport(testutil.NewTransport(t, mode)).RoundTrip(req)
		require.ErrorIs(t, err, ErrForbiddenRoute)
		assert.Nil(t, resp)
		assert.True(t, body.closed, "the request body is closed, as a RoundTripper must")
		assert.Zero(t, up.n.Load(), "the target got no request")

		f.pol.Set(target, opaque(false))
		require.Eventually(t, func() bool {
			resp, err := f.client.Get("http://" + target + "/")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, testutil.Timeout, 5*time.Millisecond)
		assert.NotZero(t, up.n.Load(), "an opaque route that does not forbid: the default route")
	})
}

type closeTracker struct {
	*strings.Reader
	closed bool
}

func (c *closeTracker) Close() error { c.closed = true; return nil }

// A request that an opaque route refuses is counted as the connection
// Linkerd's proxy opens on that route and closes as forbidden
// (linkerd/app/outbound/src/metrics/transport.rs): one
// outbound_tcp_route_open_total and one outbound_tcp_route_close_total
// with error="forbidden", labelled with the parent, the route and the
// target's IP and port (linkerd/app/outbound/src/opaq/logical/route.rs,
// RouteLabels). A target whose opaque route does not forbid counts
// nothing there.
func TestForbiddenOpaqueRouteIsCounted(t *testing.T) {
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		up := newUpstream(t, nil)
		target := up.srv.Listener.Addr().String()
		host, port, err := net.SplitHostPort(target)
		require.NoError(t, err)
		f := newFixture(t, mode, nil)
		f.pol.Set(target, &policy.Policy{Parent: parentMeta, Protocol: policy.ProtocolOpaque,
			Opaque: policy.OpaqueProtocol{Routes: []policy.OpaqueRoute{{Meta: policy.DefaultMetadata("undefined-port"), Forbidden: true}}}})
		f.waitModel(t, "http://"+target+"/", ModelPolicy)
		for range 2 {
			_, err := f.client.Get("http://" + target + "/")
			require.ErrorIs(t, err, ErrForbiddenRoute)
		}
		labels := `parent_group="",parent_kind="Service",parent_name="svc",parent_namespace="ns",parent_port="80",parent_section_name="",` +
			`route_group="",route_kind="default",route_name="undefined-port",route_namespace="",` +
			`target_ip="` + host + `",target_port="` + port + `"`
		assert.Equal(t, []string{"outbound_tcp_route_open_total{" + labels + "} 2"}, f.m.Lines(t, "outbound_tcp_route_open_total"))
		assert.Equal(t, []string{`outbound_tcp_route_close_total{error="forbidden",` + labels + "} 2"}, f.m.Lines(t, "outbound_tcp_route_close_total"))

		other := newUpstream(t, nil).srv.Listener.Addr().String()
		f.pol.Set(other, &policy.Policy{Parent: parentMeta, Protocol: policy.ProtocolOpaque,
			Opaque: policy.OpaqueProtocol{Routes: []policy.OpaqueRoute{{Meta: policy.DefaultMetadata("opaq")}}}})
		f.waitModel(t, "http://"+other+"/", ModelPolicy)
		resp, err := f.client.Get("http://" + other + "/")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Len(t, f.m.Lines(t, "outbound_tcp_route_open_total"), 1, "an opaque route that does not forbid counts nothing")
	})
}
