package profiles

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/require"
)

func collect(t *testing.T) (func(Update), func(what string, ok func(Update) bool) Update) {
	ch := make(chan Update, 100)
	return func(u Update) { ch <- u }, func(what string, ok func(Update) bool) Update {
		t.Helper()
		deadline := time.After(testutil.Timeout)
		for {
			select {
			case u := <-ch:
				if ok(u) {
					return u
				}
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
}

func routeIs(name string) func(Update) bool {
	return func(u Update) bool {
		return u.Profile != nil && len(u.Profile.Routes) > 0 && u.Profile.Routes[0].Labels["route"] == name
	}
}

func TestStaticSource(t *testing.T) {
	src := NewStaticSource(nil)
	update, wait := collect(t)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := src.Watch(ctx, "a:80", update)
	require.NoError(t, err)
	wait("no profile yet", func(u Update) bool { return u.Profile == nil })
	src.Set("a:80", &Profile{Routes: []Route{{Condition: MatchAll{}, Labels: map[string]string{"route": "r"}}}})
	wait("set", routeIs("r"))
	src.Set("a:80", nil)
	wait("removed", func(u Update) bool { return u.Profile == nil })
	cancel()
	require.Eventually(t, func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		return len(src.watchers["a:80"]) == 0
	}, testutil.Timeout, time.Millisecond, "a cancelled watch is removed")
}

func TestRouterAuthority(t *testing.T) {
	src := NewStaticSource(map[string]*Profile{
		"books.default.svc.cluster.local:80":   {Routes: []Route{{Condition: MatchAll{}, Labels: map[string]string{"route": "port80"}}}},
		"books.default.svc.cluster.local:7000": {Routes: []Route{{Condition: MatchAll{}, Labels: map[string]string{"route": "port7000"}}}},
	})
	routes := make(chan string, 10)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rt := RouteFromContext(r.Context()); rt != nil {
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
			router := NewRouter(src, WithLogger(quietLogger), WithDstOverrideHeader(tc.override),
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
	src := NewStaticSource(map[string]*Profile{testAuthority: {Routes: []Route{{Condition: PathRegex("/x"), Labels: map[string]string{"route": "x"}}}}})
	router := NewRouter(src, WithLogger(quietLogger))
	defer router.Close()
	seen := make(chan *CompiledRoute, 10)
	rt := router.Transport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen <- RouteFromContext(r.Context())
		return testutil.NewTransport(t, testutil.H1).RoundTrip(r)
	}))
	srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest("GET", srv.URL+"/x", nil)
		req.Host = testAuthority
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		return (<-seen).Labels["route"] == "x"
	}, testutil.Timeout, 5*time.Millisecond)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
