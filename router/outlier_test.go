package router

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
)

// A backend's outlier detection reaches its balancer: of five endpoints,
// the one failing 30% of its requests is ejected after an interval, gets
// no more requests, and /routes explains the detection and shows the
// endpoint ejected.
func TestPolicyOutlierDetection(t *testing.T) {
	var ok atomic.Int64
	ok.Store(200)
	var nGood, nBad, seq atomic.Int64
	eps := []endpoint.Endpoint{}
	for _, name := range []string{"a", "b", "c", "d"} {
		eps = append(eps, countingEndpoint(t, name, &ok, &nGood))
	}
	flaky := testutil.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		nBad.Add(1)
		if seq.Add(1)%10 < 3 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(flaky.Listener.Addr().String()), Weight: endpoint.DefaultWeight})
	b := balancerBackend("web", "web.ns.svc.cluster.local:80")
	b.Backend.Balancer.Outlier = &policy.OutlierDetection{Interval: 300 * time.Millisecond, BaseEjectionTime: time.Hour, MaxEjectionTime: time.Hour,
		MaxEjectionPercent: 20, FailurePercentage: &policy.FailurePercentageEjection{Threshold: 10, EnforcementPercentage: 100, MinimumHosts: 5, RequestVolume: 2}}
	f := newHealthFixture(t, httpPolicy(policy.HTTPRule{Backends: policy.Distribution{Kind: policy.DistributionFirstAvailable,
		Backends: []policy.RouteBackend{b}}}), map[string][]endpoint.Endpoint{"web.ns.svc.cluster.local:80": eps})

	req := httptest.NewRequest("GET", "http://svc.test/", nil)
	ejected := func() bool {
		for _, e := range f.r.Explain(req).Backends.Backends[0].Endpoints {
			if e.State == "ejected" {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(testutil.Timeout)
	for !ejected() {
		require.True(t, time.Now().Before(deadline), "the flaky endpoint was never ejected")
		f.get(t)
	}
	before := nBad.Load()
	for range 500 {
		resp, _ := f.get(t)
		assert.Equal(t, 200, resp.StatusCode)
	}
	assert.Equal(t, before, nBad.Load(), "the ejected endpoint got requests")

	x := f.r.Explain(req).Backends.Backends[0]
	assert.Equal(t, "every 300ms: failures above 10% (enforced 100%, >= 5 endpoints of >= 2 requests); ejected for 1h0m0s x ejections, at most 1h0m0s; at most 20% ejected", x.OutlierDetection)
	states := map[string]int{}
	for _, e := range x.Endpoints {
		states[e.State]++
	}
	assert.Equal(t, map[string]int{"ready": 4, "ejected": 1}, states)
}
