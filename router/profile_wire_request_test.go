package router_test

// Linkerd's proxy matches a ServiceProfile route against the request as it
// arrives on the wire (linkerd2-proxy linkerd/service-profiles/src/http.rs
// RequestMatch::is_match:
// `req.method() == *method`, `re.is_match(req.uri().path())`). An
// application's net/http client that asks for "http://svc" (no path)
// sends "GET / HTTP/1.1"; one that leaves Request.Method empty sends GET
// (net/http: "For client requests, an empty string means GET"). The
// router's Transport sits where Linkerd's outbound proxy does, so it must
// match those requests as "/" and "GET".

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wireFixture: a router over a static profile for partialAuthority whose
// one route (cond) is retryable with Linkerd's default budget, and a
// server that answers 533 then 200 "retried", recording the request line
// it saw.
func wireFixture(t *testing.T, cond profiles.RequestMatch) (*http.Client, *atomic.Value) {
	t.Helper()
	var n atomic.Int64
	var seen atomic.Value
	up := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Method + " " + r.RequestURI)
		if n.Add(1)%2 == 1 {
			w.WriteHeader(533)
			return
		}
		_, _ = io.WriteString(w, "retried")
	}))
	budget := profiles.DefaultRetryBudget()
	src := profiles.NewStaticSource(map[string]*profiles.Profile{partialAuthority: {
		FullyQualifiedName: "profiles.test.svc.cluster.local",
		RetryBudget:        &budget,
		Routes:             []profiles.Route{{Condition: cond, Labels: map[string]string{"route": "r"}, Retryable: true}},
	}})
	base := testutil.NewTransport(t, testutil.H1)
	upAddr := up.Listener.Addr().String()
	base.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, upAddr)
	}
	r := router.New(router.WithProfiles(src), router.WithLogger(discardLogger), router.WithDiscoveryWait(testutil.Timeout))
	t.Cleanup(r.Close)
	return &http.Client{Transport: r.Transport(base)}, &seen
}

func doReq(t *testing.T, c *http.Client, req *http.Request) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	resp, err := c.Do(req.WithContext(ctx))
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// Each request is matched as it goes on the wire: GET http://svc (no
// path) as "GET /", so the routes `pathRegex: /` and the catch-all `/.*`
// take it; a Request with Method "" as GET, so `method: GET` takes it.
// The route is retryable: its 533 is retried into a 200.
func TestProfileRouteMatchesTheRequestAsSent(t *testing.T) {
	get := func(target string) func(t *testing.T) *http.Request {
		return func(t *testing.T) *http.Request {
			req, err := http.NewRequest("GET", target, nil)
			require.NoError(t, err)
			return req
		}
	}
	emptyMethod := func(target string) func(t *testing.T) *http.Request {
		return func(t *testing.T) *http.Request {
			u, err := url.Parse(target)
			require.NoError(t, err)
			return &http.Request{URL: u, Host: u.Host, Header: http.Header{}} // Method "": GET, as net/http documents
		}
	}
	for _, tc := range []struct {
		name string
		cond profiles.RequestMatch
		req  func(t *testing.T) *http.Request
		wire string
	}{
		{"no path: pathRegex /", profiles.PathRegex("/"), get("http://" + partialAuthority), "GET /"},
		{"no path: pathRegex /.*", profiles.PathRegex("/.*"), get("http://" + partialAuthority), "GET /"},
		{"no path: pathRegex /[^x]*", profiles.PathRegex("/[^x]*"), get("http://" + partialAuthority), "GET /"},
		{"empty method: method GET", profiles.MatchAll{profiles.Method("GET"), profiles.PathRegex("/0.5")}, emptyMethod("http://" + partialAuthority + "/0.5"), "GET /0.5"},
		{"empty method and no path", profiles.MatchAll{profiles.Method("GET"), profiles.PathRegex("/")}, emptyMethod("http://" + partialAuthority), "GET /"},
		{"control: method and path spelt out", profiles.MatchAll{profiles.Method("GET"), profiles.PathRegex("/")}, get("http://" + partialAuthority + "/"), "GET /"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, seen := wireFixture(t, tc.cond)
			status := doReq(t, c, tc.req(t))
			assert.Equal(t, tc.wire, seen.Load(), "the request on the wire")
			assert.Equal(t, http.StatusOK, status, "the route matches and retries the 533")
		})
	}
}

// Linkerd's proxy runs the profile's budget as tower's TpsBudget
// (linkerd2-proxy linkerd/service-profiles/src/proto.rs
// convert_retry_budget: TpsBudget::new(ttl, min_retries, retry_ratio)),
// whose reserve is min_per_sec × ttl retries available at once within the
// window (tower retry/budget/tps_budget.rs: `reserve = min_per_sec *
// ttl.as_secs() * withdraw_amount`; a withdrawal succeeds while deposits
// and reserve cover it). With the controller's default budget (0.2, 10/s,
// 10s), the first 30 requests of a retryable route whose first attempts
// fail (Linkerd's profiles.rs /0.5 server) are all retried into 200s.
func TestProfileBudgetReserveIsAvailableAtOnce(t *testing.T) {
	c, _ := wireFixture(t, profiles.PathRegex("/0.5"))
	ok := 0
	for range 30 {
		req, err := http.NewRequest("GET", "http://"+partialAuthority+"/0.5", nil)
		require.NoError(t, err)
		if doReq(t, c, req) == http.StatusOK {
			ok++
		}
	}
	assert.Equal(t, 30, ok, "requests retried into 200 within the reserve of 100 retries (10/s × 10s)")
}
