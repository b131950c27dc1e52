package router

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const profileHedgeAuthority = "books.test:80"

// profileHedgeFixture routes books.test:80 by a ServiceProfile whose route
// "GET /hedged" hedges by hp and "GET /plain" does not, over a balancer of
// eps.
func profileHedgeFixture(t *testing.T, eps []endpoint.Endpoint, hp *hedge.Policy, budget profiles.RetryBudget) *healthFixture {
	t.Helper()
	p := &profiles.Profile{FullyQualifiedName: "books.test", RetryBudget: &budget, Routes: []profiles.Route{
		{Condition: profiles.PathRegex("/hedged"), Labels: map[string]string{"route": "GET /hedged"}, Hedge: hp},
		{Condition: profiles.PathRegex("/plain"), Labels: map[string]string{"route": "GET /plain"}},
	}}
	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{profileHedgeAuthority: eps})
	require.NoError(t, err)
	f := &healthFixture{m: testutil.NewMetrics(t)}
	f.bal = balancer.New(src)
	t.Cleanup(f.bal.Close)
	prof := profiles.NewStaticSource(map[string]*profiles.Profile{profileHedgeAuthority: p})
	f.r = New(WithProfiles(prof), WithMeterProvider(f.m.Provider), WithBalancer(f.bal), WithLogger(quietLogger))
	t.Cleanup(f.r.Close)
	f.client = &http.Client{Transport: f.r.Transport(hedgeMarker{base: f.bal.Transport(testutil.NewTransport(t, testutil.H1))})}
	req, _ := http.NewRequest("GET", "http://"+profileHedgeAuthority+"/hedged", nil)
	require.Eventually(t, func() bool { return f.r.Explain(req).Model == ModelProfile }, testutil.Timeout, 5*time.Millisecond)
	return f
}

// A ServiceProfile route with a hedge sends a request that stalls past the
// delay again to another endpoint of the service, as a policy route does:
// the first answer wins, the stalled attempt is cancelled, the route's
// route_hedge_* series count it, and /routes shows it. Routes without a
// hedge, non-idempotent methods and a spent retry budget send no hedge.
func TestProfileRouteHedgesToAnotherEndpoint(t *testing.T) {
	fixed := &hedge.Policy{Delay: 20 * time.Millisecond}
	noBudget := profiles.RetryBudget{RetryRatio: 0, MinRetriesPerSecond: 0, TTL: time.Second}
	for _, tc := range []struct {
		name     string
		method   string
		path     string
		policy   *hedge.Policy
		budget   profiles.RetryBudget
		hedged   bool
		overflow bool
	}{
		{name: "GET on a hedged route", method: "GET", path: "/hedged", policy: fixed, budget: profiles.DefaultRetryBudget(), hedged: true},
		{name: "PUT on a hedged route", method: "PUT", path: "/hedged", policy: fixed, budget: profiles.DefaultRetryBudget(), hedged: true},
		{name: "POST on an idempotent route", method: "POST", path: "/hedged", policy: &hedge.Policy{Delay: 20 * time.Millisecond, Idempotent: true},
			budget: profiles.DefaultRetryBudget(), hedged: true},
		{name: "POST is not hedged", method: "POST", path: "/hedged", policy: fixed, budget: profiles.DefaultRetryBudget()},
		{name: "a route without a hedge", method: "GET", path: "/plain", policy: fixed, budget: profiles.DefaultRetryBudget()},
		{name: "the default route", method: "GET", path: "/other", policy: fixed, budget: profiles.DefaultRetryBudget()},
		{name: "the profile's budget spent", method: "GET", path: "/hedged", policy: fixed, budget: noBudget, overflow: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stall := 300 * time.Millisecond
			if tc.hedged {
				stall = time.Minute // only a hedge can answer in time
			}
			h := newHedgeEndpoints(t, 3, stall)
			f := profileHedgeFixture(t, h.eps, tc.policy, tc.budget)
			req, err := http.NewRequest(tc.method, "http://"+profileHedgeAuthority+tc.path, strings.NewReader("payload"))
			require.NoError(t, err)
			req.Header.Set("X-Request-Id", "r1")
			req.Header.Set("X-Stall", "1")
			resp, err := f.client.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			got := h.reached("r1")
			route := `rt_route="GET /hedged"`
			sent := f.m.Value(t, "route_hedge_requests_total", route, `direction="outbound"`, `dst="books.test:80"`)
			overflow := f.m.Value(t, "route_hedge_overflow_total", route)
			e := f.r.Explain(req)
			if !tc.hedged {
				assert.Len(t, got, 1, "endpoints reached")
				assert.Contains(t, []string{"", "0"}, sent, "hedges sent")
				if tc.overflow {
					assert.Equal(t, "1", overflow, "refused by the budget")
				}
				if tc.path != "/hedged" {
					assert.Nil(t, e.Hedge)
				}
				return
			}
			require.Len(t, got, 2, "endpoints reached")
			assert.NotEqual(t, got[0], got[1], "the hedge went to the endpoint already trying")
			assert.Equal(t, fmt.Sprintf("endpoint %d", got[1]), string(b), "the hedge's answer wins")
			assert.Equal(t, "1", sent)
			assert.Equal(t, "1", f.m.Value(t, "route_hedge_wins_total", route))
			assert.Equal(t, "1", f.m.Value(t, "route_request_total", route, `direction="outbound"`), "one logical request")
			require.Eventually(t, func() bool { return h.cancels() == 1 }, testutil.Timeout, 5*time.Millisecond,
				"the stalled attempt is cancelled")
			assert.Equal(t, ModelProfile, e.Model)
			require.NotNil(t, e.Hedge)
			assert.Equal(t, uint64(1), e.Hedge.Sent)
			assert.Equal(t, uint64(1), e.Hedge.Won)
			assert.True(t, e.Hedge.Budget, "the profile's budget bounds the hedges")
			assert.Contains(t, e.Hedge.Policy, "after 20ms")
		})
	}
}
