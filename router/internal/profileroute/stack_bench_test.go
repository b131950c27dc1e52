package profileroute

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

const stackAuthority = "books.default.svc.cluster.local:7000"

// booksProfile is a profile of n routes; /books/{id} is the last of them.
func booksProfile(n int) *profiles.Profile {
	budget := profiles.DefaultRetryBudget()
	p := &profiles.Profile{RetryBudget: &budget}
	for i := range n - 1 {
		p.Routes = append(p.Routes, profiles.Route{
			Condition: profiles.MatchAll{profiles.Method("POST"), profiles.PathRegex(fmt.Sprintf("/other/r%d/[^/]+", i))},
			Labels:    map[string]string{"route": fmt.Sprintf("POST /other/r%d/{id}", i)},
		})
	}
	p.Routes = append(p.Routes, profiles.Route{
		Condition:       profiles.MatchAll{profiles.Method("GET"), profiles.PathRegex("/books/[^/]+")},
		Labels:          map[string]string{"route": "GET /books/{id}"},
		ResponseClasses: []profiles.ResponseClass{{Condition: profiles.StatusRange{Min: 500, Max: 599}, IsFailure: true}},
	})
	return p
}

type stacks struct {
	bare, inmesh http.Handler
	close        func()
}

func newStacks(t testing.TB) stacks {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	router := NewRouter(profiles.NewStaticSource(map[string]*profiles.Profile{stackAuthority: booksProfile(20)}),
		WithMeterProvider(mp), WithLogger(quietLogger), WithLocalAuthorities(stackAuthority))
	s := stacks{
		bare:   app,
		inmesh: router.Handler(classify.NewHandler(app, classify.WithMeterProvider(mp))),
		close: func() {
			router.Close()
			_ = mp.Shutdown(context.Background())
		},
	}
	// Start the watch and wait for the profile, so that requests take
	// the real route.
	deadline := time.Now().Add(10 * time.Second)
	for router.Table(stackAuthority) == nil || len(router.Table(stackAuthority).Routes()) == 0 {
		s.inmesh.ServeHTTP(httptest.NewRecorder(), stackRequest())
		if time.Now().After(deadline) {
			t.Fatal("profile never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	return s
}

func stackRequest() *http.Request {
	r := httptest.NewRequest("GET", "http://"+stackAuthority+"/books/123", nil)
	return r
}

// BenchmarkInboundStack compares, round by round in one run, a bare handler
// and inmesh's inbound stack (Router.Handler around classify.NewHandler, 20
// routes, the matching one last), recording into the OTel SDK. The
// comparison with otelhttp runs in examples/bench (stack_loopback), whose
// module may depend on it.
func BenchmarkInboundStack(b *testing.B) {
	s := newStacks(b)
	defer s.close()
	variants := []struct {
		name string
		h    http.Handler
	}{{"bare", s.bare}, {"inmesh", s.inmesh}}
	r := stackRequest()
	for round := range 6 {
		for _, v := range variants {
			b.Run(fmt.Sprintf("round%d/%s", round, v.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					v.h.ServeHTTP(httptest.NewRecorder(), r)
				}
			})
		}
	}
}

// The inbound stack costs at most four allocations per request over a bare
// handler, with the SDK recording.
func TestInboundStackAllocations(t *testing.T) {
	s := newStacks(t)
	defer s.close()
	r := stackRequest()
	w := httptest.NewRecorder()
	measure := func(h http.Handler) float64 {
		h.ServeHTTP(w, r)
		return testing.AllocsPerRun(2000, func() { h.ServeHTTP(w, r) })
	}
	bare, stack := measure(s.bare), measure(s.inmesh)
	t.Logf("allocations per request: bare %.0f, inmesh stack %.0f", bare, stack)
	assert.LessOrEqual(t, stack-bare, 4.0)
	route := RouteFromContext(context.Background())
	require.Nil(t, route)
}

// BenchmarkProfileUpdate is the router's CPU per profile update of 20
// routes: two profiles that differ in their route names delivered in
// turn, each waited for, then one request on the new table (the route
// metric targets of a table are built by its first request).
func BenchmarkProfileUpdate(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	src := profiles.NewStaticSource(nil)
	router := NewRouter(src, WithMeterProvider(mp), WithLogger(quietLogger), WithLocalAuthorities(stackAuthority))
	defer router.Close()
	h := router.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	versions := [2]*profiles.Profile{booksProfile(20), booksProfile(20)}
	for i := range versions[1].Routes {
		versions[1].Routes[i].Labels = map[string]string{"route": fmt.Sprintf("v1 %d", i)}
	}
	h.ServeHTTP(httptest.NewRecorder(), stackRequest()) // the watch starts
	w := httptest.NewRecorder()
	req := stackRequest()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		p := versions[i%2]
		src.Set(stackAuthority, p)
		for t := router.Table(stackAuthority); t == nil || t.Profile() != p; t = router.Table(stackAuthority) {
			runtime.Gosched()
		}
		h.ServeHTTP(w, req)
	}
}
