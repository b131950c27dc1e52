package profileroute

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingSource is a StaticSource that counts the watches open now and
// ever, and can hold Watch back for one authority.
type countingSource struct {
	*profiles.StaticSource
	open, total atomic.Int32
	mu          sync.Mutex
	block       map[string]chan struct{}
}

func newCountingSource(m map[string]*profiles.Profile) *countingSource {
	return &countingSource{StaticSource: profiles.NewStaticSource(m), block: map[string]chan struct{}{}}
}

func (s *countingSource) Watch(ctx context.Context, authority string, update func(profiles.Update)) (func(), error) {
	s.mu.Lock()
	ch := s.block[authority]
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
	stop, err := s.StaticSource.Watch(ctx, authority, update)
	if err != nil {
		return nil, err
	}
	s.open.Add(1)
	s.total.Add(1)
	var once sync.Once
	return func() {
		stop()
		once.Do(func() { s.open.Add(-1) })
	}, nil
}

func TestNewRouterWithoutSource(t *testing.T) {
	router := NewRouter(nil, WithLogger(quietLogger), WithLocalAuthorities("self:8080"))
	defer router.Close()
	srv := testutil.NewServer(t, router.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.True(t, RouteFromContext(r.Context()).IsDefault())
	})))
	for _, host := range []string{"self:8080", "other.example.com", ""} {
		req, _ := http.NewRequest("GET", srv.URL+"/", nil)
		req.Host = host
		resp, err := router.Transport(testutil.NewTransport(t, testutil.H1)).RoundTrip(req)
		require.NoError(t, err, host)
		assert.Equal(t, 200, resp.StatusCode)
		resp.Body.Close()
	}
	assert.NotNil(t, router.Table("self:8080"))
	assert.Empty(t, router.Table("self:8080").Routes())
}

// A client choosing Hosts at will makes the inbound side watch nothing, and
// every such request is labelled dst="other"; the server's own authority is
// routed by its profile.
func TestInboundRoutesOnlyLocalAuthorities(t *testing.T) {
	m := testutil.NewMetrics(t)
	const self = "books.default.svc.cluster.local:7000"
	src := newCountingSource(map[string]*profiles.Profile{
		self:                {Routes: []profiles.Route{{Condition: profiles.MatchAll{}, Labels: map[string]string{"route": "self"}}}},
		"victim.example:80": {Routes: []profiles.Route{{Condition: profiles.MatchAll{}, Labels: map[string]string{"route": "victim"}}}},
	})
	router := NewRouter(src, WithLogger(quietLogger), WithMeterProvider(m.Provider), WithLocalAuthorities(self))
	defer router.Close()
	routes := make(chan string, 1)
	h := router.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		routes <- RouteFromContext(r.Context()).Labels["route"]
	}))
	serve := func(host string) string {
		req := httptest.NewRequest("GET", "/", nil)
		req.Host = host
		h.ServeHTTP(httptest.NewRecorder(), req)
		return <-routes
	}
	require.Eventually(t, func() bool { return serve("Books.Default.svc.cluster.local:7000") == "self" },
		testutil.Timeout, time.Millisecond)
	for i := range 5000 {
		assert.Empty(t, serve(fmt.Sprintf("h%d.example:%d", i, 1+i%65000)))
	}
	assert.Empty(t, serve("victim.example"), "a profile the server does not own is not applied")
	assert.Empty(t, serve("bad host"))
	assert.Equal(t, int32(1), src.total.Load(), "only the server's own authority was ever watched")
	for _, l := range m.Lines(t, "route_request_total") {
		assert.True(t, strings.Contains(l, `dst="`+self+`"`) || strings.Contains(l, `dst="other"`), l)
	}
	assert.Equal(t, "5002", m.Value(t, "route_request_total", `dst="other"`))
}

