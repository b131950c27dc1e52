package router

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
)

// hedgeHook is the balancer's transport with hooks around each hedge
// (an attempt that excludes the endpoints its request tried): before runs
// as the hedge reaches the balancer, after once the balancer answered it.
type hedgeHook struct {
	base          http.RoundTripper
	before, after func()
}

func (h *hedgeHook) RoundTrip(req *http.Request) (*http.Response, error) {
	if _, exclude := balancer.TriedFromContext(req.Context()); !exclude {
		return h.base.RoundTrip(req)
	}
	if h.before != nil {
		h.before()
	}
	resp, err := h.base.RoundTrip(req)
	if h.after != nil {
		h.after()
	}
	return resp, err
}

// A hedge that is never sent (the backend has one endpoint, the one the
// first attempt went to: the balancer answers the hedge ErrNoOtherEndpoint)
// gives back what it was paid with: its share of extra load and its retry
// of the route's retry budget, so that neither a later hedge nor a retry
// goes without because of it. The first attempt is held at the upstream
// until the hooks say: either until the balancer has refused the hedge, or
// it answers as the hedge reaches the balancer and the hedge is refused
// only once the caller has the first attempt's answer (the hedge then ends
// after its request, as a losing attempt). Policy routes and ServiceProfile
// routes hedge with the same code; the policy route's budget pays from its
// deposits, the profile's default budget from its minimum.
func TestUnsentHedgeRefundsItsPayment(t *testing.T) {
	type route struct {
		name string
		url  string
		// fixture makes the router and balancer over eps, hedged after
		// delay, and returns the requests that earn the budget its first
		// retry.
		fixture func(t *testing.T, eps []endpoint.Endpoint, delay time.Duration) (*healthFixture, []string)
	}
	routes := []route{
		{name: "policy route", url: "http://svc.test/",
			fixture: func(t *testing.T, eps []endpoint.Endpoint, delay time.Duration) (*healthFixture, []string) {
				budget := &profiles.RetryBudget{RetryRatio: 0.5, MinRetriesPerSecond: 0, TTL: time.Minute}
				f := hedgeFixture(t, eps, &hedge.Policy{Delay: delay}, WithRetryBudget(budget))
				return f, []string{"http://svc.test/", "http://svc.test/"}
			}},
		{name: "ServiceProfile route", url: "http://" + profileHedgeAuthority + "/hedged",
			fixture: func(t *testing.T, eps []endpoint.Endpoint, delay time.Duration) (*healthFixture, []string) {
				return profileHedgeFixture(t, eps, &hedge.Policy{Delay: delay}, profiles.DefaultRetryBudget()), nil
			}},
	}
	for _, rt := range routes {
		for _, firstWins := range []bool{false, true} {
			name := rt.name + ": refused while the first attempt waits"
			if firstWins {
				name = rt.name + ": refused after the first attempt answered"
			}
			t.Run(name, func(t *testing.T) {
				release := make(chan struct{}) // the held first attempt answers
				srv := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("X-Hold") != "" {
						select {
						case <-release:
						case <-r.Context().Done():
							return
						}
					}
					_, _ = io.WriteString(w, "ok")
				}))
				eps := []endpoint.Endpoint{{Addr: netip.MustParseAddrPort(srv.Listener.Addr().String()), Weight: endpoint.DefaultWeight}}
				// The hedge is sent only once the first attempt is at an
				// endpoint; the delay leaves a loaded machine time for that
				// (at 5 ms, 1 run in 1,000 under -race sent no hedge, and
				// the held first attempt was never released).
				f, earn := rt.fixture(t, eps, 50*time.Millisecond)
				answered := make(chan struct{}) // the caller has the first attempt's answer
				hook := &hedgeHook{base: f.bal.Transport(testutil.NewTransport(t, testutil.H1))}
				if firstWins {
					hook.before = func() {
						close(release)
						<-answered
					}
				} else {
					hook.after = func() { close(release) }
				}
				client := &http.Client{Transport: f.r.Transport(hook)}
				do := func(req *http.Request) {
					t.Helper()
					ctx, cancel := context.WithTimeout(req.Context(), testutil.Timeout)
					defer cancel()
					resp, err := client.Do(req.WithContext(ctx))
					require.NoError(t, err)
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					require.Equal(t, http.StatusOK, resp.StatusCode)
				}
				for _, u := range earn {
					req, err := http.NewRequest(http.MethodGet, u, nil)
					require.NoError(t, err)
					do(req)
				}
				req, err := http.NewRequest(http.MethodGet, rt.url, nil)
				require.NoError(t, err)
				req.Header.Set("X-Hold", "1")
				do(req)
				close(answered)

				refunded := func() bool {
					e := f.r.Explain(req)
					return e.Budget != nil && e.Budget.Withdrawals == 0 && e.Hedge != nil && e.Hedge.Tokens >= 1
				}
				// The refund may follow the answer in either case: the
				// hook releases the first attempt before the balancer's
				// refusal of the hedge has reached the hedger, so the first
				// attempt can be answered first, the hedge then ending as a
				// losing attempt. (The assertions below say what is missing
				// if the refund never comes.)
				assert.Eventually(t, refunded, testutil.Timeout, time.Millisecond)
				e := f.r.Explain(req)
				require.NotNil(t, e.Budget)
				require.NotNil(t, e.Hedge)
				assert.Equal(t, int64(0), e.Budget.Withdrawals, "the unsent hedge's retry is given back to the budget")
				assert.GreaterOrEqual(t, e.Hedge.Tokens, 1.0, "the unsent hedge's share is given back")
				assert.Equal(t, uint64(0), e.Hedge.Sent, "no hedge was sent")
				assert.Equal(t, int64(len(earn)+1), e.Budget.Deposits)
			})
		}
	}
}
