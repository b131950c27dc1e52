package router_test

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router"
)

// budgetProfileYAML retries every request of books within a budget of one
// retry per deposit and no minimum; /slow has a 200ms timeout, and so does
// /classed, whose response classes name none of the answers of the test
// (so that their class waits on trailers).
const budgetProfileYAML = `
---
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.default.svc.cluster.local, namespace: default}
spec:
  retryBudget: {retryRatio: 1, minRetriesPerSecond: 0, ttl: 60s}
  routes:
  - {name: slow, condition: {pathRegex: /slow}, isRetryable: true, timeout: 200ms}
  - name: classed
    condition: {pathRegex: /classed}
    isRetryable: true
    timeout: 200ms
    responseClasses: [{condition: {status: {min: 418, max: 418}}, isFailure: true}]
  - {name: all, condition: {pathRegex: '/.*'}, isRetryable: true}
`

// budgetRouteYAML retries a 5xx of books once, counted; the router's
// retry budget (router.WithRetryBudget) bounds it too.
const budgetRouteYAML = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: books-route
  namespace: default
  annotations: {retry.linkerd.io/http: 5xx, retry.linkerd.io/limit: "1"}
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - backendRefs: [{name: books, port: 7000}]
`

// A request on a retryable route asks its retry budget as its answer
// comes, as Linkerd's proxy does (linkerd2-proxy
// linkerd/app/outbound/src/http/retry.rs, RetryPolicy::retry, which
// tower's Retry calls with each attempt's result through
// linkerd/retry/src/lib.rs): a failure withdraws its retry, and one the
// budget refuses deposits nothing; an answer that is not retried
// deposits; a request dropped before its answer, given up or ended by the
// ServiceProfile route's timeout (which wraps the retry layer,
// linkerd/app/outbound/src/http/logical/profile.rs), is never asked and
// deposits nothing. An HTTPRoute's retries have no budget in Linkerd, but
// a count; the budget router.WithRetryBudget adds to them is asked the
// same way. The rows of meshgrpc's
// TestServiceProfileBudgetDepositsAsAnswersCome, over HTTP/1 and HTTP/2:
// under a budget of one retry per deposit and no minimum, what came
// before a failing request, through a fresh client, decides whether it is
// retried. Before, every request deposited as it started: a request's own
// deposit paid for its retry, and a request given up before its answer
// paid for another's.
//
// On a route whose response classes leave an answer's class to its
// trailers, Linkerd's proxy peeks for the trailers of an HTTP/2 response
// only (linkerd/http/retry/src/peek_trailers.rs,
// PeekTrailersBody::map_response): an HTTP/1 head is the answer, deposited
// as it comes, and the route's timeout, which ends at the answer, no longer
// bounds its first data; an HTTP/2 head waits for its first data under the
// timeout. Before, an HTTP/1 head waited for its first data too, so that a
// first chunk later than the route's timeout ended the request in a 504
// that deposited nothing. So an HTTP/2 response's answer is its first
// data, or its end, and one given up after its head and before any data
// deposits nothing; an HTTP/1 response given up there has deposited.
// Before, the HTTP/2 response deposited at its head.
func TestBudgetDepositsAsAnswersCome(t *testing.T) {
	type step int
	const (
		answered        step = iota // a request answered 200
		failed                      // a request answered 503 once
		givenUp                     // a request given up before its response head
		headGiven                   // a request given up after its response began
		timedOut                    // a request the profile route's timeout ended
		headNoData                  // given up after its head, before any data
		classedGivenUp              // on /classed, given up after its head, before any data
		classedLateData             // on /classed, its head in time, its first data after the timeout
	)
	for _, model := range []string{"ServiceProfile", "HTTPRoute"} {
		for _, tc := range []struct {
			name      string
			before    []step
			wantCode  int
			wantCalls int64 // attempts of the failing request
			h1Only    bool
			// Over HTTP/2, when it differs: the status of the request
			// before and the failing request's code and attempts.
			h2Before, h2Code int
			h2Calls          int64
		}{
			{name: "a fresh budget: the first failure is not retried", wantCode: http.StatusServiceUnavailable, wantCalls: 1},
			{name: "an answer pays for a retry", before: []step{answered}, wantCode: http.StatusOK, wantCalls: 2},
			{name: "a failure the budget refused pays nothing", before: []step{failed}, wantCode: http.StatusServiceUnavailable, wantCalls: 1},
			{name: "a request given up before its answer pays nothing", before: []step{givenUp}, wantCode: http.StatusServiceUnavailable, wantCalls: 1},
			{name: "a request given up after its response began pays for a retry", before: []step{headGiven}, wantCode: http.StatusOK, wantCalls: 2},
			{name: "a request the route's timeout ended pays nothing", before: []step{timedOut}, wantCode: http.StatusServiceUnavailable, wantCalls: 1},
			{name: "a request given up after its head, before any data, pays over HTTP/1", before: []step{headNoData}, wantCode: http.StatusOK, wantCalls: 2,
				h2Before: http.StatusOK, h2Code: http.StatusServiceUnavailable, h2Calls: 1},
			{name: "an HTTP/1 request given up after its head, before any data, pays for a retry", before: []step{classedGivenUp}, wantCode: http.StatusOK, wantCalls: 2, h1Only: true},
			{name: "a head in time with its data after the route's timeout pays over HTTP/1", before: []step{classedLateData}, wantCode: http.StatusOK, wantCalls: 2,
				h2Before: http.StatusGatewayTimeout, h2Code: http.StatusServiceUnavailable, h2Calls: 1},
		} {
			if model == "HTTPRoute" && tc.before != nil && tc.before[0] >= timedOut && tc.before[0] != headNoData {
				continue // a ServiceProfile route's timeout and classes
			}
			t.Run(model+"/"+tc.name, func(t *testing.T) {
				testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
					if tc.h1Only && mode != testutil.H1 {
						t.Skip("an HTTP/2 head waits for its first data")
					}
					wantBefore, wantCode, wantCalls := http.StatusOK, tc.wantCode, tc.wantCalls
					if mode != testutil.H1 && tc.h2Code != 0 {
						wantBefore, wantCode, wantCalls = tc.h2Before, tc.h2Code, tc.h2Calls
					}
					var fail, stall, headFirst, headOnly atomic.Bool
					gotHead := make(chan struct{})
					var calls atomic.Int64
					reached := make(chan struct{}, 1)
					up := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						calls.Add(1)
						switch {
						case stall.Load() && headOnly.Load():
							// Its head alone, then its data once the
							// caller has the head, unless the request
							// ends first.
							w.WriteHeader(http.StatusOK)
							w.(http.Flusher).Flush()
							select {
							case <-gotHead:
								_, _ = io.WriteString(w, "late")
							case <-r.Context().Done():
							}
						case stall.Load() && headFirst.Load():
							// Its head and a first chunk: an answer.
							_, _ = io.WriteString(w, "partial")
							w.(http.Flusher).Flush()
							<-r.Context().Done()
						case stall.Load():
							reached <- struct{}{}
							<-r.Context().Done()
						case fail.CompareAndSwap(true, false):
							w.WriteHeader(http.StatusServiceUnavailable)
						default:
							_, _ = io.WriteString(w, "answered")
						}
					}))
					docs := budgetServiceYAML + budgetProfileYAML
					opts := []router.Option{router.WithDiscoveryWait(testutil.Timeout), router.WithLogger(discardLogger)}
					if model == "HTTPRoute" {
						docs = budgetServiceYAML + budgetRouteYAML
						opts = append(opts, router.WithRetryBudget(&profiles.RetryBudget{RetryRatio: 1, MinRetriesPerSecond: 0, TTL: time.Minute}))
					}
					res, err := manifest.Parse([]byte(docs))
					require.NoError(t, err)
					store := controlplane.NewStore()
					store.SetManifests(res)
					store.SetServiceProfiles(res.ServiceProfiles)
					store.SetEndpoints(map[string][]endpoint.Endpoint{
						booksAuthority: {{Addr: netip.MustParseAddrPort(up.Listener.Addr().String())}},
					})
					dst := serveStore(t, store)
					bal := balancer.New(dst)
					t.Cleanup(bal.Close)
					r := router.New(append(opts, router.WithProfiles(dst), router.WithPolicies(dst.Policies()), router.WithBalancer(bal))...)
					t.Cleanup(r.Close)
					client := &http.Client{Transport: r.Transport(bal.Transport(testutil.NewTransport(t, mode)))}

					// send sends a request to path under ctx; it returns the
					// response with its body read, or nil with the error.
					send := func(ctx context.Context, path string) (*http.Response, error) {
						req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+booksAuthority+path, nil)
						require.NoError(t, err)
						resp, err := client.Do(req)
						if err != nil {
							return nil, err
						}
						defer resp.Body.Close()
						_, err = io.ReadAll(resp.Body)
						return resp, err
					}
					// giveUp sends a request that stalls on the app and
					// gives it up once the app has it, or, when head is
					// set, once its response began.
					giveUp := func(head bool) {
						stall.Store(true)
						headFirst.Store(head)
						defer stall.Store(false)
						ctx, cancel := context.WithCancel(context.Background())
						defer cancel()
						if head {
							req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+booksAuthority+"/", nil)
							require.NoError(t, err)
							resp, err := client.Do(req)
							require.NoError(t, err)
							defer resp.Body.Close()
							require.Equal(t, http.StatusOK, resp.StatusCode)
							cancel()
							_, err = io.ReadAll(resp.Body)
							require.Error(t, err, "the response given up")
							return
						}
						go func() {
							select {
							case <-reached:
							case <-time.After(testutil.Timeout):
							}
							cancel()
						}()
						_, err := send(ctx, "/")
						require.ErrorIs(t, err, context.Canceled)
					}
					ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
					defer cancel()
					for _, st := range tc.before {
						switch st {
						case answered:
							resp, err := send(ctx, "/")
							require.NoError(t, err)
							require.Equal(t, http.StatusOK, resp.StatusCode)
						case failed:
							fail.Store(true)
							resp, err := send(ctx, "/")
							require.NoError(t, err)
							require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
						case givenUp:
							giveUp(false)
						case headGiven:
							giveUp(true)
						case headNoData, classedGivenUp, classedLateData:
							stall.Store(true)
							headOnly.Store(true)
							sctx, scancel := context.WithCancel(ctx)
							path := "/classed"
							if st == headNoData {
								path = "/"
							}
							req, err := http.NewRequestWithContext(sctx, http.MethodGet, "http://"+booksAuthority+path, nil)
							require.NoError(t, err)
							resp, err := client.Do(req)
							require.NoError(t, err)
							require.Equal(t, wantBefore, resp.StatusCode)
							givenUp := st != classedLateData
							if givenUp {
								scancel()
							} else {
								close(gotHead)
							}
							_, err = io.ReadAll(resp.Body)
							resp.Body.Close()
							if givenUp {
								require.Error(t, err, "the response given up")
							} else {
								require.NoError(t, err)
							}
							scancel()
							stall.Store(false)
							headOnly.Store(false)
						case timedOut:
							stall.Store(true)
							resp, err := send(ctx, "/slow")
							stall.Store(false)
							select { // the app had it, unless the timeout came first
							case <-reached:
							case <-time.After(testutil.ShortTimeout):
							}
							require.NoError(t, err)
							require.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
						}
					}
					before := calls.Load()
					fail.Store(true)
					resp, err := send(ctx, "/")
					require.NoError(t, err)
					assert.Equal(t, wantCode, resp.StatusCode)
					assert.Equal(t, wantCalls, calls.Load()-before, "attempts of the failing request")
				})
			})
		}
	}
}

// budgetServiceYAML is the Service books.
const budgetServiceYAML = `
apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec:
  ports: [{port: 7000}]
`