// An authority no request uses for the idle timeout is released: its watch
// stops. Used again, it is watched again and gets its profile.
func TestIdleAuthorityStopsItsWatch(t *testing.T) {
	src := newCountingSource(map[string]*profiles.Profile{
		testAuthority: {Routes: []profiles.Route{{Condition: profiles.MatchAll{}, Labels: map[string]string{"route": "r"}}}},
	})
	router := NewRouter(src, WithLogger(quietLogger), WithIdleTimeout(50*time.Millisecond))
	defer router.Close()
	route := make(chan *profiles.CompiledRoute, 1)
	rt := router.Transport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		route <- RouteFromContext(r.Context())
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	}))
	get := func(host string) *profiles.CompiledRoute {
		req, _ := http.NewRequest("GET", "http://"+host+"/", nil)
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		return <-route
	}
	for i := range 100 {
		get(fmt.Sprintf("10.0.%d.%d:80", i/250, i%250+1))
	}
	require.Eventually(t, func() bool { return get(testAuthority).Labels["route"] == "r" }, testutil.Timeout, time.Millisecond)
	require.Eventually(t, func() bool { return src.open.Load() == 0 }, testutil.Timeout, time.Millisecond,
		"idle authorities are released and their watches stopped")
	assert.Nil(t, router.Table(testAuthority))
	watched := src.total.Load()
	require.Eventually(t, func() bool { return get(testAuthority).Labels["route"] == "r" }, testutil.Timeout, time.Millisecond)
	assert.Greater(t, src.total.Load(), watched, "watched again")
}

// A Source slow to answer Watch for one authority holds back no other.
func TestSlowWatchStallsNoOtherAuthority(t *testing.T) {
	src := newCountingSource(nil)
	release := make(chan struct{})
	src.block["slow:80"] = release
	router := NewRouter(src, WithLogger(quietLogger))
	defer router.Close()
	rt := router.Transport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	}))
	get := func(host string) error {
		req, _ := http.NewRequest("GET", "http://"+host+"/", nil)
		resp, err := rt.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	slow := make(chan error, 1)
	go func() { slow <- get("slow") }()
	require.Eventually(t, func() bool { return router.reg.Lookup("slow") != nil }, testutil.Timeout, time.Millisecond)
	for i := range 50 {
		require.NoError(t, get(fmt.Sprintf("fast%d:80", i)))
	}
	require.NoError(t, get("slow"), "a second request to the slow authority takes the default route")
	close(release)
	require.NoError(t, <-slow)
}

// Past the bound, authorities are evicted and their watches stopped, and
// dst label values stay within the bound plus "other".
func TestAuthorityBoundEvicts(t *testing.T) {
	m := testutil.NewMetrics(t)
	src := newCountingSource(nil)
	router := NewRouter(src, WithLogger(quietLogger), WithMeterProvider(m.Provider), WithMaxAuthorities(5))
	defer router.Close()
	client := &http.Client{Transport: router.Transport(classify.NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: io.NopCloser(http.NoBody), Request: r}, nil
	})))}
	for i := range 200 {
		resp, err := client.Get(fmt.Sprintf("http://h%d.example:80/", i))
		require.NoError(t, err)
		resp.Body.Close()
	}
	assert.LessOrEqual(t, src.open.Load(), int32(5))
	assert.Equal(t, int32(200), src.total.Load())
	assert.Len(t, m.Lines(t, "route_request_total"), 6, "five authorities and other")
	assert.Equal(t, "195", m.Value(t, "route_request_total", `dst="other"`))
}

func TestRouterLookupAllocatesNothing(t *testing.T) {
	router := NewRouter(profiles.NewStaticSource(nil), WithLogger(quietLogger), WithLocalAuthorities(testAuthority))
	defer router.Close()
	router.destFor(testAuthority)
	router.localDestFor(testAuthority)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { router.destFor(testAuthority).state.Load() }))
	assert.Zero(t, testing.AllocsPerRun(1000, func() { router.localDestFor(testAuthority).state.Load() }))
	assert.Zero(t, testing.AllocsPerRun(1000, func() { router.destFor("").state.Load() }))
}
