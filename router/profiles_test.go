package router

import (
	"net/http"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The ServiceProfile side of the router, through its own options: the
// inbound Handler with the server's own authorities and the
// l5d-dst-override header, and the route in the request context on both
// sides. (The route table execution itself is tested in
// internal/profileroute.)

const profileAuthority = "profiles.test.svc.cluster.local:80"

func TestRouterAuthority(t *testing.T) {
	src := profiles.NewStaticSource(map[string]*profiles.Profile{
		"books.default.svc.cluster.local:80":   {Routes: []profiles.Route{{Condition: profiles.MatchAll{}, Labels: map[string]string{"route": "port80"}}}},
		"books.default.svc.cluster.local:7000": {Routes: []profiles.Route{{Condition: profiles.MatchAll{}, Labels: map[string]string{"route": "port7000"}}}},
	})
	routes := make(chan string, 10)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rt := ProfileRouteFromContext(r.Context()); rt != nil {
			routes <- rt.Labels["route"]
		}
	})
	for _, tc := range []struct {
		name     string
		override bool
		host     string
		header   string
		want     string
	}{
		{"host without port is :80", false, "Books.Default.svc.cluster.local", "", "port80"},
		{"host with port", false, "books.default.svc.cluster.local:7000", "", "port7000"},
		{"override ignored by default", false, "books.default.svc.cluster.local:7000", "books.default.svc.cluster.local:80", "port7000"},
		{"override allowed", true, "books.default.svc.cluster.local:7000", "books.default.svc.cluster.local:80", "port80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			router := New(WithProfiles(src), WithLogger(quietLogger), WithDstOverrideHeader(tc.override),
				WithLocalAuthorities("books.default.svc.cluster.local", "books.default.svc.cluster.local:7000"))
			defer router.Close()
			srv := testutil.NewServer(t, router.Handler(app))
			client := &http.Client{Transport: testutil.NewTransport(t, testutil.H1)}
			require.Eventually(t, func() bool {
				req, _ := http.NewRequest("GET", srv.URL+"/", nil)
				req.Host = tc.host
				if tc.header != "" {
					req.Header.Set("l5d-dst-override", tc.header)
				}
				resp, err := client.Do(req)
				require.NoError(t, err)
				resp.Body.Close()
				select {
				case got := <-routes:
					return got == tc.want
				case <-time.After(testutil.Timeout):
					return false
				}
			}, testutil.Timeout, 5*time.Millisecond)
		})
	}
}

func TestTransportPutsRouteInContext(t *testing.T) {
	src := profiles.NewStaticSource(map[string]*profiles.Profile{profileAuthority: {Routes: []profiles.Route{{Condition: profiles.PathRegex("/x"), Labels: map[string]string{"route": "x"}}}}})
	router := New(WithProfiles(src), WithLogger(quietLogger))
	defer router.Close()
	seen := make(chan *profiles.CompiledRoute, 10)
	rt := router.Transport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen <- ProfileRouteFromContext(r.Context())
		return testutil.NewTransport(t, testutil.H1).RoundTrip(r)
	}))
	srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest("GET", srv.URL+"/x", nil)
		req.Host = profileAuthority
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		return (<-seen).Labels["route"] == "x"
	}, testutil.Timeout, 5*time.Millisecond)
}

// A router without a profile source still serves the inbound side: every
// request takes the default route, which is in its context.
func TestHandlerWithoutProfiles(t *testing.T) {
	r := New(WithLogger(quietLogger), WithLocalAuthorities(profileAuthority))
	defer r.Close()
	seen := make(chan *profiles.CompiledRoute, 1)
	srv := testutil.NewServer(t, r.Handler(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		seen <- ProfileRouteFromContext(req.Context())
	})))
	client := &http.Client{Transport: testutil.NewTransport(t, testutil.H1)}
	req, err := http.NewRequest("GET", srv.URL+"/x", nil)
	require.NoError(t, err)
	req.Host = profileAuthority
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	route := <-seen
	require.NotNil(t, route)
	assert.True(t, route.IsDefault())
	assert.Nil(t, r.ProfileTable("elsewhere.test:80"), "no state for an authority no request named")
}
